// moe/moe_layer.cu — host side of the sm_90a MoE layer: validation, weight preparation (checkpoint
// layout -> kernel layout, one expert at a time), workspace planning and the launch sequence of
// one forward (see kernels.h for the data flow). Launchers validate; kernels assume.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/validate.h"
#include "kernels.h"

namespace mxmoe::cuda {
namespace {

using sm90::gemm_config;

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Tokens per touched expert if routing were uniform decides the tile shape (host-known: no sync).
gemm_config pick_config(int64_t tokens, int top_k, int64_t experts) {
  const int64_t pairs = tokens * top_k;
  const int64_t per_expert = pairs / std::max<int64_t>(1, std::min(experts, pairs));
  if (per_expert <= 16) return gemm_config::decode;
  if (per_expert <= 64) return gemm_config::mid;
  return gemm_config::large;
}

// Not selected by default yet: the first version of the prefill kernels measured slower than
// pick_config's tiles at every benchmark point (copy-engine bound), the current one (few large
// copies) is not measured yet (docs/performance.md, "2026-12-01"). Set to true to run them.
constexpr bool kSelectPrefillKernels = false;

// The prefill kernels (gemm_prefill.cuh) from 512 tokens on once experts get more than 8 pairs
// (the 512–2048 transition: narrow, up to 48; wide above), and wherever experts get more than 64
// pairs (where the large tile runs now). false: pick_config's tiles.
bool pick_prefill(int64_t tokens, int top_k, int64_t experts, sm90::prefill_config* pc) {
  if (!kSelectPrefillKernels) return false;
  const int64_t pairs = tokens * top_k;
  const int64_t per_expert = pairs / std::max<int64_t>(1, std::min(experts, pairs));
  if (per_expert <= 64 && (tokens < 512 || per_expert <= 8)) return false;
  *pc = per_expert <= 48 ? sm90::prefill_config::narrow : sm90::prefill_config::wide;
  return true;
}

// Upper bound of the tile count: sum_e ceil(c_e / BN) <= pairs / BN + min(E, pairs).
int64_t max_tiles(int64_t pairs, int64_t experts, int bn) { return pairs / bn + std::min(experts, pairs); }

struct workspace_plan {
  size_t counts, offsets, num_tiles, error_flag, tiles, ids, weights, pos, sorted, act, ybuf, total;
  workspace_plan(int64_t tokens, const moe_config& c) {
    const size_t pairs = static_cast<size_t>(tokens * c.routing.top_k);
    const size_t e = static_cast<size_t>(c.shape.experts);
    const size_t tiles_n = static_cast<size_t>(max_tiles(static_cast<int64_t>(pairs), c.shape.experts,
                                                         sm90::gemm_tokens_per_tile(gemm_config::decode)));
    size_t o = 0;
    auto take = [&](size_t bytes) {
      const size_t at = o;
      o = align_up(o + bytes);
      return at;
    };
    // counts .. error_flag are contiguous so that one memset clears them.
    counts = take(e * 4);
    offsets = counts + e * 4;
    num_tiles = offsets + (e + 1) * 4;
    error_flag = num_tiles + 4;
    o = align_up(error_flag + 4);
    tiles = take(tiles_n * sizeof(sm90::tile_desc));
    ids = take(pairs * 4);
    weights = take(pairs * 4);
    pos = take(pairs * 4);
    sorted = take(pairs * 4);
    act = take(pairs * static_cast<size_t>(c.shape.intermediate) * 2);
    ybuf = take(pairs * static_cast<size_t>(c.shape.hidden) * 2);
    total = o;
  }
  size_t clear_bytes() const { return error_flag + 4 - counts; }
  sm90::moe_workspace bind(void* base) const {
    char* b = static_cast<char*>(base);
    return {reinterpret_cast<int32_t*>(b + counts),   reinterpret_cast<int32_t*>(b + offsets),
            reinterpret_cast<int32_t*>(b + num_tiles), reinterpret_cast<int32_t*>(b + error_flag),
            reinterpret_cast<sm90::tile_desc*>(b + tiles), reinterpret_cast<int32_t*>(b + ids),
            reinterpret_cast<float*>(b + weights),     reinterpret_cast<int32_t*>(b + pos),
            reinterpret_cast<int32_t*>(b + sorted),    reinterpret_cast<uint16_t*>(b + act),
            reinterpret_cast<uint16_t*>(b + ybuf)};
  }
};

// A small host tensor (bias, correction bias) as float, wherever it lives.
std::vector<float> host_floats(const tensor_view& v) {
  const size_t n = static_cast<size_t>(v.numel());
  std::vector<uint8_t> raw(v.nbytes());
  if (v.device == device_kind::cuda)
    MXMOE_CUDA_CHECK(cudaMemcpy(raw.data(), v.data, raw.size(), cudaMemcpyDeviceToHost));
  else
    std::memcpy(raw.data(), v.data, raw.size());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (v.type == dtype::f32) {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = v.type == dtype::bf16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return out;
}

void check_device_view(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cuda, name, "a cuda tensor", "a cpu tensor");
  MXMOE_CHECK_ARG(v.contiguous(), name, "a contiguous tensor", "strides " + shape_string(v.strides));
  MXMOE_CHECK_ARG(reinterpret_cast<uintptr_t>(v.data) % 16 == 0, name, "16-byte aligned data",
                  "address % 16 = " + std::to_string(reinterpret_cast<uintptr_t>(v.data) % 16));
}

}  // namespace

struct moe_layer::impl {
  moe_config cfg;
  layout::sm90_fragment frag13, frag2;
  device_buffer codes13, scales13, codes2, scales2, bias13, bias2, correction;
};

moe_layer::moe_layer(const moe_weights& w, const moe_config& cfg) : impl_(std::make_unique<impl>()) {
  validate(cfg);
  validate(w, cfg);
  MXMOE_CHECK_ARG(w.format == weight_format::mxfp4, "weights.format", "mxfp4 (the cuda layer is W4A16)",
                  to_string(w.format));
  const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
  impl& m = *impl_;
  m.cfg = cfg;
  sm90::prepare_gemm_kernels();
  sm90::prepare_prefill_kernels();
  m.frag13 = {2 * I, H};
  m.frag2 = {H, I};
  m.codes13 = device_buffer(static_cast<size_t>(E * m.frag13.weight_bytes()));
  m.scales13 = device_buffer(static_cast<size_t>(E * m.frag13.scale_bytes()));
  m.codes2 = device_buffer(static_cast<size_t>(E * m.frag2.weight_bytes()));
  m.scales2 = device_buffer(static_cast<size_t>(E * m.frag2.scale_bytes()));

  // One expert at a time: temporary device memory is one expert's checkpoint bytes.
  const layout::checkpoint_mxfp4 ck13{E, 2 * I, H}, ck2{E, H, I};
  const bool on_device = w.gate_up_blocks.device == device_kind::cuda;
  device_buffer stage_b13, stage_s13, stage_b2, stage_s2;
  if (!on_device) {
    stage_b13 = device_buffer(static_cast<size_t>(2 * I * ck13.row_bytes()));
    stage_s13 = device_buffer(static_cast<size_t>(2 * I * ck13.scale_cols()));
    stage_b2 = device_buffer(static_cast<size_t>(H * ck2.row_bytes()));
    stage_s2 = device_buffer(static_cast<size_t>(H * ck2.scale_cols()));
  }
  const layout::gate_up_rows gate_up{I, cfg.gate_up};
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* b13 = w.gate_up_blocks.as<const uint8_t>() + e * 2 * I * ck13.row_bytes();
    const uint8_t* s13 = w.gate_up_scales.as<const uint8_t>() + e * 2 * I * ck13.scale_cols();
    const uint8_t* b2 = w.down_blocks.as<const uint8_t>() + e * H * ck2.row_bytes();
    const uint8_t* s2 = w.down_scales.as<const uint8_t>() + e * H * ck2.scale_cols();
    if (!on_device) {
      stage_b13.upload(b13, stage_b13.size());
      stage_s13.upload(s13, stage_s13.size());
      stage_b2.upload(b2, stage_b2.size());
      stage_s2.upload(s2, stage_s2.size());
      b13 = static_cast<const uint8_t*>(stage_b13.data());
      s13 = static_cast<const uint8_t*>(stage_s13.data());
      b2 = static_cast<const uint8_t*>(stage_b2.data());
      s2 = static_cast<const uint8_t*>(stage_s2.data());
    }
    sm90::launch_repack_expert(b13, s13, 2 * I, H, true, gate_up,
                               static_cast<uint8_t*>(m.codes13.data()) + e * m.frag13.weight_bytes(),
                               static_cast<uint8_t*>(m.scales13.data()) + e * m.frag13.scale_bytes(), nullptr);
    sm90::launch_repack_expert(b2, s2, H, I, false, gate_up,
                               static_cast<uint8_t*>(m.codes2.data()) + e * m.frag2.weight_bytes(),
                               static_cast<uint8_t*>(m.scales2.data()) + e * m.frag2.scale_bytes(), nullptr);
    if (!on_device) MXMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // staging is reused next expert
  }
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());

  if (!w.gate_up_bias.empty()) {  // to kernel row order, float
    const std::vector<float> b = host_floats(w.gate_up_bias);
    std::vector<float> k(b.size());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < 2 * I; ++r) k[e * 2 * I + r] = b[e * 2 * I + gate_up.kernel_to_checkpoint(r)];
    m.bias13 = device_buffer(k.size() * 4);
    m.bias13.upload(k.data(), k.size() * 4);
  }
  if (!w.down_bias.empty()) {
    const std::vector<float> b = host_floats(w.down_bias);
    m.bias2 = device_buffer(b.size() * 4);
    m.bias2.upload(b.data(), b.size() * 4);
  }
  if (!w.correction_bias.empty()) {
    const std::vector<float> b = host_floats(w.correction_bias);
    m.correction = device_buffer(b.size() * 4);
    m.correction.upload(b.data(), b.size() * 4);
  }
}

