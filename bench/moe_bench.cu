// moe_bench.cu — the MoE layer benchmark (`bench_moe`, `mxmoe bench`).
//
// For each model shape (include/mxmoe/presets.h) and token count T: synthetic MXFP4 weights
// (include/mxmoe/synthetic.h; the expert matrices drawn on the device with the same recipe:
// random codes, scale bytes around synthetic::scale_centre(K)), random bf16 activations and router
// logits, the layer prepared and run through include/mxmoe/forward.h,
// the whole layer (routing included) captured in a CUDA graph per input set; R input sets are
// rotated and the L2 (60 MB) is flushed before each timed replay (--l2-flush: by a memset, which
// leaves it full of dirty lines, or by a read); median of `iters` replays.
//
// Napkin math, per point:
//   bytes  = touched experts * 3*H*I * 4.25/8   (E2M1 + one E8M0 per 32)  + 2*T*H*2 (x, out)
//   flops  = 2 * T * k * 3*H*I
//   floor  = max(bytes / copy bandwidth, flops / bf16 matmul rate)
// Touched experts come from the actual routing of each input set (cpu::route on the same
// logits). Copy bandwidth is measured here; the bf16 rate comes from the torch run of the same
// session (bench/torch_baseline.py), which also times the torch BF16 grouped-GEMM layer.
// --peer-json adds the peer measured the same way in the same session (bench/peer_triton.py:
// triton_kernels' matmul_ogs as vLLM 0.33.0 runs it): peer_us and mxmoe/peer per point.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check.h"
#include "moe_bench.h"
#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"
#include "mxmoe/forward.h"
#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/presets.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::bench {
namespace {

__global__ void fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, int lo, int span) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = static_cast<uint8_t>(span >= 256 ? (z & 0xFFu) : lo + static_cast<int>(z % static_cast<uint64_t>(span)));
  }
}

}  // namespace

void random_device_bytes(cuda::device_buffer& b, uint64_t seed, int lo, int span) {
  fill_random_bytes<<<1024, 256>>>(static_cast<uint8_t*>(b.data()), static_cast<int64_t>(b.size()), seed, lo, span);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

device_expert_weights::device_expert_weights(const moe_shape& held, int64_t down_scale_k, uint64_t seed)
    : shape(held) {
  const int64_t E = held.experts, H = held.hidden, I = held.intermediate;
  const layout::checkpoint_mxfp4 gu{E, 2 * I, H}, dn{E, H, I};
  gate_up_blocks = cuda::device_buffer(static_cast<size_t>(gu.block_bytes()));
  gate_up_scales = cuda::device_buffer(static_cast<size_t>(gu.scale_bytes()));
  down_blocks = cuda::device_buffer(static_cast<size_t>(dn.block_bytes()));
  down_scales = cuda::device_buffer(static_cast<size_t>(dn.scale_bytes()));
  constexpr int kSpan = 2 * synthetic::kScaleSpread + 1;
  random_device_bytes(gate_up_blocks, seed, 0, 256);
  random_device_bytes(gate_up_scales, seed + 1, synthetic::scale_centre(H) - synthetic::kScaleSpread, kSpan);
  random_device_bytes(down_blocks, seed + 2, 0, 256);
  random_device_bytes(down_scales, seed + 3, synthetic::scale_centre(down_scale_k) - synthetic::kScaleSpread, kSpan);
}

void device_expert_weights::bind(moe_weights& w) const {
  const int64_t E = shape.experts, H = shape.hidden, I = shape.intermediate;
  w.gate_up_blocks = gate_up_blocks.view(dtype::u8, {E, 2 * I, H / 32, 16});
  w.gate_up_scales = gate_up_scales.view(dtype::u8, {E, 2 * I, H / 32});
  w.down_blocks = down_blocks.view(dtype::u8, {E, H, I / 32, 16});
  w.down_scales = down_scales.view(dtype::u8, {E, H, I / 32});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device copy bandwidth, bytes read + written, TB/s.
double measure_copy_tbps() {
  const size_t bytes = size_t{1} << 30;
  cuda::device_buffer a(bytes), b(bytes);
  random_device_bytes(a, 1, 0, 256);
  cudaEvent_t e0, e1;
  MXMOE_CUDA_CHECK(cudaEventCreate(&e0));
  MXMOE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 25; ++i) {
    MXMOE_CUDA_CHECK(cudaEventRecord(e0));
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
    MXMOE_CUDA_CHECK(cudaEventRecord(e1));
    MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 5) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) / (median(t) * 1e-3) / 1e12;
}

