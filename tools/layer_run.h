// Running one MoE layer on a backend and checking it against the CPU reference: shared by
// `mxmoe run` and `mxmoe demo`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli_common.h"
#include "mxmoe/cuda.h"
#include "mxmoe/moe.h"

namespace mxmoe::cli {

// Activations and router logits of one call.
struct layer_inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> x;    // bf16 [T, H]: what the GPU layer takes; the reference reads the same bits
  std::vector<float> logits;  // f32 [T, E]
};

// x ~ N(0, 1) rounded to bf16; logits from the router weights when present (x·Wrᵀ + br),
// else ~ N(0, 1). Deterministic in `seed`.
layer_inputs generate_inputs(const moe_config& cfg, const moe_weights& w, int64_t tokens, uint64_t seed);

struct comparison {
  double rel_l2 = 0, max_abs = 0;
};
// ||a - b|| / ||b|| and max |a - b|; NaN in `a` where `b` is finite makes both infinite.
comparison compare(const std::vector<float>& a, const std::vector<float>& b);

struct verified_run {
  std::string backend, reason;
  std::string reference;  // "cpu f64" or "cpu f32"
  comparison error;
  double threshold = 0;
  bool passed = false;
  double backend_seconds = 0, reference_seconds = 0;
  std::vector<float> out;  // the backend's output, f32 [T, H]
};

// Acceptance thresholds on the rel-L2 error against the reference (same weights, same inputs):
// the CPU backend accumulates in f32 (error ~1e-6); the GPU layer rounds its bf16 output and
// bf16 intermediate activations (each ~2^-9 relative per element, ~0.3% rel-L2 together).
inline constexpr double kCpuRelL2Threshold = 1e-4;
inline constexpr double kCudaRelL2Threshold = cuda::kForwardRelL2Tolerance;

// Runs the layer on `backend` and on the reference (f64, or f32 when `f64_reference` is false).
verified_run run_and_verify(const moe_weights& w, const moe_config& cfg, const layer_inputs& in,
                            const backend_choice& backend, bool f64_reference);

// The reference alone: cpu::moe_forward in f64 (or f32) into f32 [T, H].
std::vector<float> reference_forward(const moe_weights& w, const moe_config& cfg, const layer_inputs& in, bool f64);

}  // namespace mxmoe::cli
