// moe/moe_layer.cu — host side of the sm_90a MoE layer: validation, weight preparation (checkpoint
// layout -> kernel layout, one expert at a time), workspace planning and the launch sequence of
// one forward (see kernels.h for the data flow). Launchers validate; kernels assume.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/validate.h"
#include "decode_split.h"
#include "kernels.h"
#include "tile_bound.h"

namespace mxmoe::cuda {
namespace {

using sm90::gemm_config;

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The launch sequence, from MXMOE_MOE_PATH (read once per layer, when it is constructed):
//   unset or "default": pick_config's choice below: the decode GEMM up to 13 pairs per expert (9
//     under grouped sigmoid routing),
//     the persistent warp-specialized GEMMs of gemm_prefill.cuh above (x gathered into sorted
//     order first);
//   "tiles": gemm.cuh's wgmma tiles (mid, large) where the default runs the prefill GEMMs, as the
//     default did until 2026-12-05: for A/B measurements (the prefill GEMMs were 0.69-1.01x their
//     time over six model shapes at T = 256-16384 on an H200, docs/performance.md, "2026-12-05
//     (fifth session)");
//   "prefill": the prefill GEMMs at every size, also where the default runs the decode GEMM: for
//     A/B measurements of the threshold between the two;
//   "legacy": the sequence before the decode GEMM and the one-CTA plan (memset, four routing
//     kernels, gemm.cuh's 16-token mma.sync tile, plain launches): for A/B measurements and as a
//     fallback.
enum class moe_path { standard, tiles, prefill, legacy };

moe_path requested_path() {
  const char* v = std::getenv("MXMOE_MOE_PATH");
  if (v == nullptr || *v == '\0') return moe_path::standard;
  const std::string s(v);
  MXMOE_CHECK_ARG(s == "default" || s == "tiles" || s == "prefill" || s == "legacy", "MXMOE_MOE_PATH",
                  "unset, 'default', 'tiles', 'prefill' or 'legacy'", s);
  if (s == "legacy") return moe_path::legacy;
  if (s == "tiles") return moe_path::tiles;
  return s == "prefill" ? moe_path::prefill : moe_path::standard;
}

// Pairs per touched expert if routing were uniform (host-known: no sync): what the tile choices
// below go by.
int64_t pairs_per_expert(int64_t tokens, int top_k, int64_t experts) {
  const int64_t pairs = tokens * top_k;
  return pairs / std::max<int64_t>(1, std::min(experts, pairs));
}

// Grouped sigmoid routing (DeepSeek-V3, Kimi-K2): its correction bias concentrates the pairs on
// fewer experts than the uniform estimate of pairs_per_expert, so the busiest experts get more.
bool skewed_routing(routing_kind routing) { return routing == routing_kind::sigmoid_grouped_topk; }

// The most pairs per expert (uniform estimate) the decode GEMM runs. Measured on an H100
// (performance.md, 2026-12-06, fifteenth session: both paths forced at T = 64-640 on five model
// shapes, two rounds), the prefill GEMMs' time over the decode GEMM's crosses 1 between 12 and 16
// pairs per expert under softmax routing (gpt-oss-120b 1.10 at 12, 1.00 at 14, 0.92 at 16;
// Qwen3-30B-A3B and gpt-oss-20b 1.07-1.10 at 12, 0.93-0.96 at 16) and between 8 and 10 under
// grouped sigmoid routing (Kimi-K2 1.03 at 8, 1.00 at 9, 0.91 at 10; DeepSeek-V3 1.06 at 8, 0.99
// at 10); both thresholds sit at the middle.
int64_t decode_max_pairs_per_expert(routing_kind routing) { return skewed_routing(routing) ? 9 : 13; }

// The tile shape of both GEMMs, from the pairs per touched expert. The one place that chooses; a
// new kernel is hooked in here.
gemm_config pick_config(int64_t tokens, int top_k, int64_t experts, routing_kind routing, moe_path path) {
  const int64_t pairs = tokens * top_k;
  const int64_t per_expert = pairs_per_expert(tokens, top_k, experts);
  if (path == moe_path::legacy)
    return per_expert <= 16 ? gemm_config::legacy_decode : per_expert <= 64 ? gemm_config::mid : gemm_config::large;
  if (path != moe_path::prefill && pairs <= sm90::kPlanMaxPairs && per_expert <= decode_max_pairs_per_expert(routing))
    return gemm_config::decode;
  if (path == moe_path::tiles) return per_expert <= 64 ? gemm_config::mid : gemm_config::large;
  // The prefill GEMMs: narrow tiles (64 pairs) where experts get few pairs, mid tiles (96) up to
  // 72 (an expert seldom gets more than 96 then, which would cost a second pass over its weights),
  // wide tiles (176, three consumer warpgroups: tensor-core bound) above.
  if (per_expert <= 48) return gemm_config::prefill_narrow;
  return per_expert <= 72 ? gemm_config::prefill_mid : gemm_config::prefill_wide;
}

// Whether the prefill GEMMs copy their weights with an evict-first L2 policy
// (gemm_launch::weights_evict_first), so that the intermediates the next kernel reads back (the
// gathered rows, GEMM1's activations, GEMM2's outputs: pairs x (2H + I) bf16) stay in the L2 while
// the weights stream past them, and are neither written back nor read again from DRAM. Only where
//   - each expert's weights are read about once (at most one tile per expert, uniform estimate):
//     with more, the expert's next tile reads them again, and the L2 keeps them for it;
//   - the intermediates fit in the L2; and
//   - they are at least 1/12 of the weight bytes streamed (the experts touched, uniform estimate):
//     the policy costs re-reads of 1.4-4.9 % of the weight bytes (ncu), which only a large enough
//     saving outweighs.
// Measured on an H100 (performance.md, twenty-fourth session): Qwen3-30B-A3B T = 512 0.96-0.97 of
// the layer time, gpt-oss-20b T = 512 0.99-1.00; beyond these bounds 1.01-1.03 (gpt-oss-120b,
// Kimi-K2 and DeepSeek-V3 at T = 512, several tiles per expert at T = 8192).
bool weights_evict_first(int64_t tokens, int top_k, int64_t experts, int tokens_per_tile, int64_t hidden,
                         int64_t inter, int64_t expert_weight_bytes, int64_t l2_bytes) {
  const int64_t pairs = tokens * top_k;
  const int64_t intermediate_bytes = pairs * (2 * hidden + inter) * 2;
  const int64_t weight_bytes = std::min(experts, pairs) * expert_weight_bytes;
  return pairs_per_expert(tokens, top_k, experts) <= tokens_per_tile && intermediate_bytes <= l2_bytes &&
         12 * intermediate_bytes >= weight_bytes;
}

// Whether GEMM2 stores its outputs evict-last and the combine reads them evict-first
// (moe_workspace's ybuf policies): the L2 then keeps as much of ybuf as it holds until the combine
// reads it, the weights and activations streaming past leaving first. Only where each expert's
// weights are read about once (at most one tile per expert, uniform estimate): with several tiles
// per expert, the lines kept would push out the weights the expert's next tile reads again.
bool keep_outputs_in_l2(int64_t tokens, int top_k, int64_t experts, int tokens_per_tile) {
  return pairs_per_expert(tokens, top_k, experts) <= tokens_per_tile;
}

// Tokens per tile of the decode GEMM: 8 or 16, never more than the smaller that holds T (a token
// picks an expert once, so a tile never holds more than T pairs). Below that bound 8 up to 4 pairs
// per expert, except under grouped sigmoid routing (an expert with more pairs than the tile gets
// several tiles, each converting its weights again). Both fit 3 CTAs per SM (79 / 77 registers,
// 65 / 75 KB of shared memory). Measured on an H200 (performance.md, 2026-12-02): 8 tokens 14-17 %
// faster than wider tiles at 1-4 pairs per expert under softmax routing (gpt-oss-120b, Qwen3 T =
// 32-128); 16 tokens 3-8 % faster than 8 at Kimi-K2 and DeepSeek-V3 T = 64-128. (A 32-token tile
// served 17-20 pairs per expert until the prefill GEMMs took over above 13.)
int decode_tokens_per_tile(int64_t tokens, int64_t per_expert, routing_kind routing) {
  const int by_tokens = tokens <= 8 ? 8 : 16;
  const int by_pairs = per_expert <= 4 && !skewed_routing(routing) ? 8 : 16;
  return std::min(by_tokens, by_pairs);
}


// The decode GEMM's CTAs per SM on this GPU, for every tile, K split and ring_rows it launches with.
void measure_decode_occupancy(decode_occupancy& o) {
  for (int b = 0; b < decode_occupancy::kWidths; ++b)
    for (int g = 0; g < decode_occupancy::kGroups; ++g)
      for (int r = 0; r < decode_occupancy::kRows; ++r) {
        const int bn = 8 << b, kg = 1 << g, rows = 1 << r;
        if (rows > bn) continue;
        if (kg * bn <= 32) o.set(bn, kg, rows, sm90::kDecodeWarps, sm90::decode_ctas_per_sm(bn, kg, rows, sm90::kDecodeWarps));
        if (bn == 8 && kg <= 2)
          o.set(bn, kg, rows, sm90::kDecodeWarpsNarrow, sm90::decode_ctas_per_sm(bn, kg, rows, sm90::kDecodeWarpsNarrow));
      }
}

struct workspace_plan {
  size_t counts, offsets, num_tiles, error_flag, item_counters, tiles, ids, weights, pos, sorted, sorted_weights,
      combine_slots, act, ybuf, total;
  workspace_plan(int64_t tokens, const moe_config& c) {
    const size_t pairs = static_cast<size_t>(tokens * c.routing.top_k);
    const size_t e = static_cast<size_t>(c.shape.experts);
    const size_t tiles_n = static_cast<size_t>(max_tiles(static_cast<int64_t>(pairs), c.shape.experts, 8));
    size_t o = 0;
    auto take = [&](size_t bytes) {
      const size_t at = o;
      o = align_up(o + bytes);
      return at;
    };
    // counts .. item_counters are contiguous so that one memset clears them (four-step path).
    counts = take(e * 4);
    offsets = counts + e * 4;
    num_tiles = offsets + (e + 1) * 4;
    error_flag = num_tiles + 4;
    item_counters = error_flag + 4;
    o = align_up(item_counters + 8);
    tiles = take(tiles_n * sizeof(sm90::tile_desc));
    ids = take(pairs * 4);
    weights = take(pairs * 4);
    pos = take(pairs * 4);
    sorted = take(pairs * 4);
    sorted_weights = take(pairs * 4);
    combine_slots = take(pairs * sizeof(sm90::combine_slot));
    act = take(pairs * static_cast<size_t>(c.shape.intermediate) * 2);
    ybuf = take(pairs * static_cast<size_t>(c.shape.hidden) * 2);
    total = o;
  }
  size_t clear_bytes() const { return item_counters + 8 - counts; }
  sm90::moe_workspace bind(void* base) const {
    char* b = static_cast<char*>(base);
    return {reinterpret_cast<int32_t*>(b + counts),   reinterpret_cast<int32_t*>(b + offsets),
            reinterpret_cast<int32_t*>(b + num_tiles), reinterpret_cast<int32_t*>(b + error_flag),
            reinterpret_cast<int32_t*>(b + item_counters),
            reinterpret_cast<sm90::tile_desc*>(b + tiles), reinterpret_cast<int32_t*>(b + ids),
            reinterpret_cast<float*>(b + weights),     reinterpret_cast<int32_t*>(b + pos),
            reinterpret_cast<int32_t*>(b + sorted),    reinterpret_cast<float*>(b + sorted_weights),
            reinterpret_cast<sm90::combine_slot*>(b + combine_slots),
            reinterpret_cast<uint16_t*>(b + act),
            reinterpret_cast<uint16_t*>(b + ybuf)};
  }
};

// A bias as float [experts, rows] in kernel row order, on the device, from wherever it lives
// (host memory is uploaded as it is and converted there too).
device_buffer prepare_bias(const tensor_view& v, int64_t experts, int64_t rows, bool has_gate_up,
                           const layout::gate_up_rows& gate_up) {
  device_buffer staged;
  const void* src = v.data;
  if (v.device != device_kind::cuda) {
    staged = device_buffer(v.nbytes());
    staged.upload(v.data, v.nbytes());
    src = staged.data();
  }
  device_buffer out(static_cast<size_t>(experts * rows) * 4);
  sm90::launch_prepare_bias(src, v.type, experts, rows, has_gate_up, gate_up, static_cast<float*>(out.data()), nullptr);
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // `staged` is freed on return
  return out;
}

// A kernel operand: on this device (check.h), contiguous, 16-byte aligned (the kernels' vector loads).
void check_operand(const tensor_view& v, const char* name, int device) {
  check_device_view(v, name, device, 16);
  MXMOE_CHECK_ARG(v.contiguous(), name, "a contiguous tensor", "strides " + shape_string(v.strides));
}

}  // namespace

// A stream and two events for work that the forward's chain must not wait for (the GEMM1 weight
// prefetch): forked from the caller's stream at the start, joined back at the end, so a captured
// graph holds it as a branch of its own.
struct side_stream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  side_stream() {
    MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MXMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    MXMOE_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
  ~side_stream() {
    if (join) cudaEventDestroy(join);
    if (fork) cudaEventDestroy(fork);
    if (stream) cudaStreamDestroy(stream);
  }
  side_stream(const side_stream&) = delete;
  side_stream& operator=(const side_stream&) = delete;
};

// GEMM1 weight bytes to prefetch before GEMM1 knows its tiles (prefetch.cu): where the decode GEMM
// runs and most experts are touched (the expected share of touched experts under uniform routing,
// 1 - (1 - k/E)^T, >= 0.75: Qwen3-30B-A3B from T = 22, gpt-oss and DeepSeek-V3 from 44, Kimi-K2
// from 66), about what the DRAM moves while the route and plan kernels run. Where few experts are
// touched, the lowest ones are mostly not GEMM1's.
int64_t gemm1_prefetch_bytes(int64_t tokens, int top_k, int64_t experts) {
  const double touched = 1.0 - std::pow(1.0 - static_cast<double>(top_k) / static_cast<double>(experts),
                                        static_cast<double>(tokens));
  return touched >= 0.75 ? (16ll << 20) : 0;
}

struct moe_layer::impl {
  std::unique_ptr<side_stream> side = std::make_unique<side_stream>();
  moe_config cfg;
  layout::sm90_fragment frag13, frag2;
  device_buffer codes13, scales13, codes2, scales2, bias13, bias2, correction;
  device_buffer expert_map;  // i32 [E] (moe.h); empty for a layer holding every expert
  moe_path path = moe_path::standard;
  decode_device decode_dev;
  int64_t l2_bytes = 0;  // the device's L2 (weights_evict_first)
  bool scales13_in_range = false, scales2_in_range = false;  // sm90::gemm_weights::scales_in_range
};

moe_layer::moe_layer(const moe_weights& w, const moe_config& cfg, const std::vector<int32_t>& expert_map)
    : impl_(std::make_unique<impl>()) {
  validate(cfg);
  validate(w, cfg, expert_map);
  MXMOE_CHECK_ARG(w.format == weight_format::mxfp4, "weights.format", "mxfp4 (the cuda layer is W4A16)",
                  to_string(w.format));
  // E: the experts the weights hold (all, or those of the expert map); routing keeps all of them.
  const int64_t E = validate_expert_map(expert_map, cfg.shape.experts), H = cfg.shape.hidden,
                I = cfg.shape.intermediate;
  impl& m = *impl_;
  m.cfg = cfg;
  m.path = requested_path();
  sm90::prepare_gemm_kernels();
  if (m.path == moe_path::standard || m.path == moe_path::prefill) sm90::prepare_prefill_kernels();
  sm90::prepare_plan_kernel();
  {
    decode_device& d = m.decode_dev;
    int v = 0;
    const int dev = current_device();
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    d.smem_per_sm = static_cast<size_t>(v);
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    d.smem_reserved_per_cta = static_cast<size_t>(v);
    measure_decode_occupancy(d.occupancy);
    MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
    m.l2_bytes = v;
  }
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
  device_buffer out_of_range(2 * sizeof(uint32_t));  // GEMM1's, GEMM2's: a scale byte outside [1, 128]
  MXMOE_CUDA_CHECK(cudaMemset(out_of_range.data(), 0, out_of_range.size()));
  uint32_t* oor = static_cast<uint32_t*>(out_of_range.data());
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
                               static_cast<uint8_t*>(m.scales13.data()) + e * m.frag13.scale_bytes(), oor, nullptr);
    sm90::launch_repack_expert(b2, s2, H, I, false, gate_up,
                               static_cast<uint8_t*>(m.codes2.data()) + e * m.frag2.weight_bytes(),
                               static_cast<uint8_t*>(m.scales2.data()) + e * m.frag2.scale_bytes(), oor + 1, nullptr);
    if (!on_device) MXMOE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // staging is reused next expert
  }
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t flags[2] = {1, 1};
  MXMOE_CUDA_CHECK(cudaMemcpy(flags, oor, sizeof(flags), cudaMemcpyDeviceToHost));
  m.scales13_in_range = flags[0] == 0;
  m.scales2_in_range = flags[1] == 0;

  if (!w.gate_up_bias.empty()) m.bias13 = prepare_bias(w.gate_up_bias, E, 2 * I, true, gate_up);
  if (!w.down_bias.empty()) m.bias2 = prepare_bias(w.down_bias, E, H, false, gate_up);
  if (!w.correction_bias.empty())
    m.correction = prepare_bias(w.correction_bias, 1, cfg.shape.experts, false, gate_up);
  if (!expert_map.empty()) {
    m.expert_map = device_buffer(expert_map.size() * 4);
    m.expert_map.upload(expert_map.data(), expert_map.size() * 4);
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
         m.bias2.size() + m.expert_map.size();
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

  const int device = current_device();
  check_operand(x, "x", device);
  check_operand(out, "out", device);
  MXMOE_CHECK_ARG(x.type == dtype::bf16, "x", "dtype bf16", to_string(x.type));
  MXMOE_CHECK_ARG(out.type == dtype::bf16, "out", "dtype bf16", to_string(out.type));
  validate_moe_io(x, out, c);
  const int64_t T = x.dim(0);
  MXMOE_CHECK_ARG(T <= 65536, "x", "at most 65536 tokens", std::to_string(T));
  // Presence by is_absent (no data and no shape), not by the data pointer: torch hands out a null
  // pointer for a zero-size CUDA tensor, and logits [0, E] at T = 0 are given, not missing.
  const routing_source source = routing_source_of(routing);
  const bool precomputed = source == routing_source::precomputed;
  if (precomputed) {
    check_operand(routing.ids, "routing.ids", device);
    check_operand(routing.weights, "routing.weights", device);
  } else {
    MXMOE_CHECK_ARG(source == routing_source::logits, "routing", "logits [T, E] or ids and weights [T, k] on the device",
                    "nothing");
    check_operand(routing.logits, "routing.logits", device);
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
  sm90::moe_workspace ws = plan.bind(workspace);
  const int64_t pairs = T * k;
  const bool legacy = m.path == moe_path::legacy;
  const gemm_config gc = pick_config(T, k, E, c.routing.kind, m.path);
  const bool decode = gc == gemm_config::decode;
  const bool prefill =
      gc == gemm_config::prefill_narrow || gc == gemm_config::prefill_mid || gc == gemm_config::prefill_wide;
  const int bn = decode ? decode_tokens_per_tile(T, pairs_per_expert(T, k, E), c.routing.kind) : sm90::gemm_tokens_per_tile(gc);
  const int64_t tiles = max_tiles(pairs, E, bn);
  const int32_t* expert_map = static_cast<const int32_t*>(m.expert_map.data());

  const int64_t prefetch = decode && !legacy ? gemm1_prefetch_bytes(T, k, E) : 0;
  if (prefetch > 0) {
    sm90::weight_prefetch pf;
    pf.codes = static_cast<const uint8_t*>(m.codes13.data());
    pf.code_bytes = E * m.frag13.weight_bytes();
    pf.scales = static_cast<const uint8_t*>(m.scales13.data());
    pf.scale_bytes = E * m.frag13.scale_bytes();
    pf.budget = std::min<int64_t>(prefetch, pf.code_bytes + pf.scale_bytes);
    MXMOE_CUDA_CHECK(cudaEventRecord(m.side->fork, stream));
    MXMOE_CUDA_CHECK(cudaStreamWaitEvent(m.side->stream, m.side->fork, 0));
    sm90::launch_weight_prefetch(pf, m.side->stream);
    MXMOE_CUDA_CHECK(cudaEventRecord(m.side->join, m.side->stream));
  }
  if (!legacy && pairs <= sm90::kPlanMaxPairs) {  // routing bookkeeping by the one-CTA plan
    sm90::plan_args a;
    a.r = c.routing;
    a.tokens = static_cast<int>(T);
    a.experts = static_cast<int>(E);
    a.tokens_per_tile = bn;
    a.max_tiles = tiles;
    a.expert_map = expert_map;
    if (precomputed) {
      a.source = sm90::plan_source::precomputed;
      a.ids = routing.ids.as<const int32_t>();
      a.weights = routing.weights.as<const float>();
    } else if (sm90::plan_can_route(T, E, k, bn)) {
      a.source = sm90::plan_source::route;
      a.logits = routing.logits.data;
      a.logits_bf16 = routing.logits.type == dtype::bf16;
      a.correction_bias = static_cast<const float*>(m.correction.data());
    } else {
      a.source = sm90::plan_source::route_kernel;
      sm90::launch_route(routing.logits.data, routing.logits.type == dtype::bf16,
                         static_cast<const float*>(m.correction.data()), c.routing, T, E, false, true, expert_map, ws,
                         stream);
    }
    sm90::launch_plan(a, ws, stream);
  } else {  // the four-step path: counters cleared, then route / import, schedule, scatter
    MXMOE_CUDA_CHECK(cudaMemsetAsync(ws.counts, 0, plan.clear_bytes(), stream));
    if (precomputed)
      sm90::launch_import_routing(routing.ids.as<const int32_t>(), routing.weights.as<const float>(), T, k, E,
                                  expert_map, ws, stream);
    else
      sm90::launch_route(routing.logits.data, routing.logits.type == dtype::bf16,
                         static_cast<const float*>(m.correction.data()), c.routing, T, E, true, false, expert_map, ws,
                         stream);
    sm90::launch_schedule(E, bn, tiles, ws, stream);
    sm90::launch_scatter(pairs, ws, stream);
  }

  const sm90::gemm_weights w13{static_cast<const uint8_t*>(m.codes13.data()), static_cast<const uint8_t*>(m.scales13.data()),
                               static_cast<const float*>(m.bias13.data()), 2 * I, H, m.frag13.weight_bytes(),
                               m.frag13.scale_bytes(), m.scales13_in_range};
  const sm90::gemm_weights w2{static_cast<const uint8_t*>(m.codes2.data()), static_cast<const uint8_t*>(m.scales2.data()),
                              static_cast<const float*>(m.bias2.data()), H, I, m.frag2.weight_bytes(),
                              m.frag2.scale_bytes(), m.scales2_in_range};
  sm90::gemm_launch g1;
  g1.config = gc;
  g1.tokens_per_tile = bn;
  g1.max_tiles = tiles;
  g1.dependent = !legacy;
  g1.experts = E;
  g1.b_row_count = pairs;
  g1.weights_evict_first =
      prefill && weights_evict_first(T, k, E, bn, H, I,
                                     m.frag13.weight_bytes() + m.frag13.scale_bytes() + m.frag2.weight_bytes() +
                                         m.frag2.scale_bytes(),
                                     m.l2_bytes);
  sm90::gemm_launch g2 = g1;
  if (prefill && keep_outputs_in_l2(T, k, E, bn)) {
    ws.ybuf_store_l2_policy = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
    ws.ybuf_load_l2_policy = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
  }
  if (decode) {
    const int64_t est_tiles = std::min(E, pairs);
    g1.ring_rows = g2.ring_rows = decode_ring_rows(T, k, precomputed, bn);
    const decode_split s1 = pick_decode_split(decode_gemm::gate_up, bn, g1.ring_rows, est_tiles, 2 * I, H, m.decode_dev);
    const decode_split s2 = pick_decode_split(decode_gemm::down, bn, g2.ring_rows, est_tiles, H, I, m.decode_dev);
    g1.k_groups = s1.k_groups;
    g1.warps = s1.warps;
    g1.min_smem_bytes = s1.min_smem_bytes;
    g2.k_groups = s2.k_groups;
    g2.warps = s2.warps;
    g2.min_smem_bytes = s2.min_smem_bytes;
    g2.early_weights = true;  // its tile list was written by the plan, before GEMM1
    g1.one_b_row = T == 1;
  }
  const uint16_t* b1 = x.as<const uint16_t>();
  if (prefill) {  // GEMM1's rows gathered in sorted order into ybuf, which GEMM2 then overwrites
    sm90::launch_gather_sorted_rows(b1, pairs, k, H, ws, ws.ybuf, stream);
    b1 = ws.ybuf;
  }
  sm90::launch_gemm(g1, w13, b1, ws, k, sm90::epilogue_kind::gate_up_activation, c.activation, stream);
  sm90::launch_gemm(g2, w2, ws.act, ws, k,
                    prefill ? sm90::epilogue_kind::down_sorted : sm90::epilogue_kind::weighted_down, c.activation,
                    stream);
  sm90::launch_combine(T, k, H, ws, prefill ? sm90::ybuf_rows::by_sorted_position : sm90::ybuf_rows::by_pair,
                       out.as<uint16_t>(), !legacy, stream);
  if (prefetch > 0) MXMOE_CUDA_CHECK(cudaStreamWaitEvent(stream, m.side->join, 0));
}

}  // namespace mxmoe::cuda