namespace {

struct torch_baseline {
  double bf16_tflops = 0.0, copy_tbps = 0.0;
  std::map<std::pair<std::string, int64_t>, double> us;
};

torch_baseline load_torch(const std::string& path) {
  torch_baseline tb;
  if (path.empty()) return tb;
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "bench_moe: cannot read torch baseline %s\n", path.c_str());
    return tb;
  }
  const nlohmann::json j = nlohmann::json::parse(f);
  tb.bf16_tflops = j.value("bf16_tflops", 0.0);
  tb.copy_tbps = j.value("copy_tbps", 0.0);
  for (const auto& r : j.at("rows")) tb.us[{r.at("shape").get<std::string>(), r.at("tokens").get<int64_t>()}] = r.at("us");
  return tb;
}

// The peer (bench/peer_triton.py): its identity, or why there is none, and its µs per point.
struct peer_baseline {
  nlohmann::json info;  // {"name", "version"} or null
  std::string reason;   // why info is null
  std::map<std::pair<std::string, int64_t>, double> us;
};

peer_baseline load_peer(const std::string& path) {
  peer_baseline pb;
  if (path.empty()) {
    pb.reason = "not measured in this run (no --peer-json)";
    return pb;
  }
  std::ifstream f(path);
  const nlohmann::json j = f ? nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
  if (!j.is_object()) {
    pb.reason = "cannot read " + path + " as a JSON object";
  } else if (!j.value("available", false) || !j.contains("peer") || !j.at("peer").is_object()) {
    pb.reason = j.value("reason", std::string("the peer reported no results"));
  } else {
    pb.info = j.at("peer");
    for (const auto& r : j.value("rows", nlohmann::json::array()))
      if (r.is_object() && r.contains("us") && r.at("us").is_number() && r.contains("shape") && r.contains("tokens"))
        pb.us[{r.at("shape").get<std::string>(), r.at("tokens").get<int64_t>()}] = r.at("us");
  }
  if (pb.info.is_null()) std::fprintf(stderr, "bench_moe: no peer column: %s\n", pb.reason.c_str());
  return pb;
}

// The clean L2 flush (--l2-flush clean): reads n 16-byte vectors, so that the L2 holds clean lines
// only; the sum is stored only if it is the impossible all-ones pattern, which keeps the loads.
__global__ void read_flush_kernel(const uint4* __restrict__ p, int64_t n, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0xFFFFFFFFu) *sink = acc;
}