moe_layer::~moe_layer() = default;
moe_layer::moe_layer(moe_layer&&) noexcept = default;
moe_layer& moe_layer::operator=(moe_layer&&) noexcept = default;

const moe_config& moe_layer::config() const { return impl_->cfg; }

size_t moe_layer::workspace_bytes(int64_t max_tokens) const {
  MXMOE_CHECK_ARG(max_tokens >= 0, "max_tokens", ">= 0", std::to_string(max_tokens));
  return workspace_plan(max_tokens, impl_->cfg).total;
}

size_t moe_layer::weight_bytes() const {
  const impl& m = *impl_;
  return m.codes13.size() + m.scales13.size() + m.codes2.size() + m.scales2.size() + m.bias13.size() +
         m.bias2.size();
}

uint32_t moe_layer::read_error_flags(const void* workspace, size_t workspace_size) const {
  const workspace_plan plan(0, impl_->cfg);
  MXMOE_CHECK_ARG(workspace && workspace_size >= plan.error_flag + 4, "workspace", "a forward() workspace",
                  "a null or too small buffer");
  uint32_t flags = 0;
  MXMOE_CUDA_CHECK(cudaMemcpy(&flags, static_cast<const char*>(workspace) + plan.error_flag, 4, cudaMemcpyDeviceToHost));
  return flags;
}

