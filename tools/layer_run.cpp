// One MoE layer on the CPU backend or the CUDA layer, verified against cpu::moe_forward.
#include "layer_run.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "mxmoe/cuda.h"

namespace mxmoe::cli {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

layer_inputs generate_inputs(const moe_config& cfg, const moe_weights& w, int64_t tokens, uint64_t seed) {
  const int64_t H = cfg.shape.hidden, E = cfg.shape.experts;
  layer_inputs in;
  in.tokens = tokens;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.x.resize(static_cast<size_t>(tokens * H));
  for (auto& v : in.x) v = float_to_bf16(normal(rng));
  in.logits.resize(static_cast<size_t>(tokens * E));
  if (!w.router_weight.empty() && tokens > 0) {
    cpu::router_logits(tensor_view(in.x.data(), dtype::bf16, {tokens, H}), w.router_weight, w.router_bias,
                       tensor_view(in.logits.data(), dtype::f32, {tokens, E}));
  } else {
    for (auto& v : in.logits) v = normal(rng);
  }
  return in;
}

comparison compare(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0, max_abs = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    if (!std::isfinite(d)) return {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
    max_abs = std::max(max_abs, std::fabs(d));
  }
  if (a.size() != b.size()) return {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  return {ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff), max_abs};
}

std::vector<float> reference_forward(const moe_weights& w, const moe_config& cfg, const layer_inputs& in, bool f64) {
  const int64_t T = in.tokens, H = cfg.shape.hidden, E = cfg.shape.experts;
  std::vector<float> out(static_cast<size_t>(T * H));
  routing_input routing;
  routing.logits = tensor_view(in.logits.data(), dtype::f32, {T, E});
  cpu::moe_forward(tensor_view(in.x.data(), dtype::bf16, {T, H}), routing, w, cfg,
                   tensor_view(out.data(), dtype::f32, {T, H}), f64 ? cpu::precision::f64 : cpu::precision::f32);
  return out;
}

verified_run run_and_verify(const moe_weights& w, const moe_config& cfg, const layer_inputs& in,
                            const backend_choice& backend, bool f64_reference) {
  const int64_t T = in.tokens, H = cfg.shape.hidden, E = cfg.shape.experts;
  verified_run run;
  run.backend = backend.name;
  run.reason = backend.reason;
  run.reference = f64_reference ? "cpu f64" : "cpu f32";
  auto t0 = std::chrono::steady_clock::now();
  if (backend.device == device_kind::cpu) {
    run.out = reference_forward(w, cfg, in, false);
    run.threshold = kCpuRelL2Threshold;
  } else {
    const cuda::moe_layer layer(w, cfg);
    cuda::device_buffer dx(in.x.size() * 2 + 2), dl(in.logits.size() * 4 + 4), dout(static_cast<size_t>(T * H) * 2 + 2);
    const size_t ws_bytes = layer.workspace_bytes(T);
    cuda::device_buffer ws(ws_bytes + 1);
    dx.upload(in.x.data(), in.x.size() * 2);
    dl.upload(in.logits.data(), in.logits.size() * 4);
    routing_input routing;
    routing.logits = dl.view(dtype::f32, {T, E});
    t0 = std::chrono::steady_clock::now();
    layer.forward(dx.view(dtype::bf16, {T, H}), routing, dout.view(dtype::bf16, {T, H}), ws.data(), ws_bytes);
    cuda::synchronize();
    std::vector<uint16_t> out16(static_cast<size_t>(T * H));
    dout.download(out16.data(), out16.size() * 2);
    run.out.resize(out16.size());
    for (size_t i = 0; i < out16.size(); ++i) run.out[i] = bf16_to_float(out16[i]);
    run.threshold = kCudaRelL2Threshold;
  }
  run.backend_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  const std::vector<float> ref = reference_forward(w, cfg, in, f64_reference);
  run.reference_seconds = seconds_since(t0);
  run.error = compare(run.out, ref);
  run.passed = run.error.rel_l2 <= run.threshold;
  return run;
}

}  // namespace mxmoe::cli
