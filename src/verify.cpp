// Verification against the CPU reference (include/mxmoe/verify.h).
#include "mxmoe/verify.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe {
namespace {

constexpr double kCpuRelL2Tolerance = 1e-4;
constexpr double kAutoReferenceMaxWork = 4e9;  // multiply-adds up to which the f64 reference is used

void check_host_float(const tensor_view& v, const char* name) {
  MXMOE_CHECK_ARG(v.device == device_kind::cpu, name, "a host tensor", "a cuda tensor");
  MXMOE_CHECK_ARG(v.type == dtype::f32 || v.type == dtype::bf16, name, "dtype f32 | bf16", to_string(v.type));
  MXMOE_CHECK_ARG(v.contiguous(), name, "a contiguous tensor", "strides " + shape_string(v.strides));
  MXMOE_CHECK_ARG(v.data != nullptr || v.numel() == 0, name, "non-null data", "a null pointer");
}

}  // namespace

comparison compare(const tensor_view& out, const tensor_view& ref) {
  check_host_float(out, "out");
  check_host_float(ref, "ref");
  MXMOE_CHECK_ARG(out.shape == ref.shape, "out", "the shape of ref " + shape_string(ref.shape), shape_string(out.shape));
  comparison c;
  c.elements = out.numel();
  double diff = 0, norm = 0;
  bool finite = true;
  for (int64_t i = 0; i < c.elements; ++i) {
    const double a = load_float(out.data, out.type, i), b = load_float(ref.data, ref.type, i);
    if (!std::isfinite(b)) {
      ++c.nonfinite_ref;
      finite = false;
      continue;
    }
    if (!std::isfinite(a)) {
      ++c.nonfinite_out;
      finite = false;
      continue;
    }
    const double d = a - b;
    diff += d * d;
    norm += b * b;
    c.max_abs = std::max(c.max_abs, std::fabs(d));
    c.max_ref = std::max(c.max_ref, std::fabs(b));
  }
  if (!finite) {
    c.rel_l2 = c.max_abs = std::numeric_limits<double>::infinity();
    return c;
  }
  c.rel_l2 = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return c;
}

forward_tolerance tolerance_for(device_kind backend) {
  if (backend == device_kind::cuda) return {cuda::kForwardRelL2Tolerance, cuda::kForwardMaxErrTolerance};
  return {kCpuRelL2Tolerance, std::numeric_limits<double>::infinity()};
}

const char* to_string(verify_status s) {
  switch (s) {
    case verify_status::passed: return "passed";
    case verify_status::failed: return "failed";
    case verify_status::nonfinite_output: return "nonfinite_output";
  }
  return "?";
}

verify_status judge(const comparison& c, const forward_tolerance& tol) {
  if (c.nonfinite_out > 0) return verify_status::nonfinite_output;
  const bool rel_ok = c.rel_l2 <= tol.rel_l2;
  const bool max_ok = std::isinf(tol.max_err_rel) || c.max_abs <= tol.max_err_rel * c.max_ref;
  return rel_ok && max_ok ? verify_status::passed : verify_status::failed;
}

verify_result verify_forward(const moe_weights& weights, const moe_config& cfg, const tensor_view& x,
                             const routing_input& routing, const tensor_view& out, device_kind backend,
                             cpu::precision reference) {
  MXMOE_CHECK_ARG(backend == device_kind::cpu || backend == device_kind::cuda, "backend", "cpu | cuda",
                  std::to_string(static_cast<int>(backend)));
  MXMOE_CHECK_ARG(!(reference == cpu::precision::f32 && backend == device_kind::cpu), "reference",
                  "f64 for the cpu backend (f32 would compare it with itself)", "f32");
  check_host_float(out, "out");
  MXMOE_CHECK_ARG(x.rank() == 2, "x", "a [T, H] tensor", "shape " + shape_string(x.shape));
  verify_result r;
  r.reference = reference;
  r.tolerance = tolerance_for(backend);
  std::vector<float> ref(static_cast<size_t>(x.dim(0) * cfg.shape.hidden));
  const tensor_view ref_view(ref.data(), dtype::f32, {x.dim(0), cfg.shape.hidden});
  const auto t0 = std::chrono::steady_clock::now();
  cpu::moe_forward(x, routing, weights, cfg, ref_view, reference);
  r.reference_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.error = compare(out, ref_view);
  r.status = judge(r.error, r.tolerance);
  return r;
}

cpu::precision auto_reference(device_kind backend, const moe_config& cfg, int64_t tokens) {
  const double work = static_cast<double>(tokens) * cfg.routing.top_k * 3.0 * static_cast<double>(cfg.shape.hidden) *
                      static_cast<double>(cfg.shape.intermediate);
  return backend == device_kind::cpu || work <= kAutoReferenceMaxWork ? cpu::precision::f64 : cpu::precision::f32;
}

}  // namespace mxmoe
