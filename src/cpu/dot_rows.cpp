// Dot-product kernels of the CPU MoE layer (see dot_rows.h for the numerics). Written once with
// the GCC/Clang vector extension and compiled for two vector widths: 16 bytes (baseline SSE2 /
// NEON) and, on x86-64 CPUs that have it, 32 bytes (AVX2), picked at run time. Both compute
// the same eight lanes with the same operations, so they give identical bits.
#include "dot_rows.h"

#include <cstring>

namespace mxmoe::cpu::detail {
namespace {

#define MXMOE_INLINE inline __attribute__((always_inline))

template <class F, int Bytes>
struct lanes {
  typedef F vec __attribute__((vector_size(Bytes)));
  static constexpr int width = Bytes / static_cast<int>(sizeof(F)), count = 8 / width;
  struct acc8 {
    vec v[count];
  };
};

// Unaligned load; takes the vector by reference so no vector crosses a call boundary (ABI).
template <class F, int Bytes>
MXMOE_INLINE void load_vec(typename lanes<F, Bytes>::vec& v, const F* p) {
  std::memcpy(&v, p, sizeof v);
}

template <class F, int Bytes>
MXMOE_INLINE void clear(typename lanes<F, Bytes>::acc8& acc) {
  for (int q = 0; q < lanes<F, Bytes>::count; ++q) acc.v[q] = typename lanes<F, Bytes>::vec{};
}

// acc += a[0..8) * w[0..8), lane j taking element j.
template <class F, int Bytes>
MXMOE_INLINE void mul_add8(typename lanes<F, Bytes>::acc8& acc, const F* a, const typename lanes<F, Bytes>::vec* w) {
  for (int q = 0; q < lanes<F, Bytes>::count; ++q) {
    typename lanes<F, Bytes>::vec x;
    load_vec<F, Bytes>(x, a + q * lanes<F, Bytes>::width);
    acc.v[q] += x * w[q];
  }
}

template <class F, int Bytes>
MXMOE_INLINE F reduce8(const typename lanes<F, Bytes>::acc8& acc) {
  F l[8];
  std::memcpy(l, acc.v, sizeof l);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <class F, int Bytes>
MXMOE_INLINE void dot_rows_impl(const F* const* rows, size_t count, const F* w, int64_t n, F bias, F* out,
                                int64_t out_stride) {
  using L = lanes<F, Bytes>;
  typename L::vec wv[L::count];
  size_t j = 0;
  for (; j + 4 <= count; j += 4) {  // four rows per pass over w
    typename L::acc8 a0, a1, a2, a3;
    clear<F, Bytes>(a0), clear<F, Bytes>(a1), clear<F, Bytes>(a2), clear<F, Bytes>(a3);
    const F *r0 = rows[j], *r1 = rows[j + 1], *r2 = rows[j + 2], *r3 = rows[j + 3];
    for (int64_t i = 0; i < n; i += 8) {
      for (int q = 0; q < L::count; ++q) load_vec<F, Bytes>(wv[q], w + i + q * L::width);
      mul_add8<F, Bytes>(a0, r0 + i, wv);
      mul_add8<F, Bytes>(a1, r1 + i, wv);
      mul_add8<F, Bytes>(a2, r2 + i, wv);
      mul_add8<F, Bytes>(a3, r3 + i, wv);
    }
    out[(j + 0) * static_cast<size_t>(out_stride)] = reduce8<F, Bytes>(a0) + bias;
    out[(j + 1) * static_cast<size_t>(out_stride)] = reduce8<F, Bytes>(a1) + bias;
    out[(j + 2) * static_cast<size_t>(out_stride)] = reduce8<F, Bytes>(a2) + bias;
    out[(j + 3) * static_cast<size_t>(out_stride)] = reduce8<F, Bytes>(a3) + bias;
  }
  for (; j < count; ++j) {
    typename L::acc8 a;
    clear<F, Bytes>(a);
    for (int64_t i = 0; i < n; i += 8) {
      for (int q = 0; q < L::count; ++q) load_vec<F, Bytes>(wv[q], w + i + q * L::width);
      mul_add8<F, Bytes>(a, rows[j] + i, wv);
    }
    out[j * static_cast<size_t>(out_stride)] = reduce8<F, Bytes>(a) + bias;
  }
}

template <class F>
void dot_rows_baseline(const F* const* rows, size_t count, const F* w, int64_t n, F bias, F* out, int64_t stride) {
  dot_rows_impl<F, 16>(rows, count, w, n, bias, out, stride);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define MXMOE_HAS_AVX2_PATH 1
template <class F>
__attribute__((target("avx2"))) void dot_rows_avx2(const F* const* rows, size_t count, const F* w, int64_t n, F bias,
                                                   F* out, int64_t stride) {
  dot_rows_impl<F, 32>(rows, count, w, n, bias, out, stride);
}
const bool kUseAvx2 = __builtin_cpu_supports("avx2");
#endif

template <class F>
void dispatch(const F* const* rows, size_t count, const F* w, int64_t n, F bias, F* out, int64_t stride) {
#ifdef MXMOE_HAS_AVX2_PATH
  if (kUseAvx2) return dot_rows_avx2<F>(rows, count, w, n, bias, out, stride);
#endif
  dot_rows_baseline<F>(rows, count, w, n, bias, out, stride);
}

}  // namespace

void dot_rows(const float* const* rows, size_t count, const float* w, int64_t n, float bias, float* out,
              int64_t out_stride) {
  dispatch(rows, count, w, n, bias, out, out_stride);
}
void dot_rows(const double* const* rows, size_t count, const double* w, int64_t n, double bias, double* out,
              int64_t out_stride) {
  dispatch(rows, count, w, n, bias, out, out_stride);
}

}  // namespace mxmoe::cpu::detail
