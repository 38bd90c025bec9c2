// The C ABI's verification (mxmoe/verify.h): the backends' tolerances, comparing an output with a
// reference, and verifying a backend's output against the CPU reference run here.
#include "bridge.h"
#include "mxmoe/c_api.h"
#include "mxmoe/error.h"
#include "mxmoe/verify.h"

namespace mxmoe::c_api {
namespace {

static_assert(MXMOE_VERIFY_NONFINITE_OUTPUT == static_cast<int>(verify_status::nonfinite_output));
static_assert(MXMOE_REFERENCE_F32 == static_cast<int>(cpu::precision::f32) &&
              MXMOE_REFERENCE_F64 == static_cast<int>(cpu::precision::f64));

mxmoe_verify_result to_result(verify_status status, const comparison& c, const forward_tolerance& tol) {
  mxmoe_verify_result r{};
  r.status = static_cast<int32_t>(status);
  r.reference = MXMOE_REFERENCE_NONE;
  r.elements = c.elements;
  r.nonfinite_out = c.nonfinite_out;
  r.nonfinite_ref = c.nonfinite_ref;
  r.rel_l2 = c.rel_l2;
  r.max_abs = c.max_abs;
  r.max_ref = c.max_ref;
  r.tolerance_rel_l2 = tol.rel_l2;
  r.tolerance_max_err_rel = tol.max_err_rel;
  return r;
}

}  // namespace
}  // namespace mxmoe::c_api

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

mxmoe_status mxmoe_forward_tolerance(int32_t device_type, double* rel_l2, double* max_err_rel) {
  return guarded([&] {
    const device_kind d = to_device_kind(device_type, "device_type");
    MXMOE_CHECK_ARG(rel_l2 != nullptr, "rel_l2", "a pointer to the result", "NULL");
    const forward_tolerance t = tolerance_for(d);
    *rel_l2 = t.rel_l2;
    if (max_err_rel) *max_err_rel = t.max_err_rel;
  });
}

mxmoe_status mxmoe_compare(const mxmoe_tensor* out, const mxmoe_tensor* ref, int32_t device_type,
                           mxmoe_verify_result* result) {
  return guarded([&] {
    const tensor_view o = required_view(out, "out"), r = required_view(ref, "ref");
    const forward_tolerance tol = tolerance_for(to_device_kind(device_type, "device_type"));
    MXMOE_CHECK_ARG(result != nullptr, "result", "a pointer to the result", "NULL");
    const comparison c = compare(o, r);
    *result = to_result(judge(c, tol), c, tol);
  });
}

mxmoe_status mxmoe_verify(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights, const mxmoe_tensor* x,
                          const mxmoe_tensor* logits, const mxmoe_tensor* ids, const mxmoe_tensor* routing_weights,
                          const mxmoe_tensor* out, int32_t device_type, int32_t reference,
                          mxmoe_verify_result* result) {
  return guarded([&] {
    const moe_config c = to_config(cfg);
    const moe_weights w = to_weights(weights);
    const tensor_view xv = required_view(x, "x"), ov = required_view(out, "out");
    routing_input routing;
    routing.logits = optional_view(logits, "routing.logits");
    routing.ids = optional_view(ids, "routing.ids");
    routing.weights = optional_view(routing_weights, "routing.weights");
    const device_kind backend = to_device_kind(device_type, "device_type");
    MXMOE_CHECK_ARG(reference == MXMOE_REFERENCE_F32 || reference == MXMOE_REFERENCE_F64 ||
                        reference == MXMOE_REFERENCE_AUTO,
                    "reference", "0 (f32), 1 (f64) or 2 (auto)", std::to_string(reference));
    MXMOE_CHECK_ARG(result != nullptr, "result", "a pointer to the result", "NULL");
    require_device({device_kind::cpu, 0}, "the reference runs on the host",
                   {{"x", x}, {"routing.logits", logits}, {"routing.ids", ids}, {"routing.weights", routing_weights},
                    {"out", out}});
    MXMOE_CHECK_ARG(xv.rank() == 2, "x", "a [T, H] tensor", "shape " + shape_string(xv.shape));
    const cpu::precision prec = reference == MXMOE_REFERENCE_AUTO ? auto_reference(backend, c, xv.dim(0))
                                                                    : static_cast<cpu::precision>(reference);
    const verify_result v = verify_forward(w, c, xv, routing, ov, backend, prec);
    *result = to_result(v.status, v.error, v.tolerance);
    result->reference = static_cast<int32_t>(v.reference);
    result->reference_seconds = v.reference_seconds;
  });
}

}  // extern "C"