// Before each timed replay: the L2 emptied of the layer's data, by a memset (dirty) or a read
// (clean) of a buffer four times the L2 of any Hopper part.
void flush_l2(cuda::device_buffer& flush, bool clean, int it, cudaStream_t stream) {
  if (!clean) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(flush.data(), it & 0xFF, flush.size(), stream));
    return;
  }
  const int64_t vecs = static_cast<int64_t>(flush.size() / sizeof(uint4)) - 1;  // the last one is the sink
  uint4* base = static_cast<uint4*>(flush.data());
  read_flush_kernel<<<1024, 256, 0, stream>>>(base, vecs, base + vecs);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int run_moe_bench(const moe_bench_options& opt) {
  if (opt.ep > 1 || opt.tp > 1) return run_moe_bench_parallel(opt);
  std::string why;
  if (!cuda::available(&why)) {
    std::fprintf(stderr, "mxmoe bench: the cuda backend is unavailable: %s\n", why.c_str());
    return 3;
  }
  cudaDeviceProp prop{};
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0, mem_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
  const double copy_tbps = measure_copy_tbps();
  const torch_baseline tb = load_torch(opt.torch_json);
  const peer_baseline pb = load_peer(opt.peer_json);
  std::printf("GPU %s, %d SMs, max SM clock %d MHz, memory clock %d MHz\n", prop.name, prop.multiProcessorCount,
              clock_khz / 1000, mem_khz / 1000);
  std::printf("ceilings this run: copy %.2f TB/s (read+write), bf16 matmul %s\n", copy_tbps,
              tb.bf16_tflops > 0 ? (std::to_string(static_cast<int>(tb.bf16_tflops)) + " TFLOP/s (torch)").c_str()
                                 : "not measured (no --torch-json): floors use bandwidth only");

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-14s %6s %5s %9s %9s %6s %9s %7s %9s %7s %8s %8s\n", "shape", "T", "touch", "us", "floor_us", "floor%",
              "torch_us", "speedup", "peer_us", "mx/peer", "TFLOP/s", "GB/s");
  const int64_t max_t = *std::max_element(opt.tokens.begin(), opt.tokens.end());
  constexpr int kSets = 4;
  cuda::device_buffer flush(size_t{256} << 20);
  const bool clean_flush = opt.l2_flush == "clean";
  MXMOE_CUDA_CHECK(cudaMemset(flush.data(), 0, flush.size()));
  std::printf("L2 flushed before each timed replay: %s\n",
              clean_flush ? "clean (a 256 MiB read)" : "dirty (a 256 MiB memset; the forward writes it back as it evicts it)");

  for (const std::string& name : opt.shapes) {
    const model_preset* preset = find_model_preset(name);
    if (!preset) {
      std::fprintf(stderr, "mxmoe bench: unknown shape '%s'\n", name.c_str());
      return 2;
    }
    const moe_config& cfg = preset->config;
    const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
    const int k = cfg.routing.top_k;

    // Biases and correction bias from the synthetic layer; its expert matrices, too large to draw
    // on the host quickly, drawn on the device with the same recipe.
    const synthetic::mxfp4_layer small = synthetic::make_layer(
        cfg, {.biases = preset->has_biases, .correction_bias = cfg.routing.kind == routing_kind::sigmoid_grouped_topk,
              .expert_weights = false},
        5);
    const std::vector<float>& corr = small.correction_bias;
    std::optional<prepared_moe> layer;
    {  // checkpoint-layout weights live only while the layer is prepared
      const device_expert_weights expert(cfg.shape, I, 11);
      moe_weights w = small.weights();
      expert.bind(w);
      layer.emplace(prepare(w, cfg, device_kind::cuda));
    }
    cuda::device_buffer ws(layer->workspace_bytes(max_t));
    std::vector<cuda::device_buffer> xs, logits_d;
    std::vector<std::vector<float>> logits_h(kSets);
    for (int s = 0; s < kSets; ++s) {
      synthetic::layer_inputs in = synthetic::make_inputs(cfg, small.weights(), max_t, 200 + s);
      xs.emplace_back(in.x.size() * 2);
      xs.back().upload(in.x.data(), in.x.size() * 2);
      logits_h[s] = std::move(in.logits);
      logits_d.emplace_back(logits_h[s].size() * 4);
      logits_d.back().upload(logits_h[s].data(), logits_h[s].size() * 4);
    }
    cuda::device_buffer out(static_cast<size_t>(max_t * H * 2));
    cudaStream_t stream;
    MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    MXMOE_CUDA_CHECK(cudaEventCreate(&e0));
    MXMOE_CUDA_CHECK(cudaEventCreate(&e1));

    for (int64_t T : opt.tokens) {
      std::vector<cudaGraphExec_t> exec(kSets);
      double touched = 0;
      for (int s = 0; s < kSets; ++s) {
        routing_input ri;
        ri.logits = logits_d[s].view(dtype::f32, {T, E});
        cudaGraph_t g;
        MXMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        moe_forward(*layer, xs[s].view(dtype::bf16, {T, H}), ri, out.view(dtype::bf16, {T, H}), ws.data(), ws.size(), stream);
        MXMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
        MXMOE_CUDA_CHECK(cudaGraphInstantiate(&exec[s], g, 0));
        cudaGraphDestroy(g);
        std::vector<int32_t> ids(static_cast<size_t>(T * k));
        std::vector<float> wts(ids.size());
        cpu::route(tensor_view(logits_h[s].data(), dtype::f32, {T, E}),
                   corr.empty() ? tensor_view() : tensor_view(corr.data(), dtype::f32, {E}), cfg.routing, tensor_view(ids.data(), dtype::i32, {T, k}),
                   tensor_view(wts.data(), dtype::f32, {T, k}));
        touched += static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size()) / kSets;
      }
      for (int s = 0; s < kSets; ++s) MXMOE_CUDA_CHECK(cudaGraphLaunch(exec[s], stream));  // warm-up
      std::vector<double> times;
      for (int it = 0; it < opt.iters; ++it) {
        flush_l2(flush, clean_flush, it, stream);
        MXMOE_CUDA_CHECK(cudaEventRecord(e0, stream));
        MXMOE_CUDA_CHECK(cudaGraphLaunch(exec[it % kSets], stream));
        MXMOE_CUDA_CHECK(cudaEventRecord(e1, stream));
        MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        times.push_back(ms * 1e3);
      }
      for (auto& x : exec) cudaGraphExecDestroy(x);
      const double us = median(times);
      const double bytes = touched * 3.0 * H * I * 4.25 / 8.0 + 2.0 * T * H * 2.0;
      const double flops = 2.0 * T * k * 3.0 * H * I;
      const double floor_bw = bytes / (copy_tbps * 1e12) * 1e6;
      const double floor_fl = tb.bf16_tflops > 0 ? flops / (tb.bf16_tflops * 1e12) * 1e6 : 0.0;
      const double floor_us = std::max(floor_bw, floor_fl);
      const auto it_t = tb.us.find({name, T});
      const double torch_us = it_t == tb.us.end() ? 0.0 : it_t->second;
      const auto it_p = pb.us.find({name, T});
      const double peer_us = it_p == pb.us.end() ? 0.0 : it_p->second;
      std::printf("%-14s %6lld %5.0f %9.1f %9.1f %5.0f%% %9.1f %6.2fx %9.1f %7.2f %8.1f %8.0f\n", name.c_str(),
                  static_cast<long long>(T), touched, us, floor_us, 100.0 * floor_us / us, torch_us,
                  torch_us > 0 ? torch_us / us : 0.0, peer_us, peer_us > 0 ? us / peer_us : 0.0, flops / us * 1e-6,
                  bytes / us * 1e-3);
      std::fflush(stdout);
      rows.push_back({{"shape", name}, {"tokens", T}, {"experts", E}, {"topk", k}, {"hidden", H}, {"intermediate", I},
                      {"touched_experts", touched}, {"us", us}, {"floor_us", floor_us},
                      {"torch_bf16_us", torch_us > 0 ? nlohmann::json(torch_us) : nlohmann::json(nullptr)},
                      {"peer_us", peer_us > 0 ? nlohmann::json(peer_us) : nlohmann::json(nullptr)},
                      {"tflops", flops / us * 1e-6}, {"gbps", bytes / us * 1e-3}});
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
  }

  if (!opt.json_out.empty()) {
    char date[16];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    nlohmann::json j = {{"gpu", prop.name},        {"commit", opt.commit},
                        {"date", date},            {"copy_tbps", copy_tbps},
                        {"bf16_tflops", tb.bf16_tflops > 0 ? nlohmann::json(tb.bf16_tflops) : nlohmann::json(nullptr)},
                        {"peer", pb.info},         {"rows", rows},
                        {"l2_flush", opt.l2_flush}};
    if (pb.info.is_null()) j["peer_reason"] = pb.reason;
    std::ofstream(opt.json_out) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace mxmoe::bench
