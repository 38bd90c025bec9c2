// Dot products of the CPU MoE layer: several activation rows against one weight row, so the
// weight row is read once for four tokens. Internal to src/cpu.
//
// Numerics (the same on every ISA, so results never depend on the machine): a dot product is
// eight interleaved partial sums (lane j takes elements j, j+8, j+16, ...), each a separate
// multiply and add (no FMA), reduced as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mxmoe::cpu::detail {

// out[j * out_stride] = rows[j] · w + bias for j in [0, count); n is a multiple of 8.
void dot_rows(const float* const* rows, size_t count, const float* w, int64_t n, float bias, float* out,
              int64_t out_stride);
void dot_rows(const double* const* rows, size_t count, const double* w, int64_t n, double bias, double* out,
              int64_t out_stride);

}  // namespace mxmoe::cpu::detail
