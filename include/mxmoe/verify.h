// mxmoe/verify.h — is a backend's output right? The comparison with the CPU reference
// (cpu::moe_forward, moe.h) on the same weights and inputs, and the documented tolerance of each
// backend. The last step of the road (checkpoint -> convert -> prepare -> forward -> verify,
// docs/architecture.md); `mxmoe run`, `mxmoe demo` and the tests use it.
//
// Tolerances (one definition each; docs/moe_layer.md derives the cuda one):
//   cpu   rel-L2 <= 1e-4: the float32 backend against the float64 reference (its error is ~1e-7).
//   cuda  rel-L2 <= cuda::kForwardRelL2Tolerance (4e-3) and max |out - ref| <=
//         cuda::kForwardMaxErrTolerance (1.5e-2) * max |ref|: the layer rounds its activation,
//         each weighted expert output and its output to bf16.
// All tensors here are host tensors, f32 | bf16.
#pragma once

#include <cstdint>

#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"

namespace mxmoe {

struct comparison {
  int64_t elements = 0;
  int64_t nonfinite_out = 0;  // NaN / Inf in `out` where the reference is finite
  int64_t nonfinite_ref = 0;  // NaN / Inf in the reference
  // ||out - ref|| / ||ref|| (||out - ref|| when the reference is all zero) and max |out - ref|,
  // accumulated in float64; both +inf as soon as one difference is not finite.
  double rel_l2 = 0, max_abs = 0;
  double max_ref = 0;  // max |ref| over its finite elements
};

// out and ref: host f32 | bf16 tensors of the same shape (contiguous).
comparison compare(const tensor_view& out, const tensor_view& ref);

struct forward_tolerance {
  double rel_l2 = 0;       // bound on comparison::rel_l2
  double max_err_rel = 0;  // bound on max_abs / max_ref; +inf: not checked
};
forward_tolerance tolerance_for(device_kind backend);

enum class verify_status : uint8_t {
  passed,            // within the backend's tolerance
  failed,            // beyond it (including a non-finite reference)
  nonfinite_output,  // the output holds NaN / Inf where the reference is finite
};
const char* to_string(verify_status s);

// The status of `c` under `tol`.
verify_status judge(const comparison& c, const forward_tolerance& tol);

struct verify_result {
  verify_status status = verify_status::failed;
  comparison error;
  forward_tolerance tolerance;
  cpu::precision reference = cpu::precision::f64;
  double reference_seconds = 0;
  bool passed() const { return status == verify_status::passed; }
};

// Runs the reference (cpu::moe_forward in `reference` precision, into f32) on the same weights and
// inputs the backend on `backend` was given, and judges `out` (that backend's output) against it
// with tolerance_for(backend). weights: the checkpoint-layout weights the layer was prepared from
// (host memory); x, routing, out: host tensors (out f32 | bf16 [T, H]). An f32 reference for the
// cpu backend is rejected (it would compare the backend with itself).
verify_result verify_forward(const moe_weights& weights, const moe_config& cfg, const tensor_view& x,
                             const routing_input& routing, const tensor_view& out, device_kind backend,
                             cpu::precision reference);

// The reference precision `mxmoe run --reference auto` uses: f64, except for a cuda backend on a
// call of more than 4e9 multiply-adds (T * top_k * 3 * H * I), where f32 is still far below the
// cuda tolerance and much faster.
cpu::precision auto_reference(device_kind backend, const moe_config& cfg, int64_t tokens);

}  // namespace mxmoe
