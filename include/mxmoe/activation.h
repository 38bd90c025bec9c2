// mxmoe/activation.h — the one definition of the MoE activations (docs/models.md), __host__
// __device__, for float (kernels, CPU backend) and double (the test oracle).
//   silu_mul:       silu(gate) * up
//   swiglu_clamped: g = min(gate, limit); u = clamp(up, -limit, limit); g * sigmoid(alpha g) * (u + 1)
// The clamp parameters are always applied: ignoring them is a bug engines have shipped.
// On the GPU the float sigmoid is the hardware's exp2 and reciprocal (__expf, __fdividef): a few
// instructions instead of expf's range reduction and an IEEE division's slow-path check, with a
// relative error below 1e-5 for |v| < 80 (CUDA C Programming Guide, "Intrinsic Functions"), far
// under the bf16 rounding of the activation (2^-9). Everything else, and every host path, is the
// plain formula.
#pragma once

#include <cmath>
#include <type_traits>

#include "mxmoe/hd.h"
#include "mxmoe/moe.h"

namespace mxmoe {

template <class F>
MXMOE_HD F sigmoid(F v) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<F, float>) return __fdividef(1.0f, 1.0f + __expf(-v));  // 1/inf = 0
#endif
  using std::exp;
  return F(1) / (F(1) + exp(-v));
}

template <class F>
MXMOE_HD F activate(F gate, F up, const activation_config& a) {
  if (a.kind == activation_kind::swiglu_clamped) {
    const F limit = static_cast<F>(a.limit), alpha = static_cast<F>(a.alpha);
    const F g = gate > limit ? limit : gate;  // a NaN gate stays NaN
    const F u = up < -limit ? -limit : (up > limit ? limit : up);
    return g * sigmoid(alpha * g) * (u + F(1));
  }
  return gate * sigmoid(gate) * up;
}

}  // namespace mxmoe