void moe_layer::forward(const tensor_view& x, const routing_input& routing, const tensor_view& out, void* workspace,
                        size_t workspace_size, void* stream_ptr) const {
  const impl& m = *impl_;
  const moe_config& c = m.cfg;
  const int64_t E = c.shape.experts, H = c.shape.hidden, I = c.shape.intermediate;
  const int k = c.routing.top_k;

  check_device_view(x, "x");
  check_device_view(out, "out");
  MXMOE_CHECK_ARG(x.type == dtype::bf16, "x", "dtype bf16", to_string(x.type));
  MXMOE_CHECK_ARG(out.type == dtype::bf16, "out", "dtype bf16", to_string(out.type));
  validate_moe_io(x, out, c);
  const int64_t T = x.dim(0);
  MXMOE_CHECK_ARG(T <= 65536, "x", "at most 65536 tokens", std::to_string(T));
  const bool precomputed = !routing.ids.empty();
  if (precomputed) {
    check_device_view(routing.ids, "routing.ids");
    check_device_view(routing.weights, "routing.weights");
  } else {
    MXMOE_CHECK_ARG(!routing.logits.empty(), "routing", "logits [T, E] or ids and weights [T, k] on the device",
                    "nothing");
    check_device_view(routing.logits, "routing.logits");
  }
  validate_routing_input(routing, c, T);
  const workspace_plan plan(T, c);
  MXMOE_CHECK_ARG(workspace != nullptr && workspace_size >= plan.total, "workspace",
                  "at least workspace_bytes(T) = " + std::to_string(plan.total) + " bytes",
                  std::to_string(workspace_size) + " bytes");
  MXMOE_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % kAlign == 0, "workspace", "256-byte aligned",
                  "a misaligned pointer");
  if (T == 0) return;

  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const sm90::moe_workspace ws = plan.bind(workspace);
  const int64_t pairs = T * k;
  const gemm_config gc = pick_config(T, k, E);
  sm90::prefill_config pc{};
  const bool prefill = pick_prefill(T, k, E, &pc);
  const int bn = prefill ? sm90::prefill_tokens_per_tile(pc) : sm90::gemm_tokens_per_tile(gc);
  const int64_t tiles = max_tiles(pairs, E, bn);

  MXMOE_CUDA_CHECK(cudaMemsetAsync(ws.counts, 0, plan.clear_bytes(), stream));
  if (precomputed)
    sm90::launch_import_routing(routing.ids.as<const int32_t>(), routing.weights.as<const float>(), T, k, E, ws, stream);
  else
    sm90::launch_route(routing.logits.data, routing.logits.type == dtype::bf16,
                       static_cast<const float*>(m.correction.data()), c.routing, T, E, ws, stream);
  sm90::launch_schedule(E, bn, tiles, ws, stream);
  sm90::launch_scatter(pairs, ws, stream);

  const sm90::gemm_weights w13{static_cast<const uint8_t*>(m.codes13.data()), static_cast<const uint8_t*>(m.scales13.data()),
                               static_cast<const float*>(m.bias13.data()), 2 * I, H, m.frag13.weight_bytes(),
                               m.frag13.scale_bytes()};
  const sm90::gemm_weights w2{static_cast<const uint8_t*>(m.codes2.data()), static_cast<const uint8_t*>(m.scales2.data()),
                              static_cast<const float*>(m.bias2.data()), H, I, m.frag2.weight_bytes(),
                              m.frag2.scale_bytes()};
  if (prefill) {  // GEMM1's rows gathered into ybuf, which GEMM2 then overwrites
    sm90::launch_gather_sorted_rows(x.as<const uint16_t>(), pairs, k, H, E, ws, ws.ybuf, stream);
    sm90::launch_gemm_prefill(pc, w13, E, ws.ybuf, pairs, ws, sm90::epilogue_kind::gate_up_activation,
                              c.activation, tiles, stream);
    sm90::launch_gemm_prefill(pc, w2, E, ws.act, pairs, ws, sm90::epilogue_kind::weighted_down, c.activation, tiles,
                              stream);
  } else {
    sm90::launch_gemm(gc, w13, x.as<const uint16_t>(), ws, k, sm90::epilogue_kind::gate_up_activation, c.activation,
                      tiles, stream);
    sm90::launch_gemm(gc, w2, ws.act, ws, k, sm90::epilogue_kind::weighted_down, c.activation, tiles, stream);
  }
  sm90::launch_combine(T, k, H, ws, out.as<uint16_t>(), stream);
}

}  // namespace mxmoe::cuda
