// GPU quantization statistics against the CPU reference's: the counts are exact; the sums of
// squares are added in another order on the GPU (per-CTA partials reduced in a fixed tree), so they
// agree only to a relative 1e-6.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mxmoe/quantize.h"

inline void expect_same_stats(const mxmoe::quant_stats& gpu, const mxmoe::quant_stats& cpu, const std::string& what) {
  EXPECT_EQ(gpu.elements, cpu.elements) << what;
  EXPECT_EQ(gpu.blocks, cpu.blocks) << what;
  EXPECT_EQ(gpu.saturated_blocks, cpu.saturated_blocks) << what;
  EXPECT_EQ(gpu.clamped_elements, cpu.clamped_elements) << what;
  EXPECT_EQ(gpu.flushed_elements, cpu.flushed_elements) << what;
  EXPECT_EQ(gpu.nonfinite_blocks, cpu.nonfinite_blocks) << what;
  EXPECT_NEAR(gpu.signal_sq, cpu.signal_sq, 1e-6 * std::fabs(cpu.signal_sq)) << what;
  EXPECT_NEAR(gpu.error_sq, cpu.error_sq, 1e-6 * std::fabs(cpu.error_sq)) << what;
}
