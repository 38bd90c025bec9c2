// mxmoe/dtype.h — element types that cross the public API, their bit conversions
// (__host__ __device__, bit-exact with the GPU's own conversions), and tensor_view, the
// non-owning (pointer, dtype, shape, strides, device) that every public entry point takes.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "mxmoe/hd.h"
#include "mxmoe/mx.h"

namespace mxmoe {

enum class dtype : uint8_t { bf16, f16, f32, u8, i32, i64 };

inline int dtype_size(dtype t) {
  switch (t) {
    case dtype::bf16: case dtype::f16: return 2;
    case dtype::f32: case dtype::i32: return 4;
    case dtype::u8: return 1;
    case dtype::i64: return 8;
  }
  return 0;
}

inline const char* to_string(dtype t) {
  switch (t) {
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    case dtype::f32: return "f32";
    case dtype::u8: return "u8";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
  }
  return "?";
}

// ---- bf16 / f16 <-> f32 (round to nearest even; NaN stays NaN) -------------------------------

MXMOE_HD float bf16_to_float(uint16_t h) { return mx::bits_float(static_cast<uint32_t>(h) << 16); }

MXMOE_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = mx::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Two floats as one bf16x2 word, `lo` in bits 0..15: float_to_bf16 of each. On the device one
// cvt.rn.bf16x2.f32 instead of two integer roundings (~5 instructions each: the epilogues of the
// prefill GEMMs convert every output this way); it rounds the same, except that a NaN comes out as
// the canonical 0x7FFF, without its sign and payload (tests/gpu/test_gpu_dtype.cu compares the two
// over every float).
MXMOE_HD uint32_t float2_to_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
#endif
}

MXMOE_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return mx::bits_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in f32
    const float v = static_cast<float>(m) * mx::bits_float(0x33800000u);
    return mx::bits_float(sign | mx::float_bits(v));
  }
  return mx::bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

MXMOE_HD uint16_t float_to_f16(float f) {
  const uint32_t u = mx::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504 -> Inf
  if (a < 0x38800000u) {  // below 2^-14: f16 subnormal, quantum 2^-24; RNE via the FPU
    const float q = mx::bits_float(a) * mx::bits_float(0x4B800000u);  // * 2^24, exact
    const float r = (q + mx::bits_float(0x4B000000u)) - mx::bits_float(0x4B000000u);  // RNE
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// bf16, f16 and f32: the element types whose values are floating-point numbers.
inline bool is_float_type(dtype t) { return t == dtype::bf16 || t == dtype::f16 || t == dtype::f32; }

// Element i of an array of type `t` as float: bf16, f16 and f32 exactly (NaN stays NaN); u8, i32
// and i64 as the nearest float. The bytes are copied, so `base` needs no alignment (a tensor in a
// memory-mapped file may sit at any offset). The one way mxmoe reads an element as float.
MXMOE_HD float load_float(const void* base, dtype t, int64_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(base);
  switch (t) {
    case dtype::bf16: {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      return bf16_to_float(h);
    }
    case dtype::f16: {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      return f16_to_float(h);
    }
    case dtype::u8: return static_cast<float>(p[i]);
    case dtype::i32: {
      int32_t v;
      memcpy(&v, p + 4 * i, 4);
      return static_cast<float>(v);
    }
    case dtype::i64: {
      int64_t v;
      memcpy(&v, p + 8 * i, 8);
      return static_cast<float>(v);
    }
    case dtype::f32: break;
  }
  float f;
  memcpy(&f, p + 4 * i, 4);
  return f;
}

// ---- tensor_view ------------------------------------------------------------------------

enum class device_kind : uint8_t { cpu, cuda };

// Non-owning view. Strides are in elements; empty strides mean contiguous row-major.
struct tensor_view {
  void* data = nullptr;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  device_kind device = device_kind::cpu;

  tensor_view() = default;
  tensor_view(const void* p, dtype t, std::vector<int64_t> s, device_kind d = device_kind::cpu)
      : data(const_cast<void*>(p)), type(t), shape(std::move(s)), device(d) {}

  bool empty() const { return data == nullptr; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t stride(int i) const {
    const size_t k = static_cast<size_t>(i < 0 ? i + rank() : i);
    if (!strides.empty()) return strides.at(k);
    int64_t s = 1;
    for (size_t j = k + 1; j < shape.size(); ++j) s *= shape[j];
    return s;
  }
  bool contiguous() const {
    int64_t s = 1;
    for (int i = rank() - 1; i >= 0; --i) {
      if (shape[static_cast<size_t>(i)] != 1 && stride(i) != s) return false;
      s *= shape[static_cast<size_t>(i)];
    }
    return true;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * static_cast<size_t>(dtype_size(type)); }
  template <class T> T* as() const { return static_cast<T*>(data); }
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace mxmoe
