// quantize/launcher.cu — MXFP4 quantize / dequantize of device tensors (include/mxmoe/cuda.h), bit-exact
// with the CPU reference (src/cpu/quantize.cpp). Design and napkin math: docs/quantize_kernels.md.
//
// Two kernels per direction:
//   * fast: one thread per 32-element MX block, one warp per 32 consecutive blocks. The warp's
//     input is staged through shared memory with 16-byte cp.async (each instruction of the warp
//     reads 512 contiguous bytes), double-buffered so the next tile's loads are in flight while
//     the current one is encoded; each thread writes its 16 packed bytes with one 16-byte store.
//     Dequantize is the mirror image (16-byte loads of codes, output staged through shared memory).
//     Needs 16-byte aligned rows and outputs.
//   * reference: one thread per block, element loads, mx::quantize_block / mx::dequantize_value
//     as written. Used when an address is not 16-byte aligned (and exercised by the tests so).
// Scale bytes always come from mx::scale_from_amax (floor/even/rceil) or an exact replica of
// mx::block_scale's `mse` search (same float operations in the same order, see mse_scale; for bf16
// input fused with the encode in packed arithmetic, bit-identical sums, see mse_encode_bf16). The
// fast kernel encodes elements with exact floating-point steps instead of mx::float_to_e2m1's
// compare chain (see "per-element encoding"): two elements per instruction in bf16x2 / f16x2
// arithmetic for 16-bit inputs, so a bf16 element costs ~15-17 SASS instructions in the hot loop
// (loads, amax, scale, encode, packing, statistics), against a budget of ~23 per element at 85 % of
// the H200's copy bandwidth (docs/quantize_kernels.md has the napkin math).
// Statistics: integer counts exact (clamped elements by a packed compare, flushed ones as zero
// codes minus zero inputs); signal and error sums per block in float in units of the scale, per
// thread in double, one partial per CTA, reduced in a fixed order by a one-CTA kernel launched as a
// programmatic dependent of the quantize kernel. They cost ~30% of the hot loop's instructions:
// without a statistics pointer, quantize_async runs kernels that compute none (same bytes).
// Every kernel here is launched as a programmatic dependent of the work before it (its CTAs become
// resident while that work drains) and waits for it before touching memory.
// Limits: at most 2^31 - 1 blocks per call; at most 4 leading dimensions that cannot be merged.
//
// Files by role: addressing.cuh (where things live, kernel parameters), encoders.cuh (per-element
// encoding), mse.cuh (the mse search), statistics.cuh (accumulation and CTA partials), kernels.cuh
// (the kernels); this file validates and launches.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "addressing.cuh"
#include "check.h"
#include "kernels.cuh"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"
#include "statistics.cuh"

namespace mxmoe::cuda {
namespace {

using mx::scale_rule;
using namespace quant;

// ---- host side ----------------------------------------------------------------------------------

std::string str(int64_t v) { return std::to_string(v); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t total_blocks_of(const tensor_view& v) {
  return v.numel() / mx::kBlockSize;
}

// Merges the leading dimensions of x (all but the last) into row_map form, innermost first.
row_map make_row_map(const tensor_view& x, bool* rows_aligned16) {
  int64_t sizes[16], strides[16];
  int n = 0;
  for (int d = x.rank() - 2; d >= 0; --d) {
    const int64_t size = x.dim(d), stride = x.stride(d);
    if (size == 1) continue;
    if (n > 0 && stride == sizes[n - 1] * strides[n - 1]) {
      sizes[n - 1] *= size;
      continue;
    }
    MXMOE_CHECK_ARG(n < kMaxLeadingDims, "x",
                    "at most " + str(kMaxLeadingDims) + " leading dimensions that are not contiguous with each other",
                    "shape " + shape_string(x.shape) + " strides " + shape_string(x.strides));
    sizes[n] = size;
    strides[n] = stride;
    ++n;
  }
  row_map m;
  if (n == 0) {  // a single row
    sizes[0] = 1;
    strides[0] = 0;
    n = 1;
  }
  m.ndims = n;
  *rows_aligned16 = true;
  for (int d = 0; d < n; ++d) {
    m.size[d] = cutlass::FastDivmod(static_cast<int>(sizes[d]));
    m.stride[d] = strides[d];
    *rows_aligned16 &= (strides[d] * dtype_size(x.type)) % 16 == 0;
  }
  return m;
}

scale_index make_scale_index(const tensor_view& values, scale_layout layout) {
  const int64_t rows = values.dim(-2), cols = values.dim(-1) / mx::kBlockSize;
  scale_index s;
  s.tiled = layout == scale_layout::tiled_128x4;
  s.blocks_per_row = cutlass::FastDivmod(static_cast<int>(cols));
  s.rows = cutlass::FastDivmod(static_cast<int>(std::max<int64_t>(rows, 1)));
  s.tile = layout::scale_tiled_128x4{rows, cols};
  s.matrix_bytes = s.tile.size();
  return s;
}

void check_block_count(const tensor_view& values, const char* name) {
  MXMOE_CHECK_ARG(total_blocks_of(values) <= INT_MAX, name,
                  "at most " + str(INT_MAX) + " MX blocks (2^31 - 1) per call", str(total_blocks_of(values)) + " blocks");
}

// CTAs for a grid-stride kernel: enough to fill the GPU, no more than the work needs.
template <class Kernel>
int grid_size(Kernel kernel, int smem_bytes, int64_t ctas_needed) {
  int dev = current_device(), sms = 0, per_sm = 0;
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MXMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem_bytes));
  return static_cast<int>(std::clamp<int64_t>(ctas_needed, 1, int64_t{std::max(per_sm, 1)} * sms));
}

// Launches `kernel` as a programmatic dependent of the work before it in `stream`: its CTAs may be
// scheduled while that work drains (each kernel here calls wait_for_previous_grid before touching
// memory). Capturable in CUDA graphs (a programmatic edge).
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), int grid, int smem_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  MXMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// The kernel quantize_async launches for given parameters, with its dynamic shared memory and grid.
struct quantize_launch {
  void (*kernel)(quant_params);
  int smem_bytes;
  int grid;
};

template <dtype D, scale_rule R, bool kStats>
quantize_launch plan_fast(const quant_params& p) {
  constexpr int kSmem = kWarpsPerCta * 2 * 32 * (32 * elem_bytes<D>() / 16) * 16;
  auto kernel = quantize_fast<D, R, kStats>;
  MXMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int64_t tiles = layout::ceil_div(p.total_blocks, 32);
  return {kernel, kSmem,
          grid_size(kernel, kSmem,
                    std::max(layout::ceil_div(tiles, kWarpsPerCta), layout::ceil_div(p.pad_entries, kThreads)))};
}

template <dtype D, scale_rule R>
quantize_launch plan_fast(const quant_params& p, bool stats) {
  return stats ? plan_fast<D, R, true>(p) : plan_fast<D, R, false>(p);
}

template <dtype D>
quantize_launch plan_quantize(const quant_params& p, bool fast, bool stats) {
  if (!fast) {
    auto kernel = quantize_reference<D>;
    return {kernel, 0,
            grid_size(kernel, 0,
                      std::max(layout::ceil_div(p.total_blocks, kThreads), layout::ceil_div(p.pad_entries, kThreads)))};
  }
  switch (p.rule) {
    case scale_rule::floor: return plan_fast<D, scale_rule::floor>(p, stats);
    case scale_rule::even: return plan_fast<D, scale_rule::even>(p, stats);
    case scale_rule::rceil: return plan_fast<D, scale_rule::rceil>(p, stats);
    case scale_rule::mse: return plan_fast<D, scale_rule::mse>(p, stats);
  }
  throw std::logic_error("plan_quantize: unknown scale rule");
}

quantize_launch plan_quantize(const quant_params& p, dtype t, bool fast, bool stats) {
  switch (t) {
    case dtype::bf16: return plan_quantize<dtype::bf16>(p, fast, stats);
    case dtype::f16: return plan_quantize<dtype::f16>(p, fast, stats);
    default: return plan_quantize<dtype::f32>(p, fast, stats);
  }
}

// finalize_stats after the quantize kernel just enqueued: its launch overlaps that kernel's last
// CTAs instead of following its completion.
void launch_finalize(const stats_partial* partials, int count, int64_t blocks, quant_stats* out, cudaStream_t stream) {
  launch_dependent(finalize_stats, 1, 0, stream, partials, count, blocks, out);
}

// Frees a stream-ordered allocation when the enqueueing code is left, also by an exception.
struct stream_allocation {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  stream_allocation(size_t bytes, cudaStream_t s) : stream(s) { MXMOE_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, s)); }
  ~stream_allocation() {
    if (ptr) cudaFreeAsync(ptr, stream);
  }
  stream_allocation(const stream_allocation&) = delete;
  stream_allocation& operator=(const stream_allocation&) = delete;
};

}  // namespace

void quantize_async(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                    const tensor_view& scales, quant_stats* device_stats, void* stream_ptr) {
  validate_mx_tensor(x, packed, scales, layout, mx_values::quantize_input);
  const int dev = current_device();
  check_device_view(x, "x", dev);
  check_device_view(packed, "packed", dev);
  check_device_view(scales, "scales", dev);
  check_block_count(x, "x");
  MXMOE_CHECK_ARG(static_cast<int>(rule) <= static_cast<int>(scale_rule::mse), "rule", "floor, even, rceil or mse",
                  "value " + str(static_cast<int>(rule)));

  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  bool rows_aligned = true;
  quant_params p{};
  p.x = static_cast<const uint8_t*>(x.data);
  p.packed = packed.as<uint8_t>();
  p.scales = scales.as<uint8_t>();
  p.total_blocks = static_cast<int>(total_blocks_of(x));
  p.blocks_per_row = cutlass::FastDivmod(static_cast<int>(x.dim(-1) / mx::kBlockSize));
  p.rows = x.numel() > 0 ? make_row_map(x, &rows_aligned) : row_map{};
  p.dense = p.rows.ndims == 1 && (p.rows.stride[0] == x.dim(-1) || x.numel() == x.dim(-1));
  p.scale = make_scale_index(x, layout);
  const int64_t lead_rows = x.dim(-2) > 0 ? x.numel() / x.dim(-1) / x.dim(-2) : 0;
  p.pad_entries = layout == scale_layout::tiled_128x4
                      ? lead_rows * (p.scale.matrix_bytes - x.dim(-2) * (x.dim(-1) / mx::kBlockSize))
                      : 0;
  p.rule = rule;
  const bool fast = rows_aligned && aligned16(x.data) && aligned16(packed.data);

  // Without a statistics pointer the kernel computes none (a cheaper kernel) and nothing follows it.
  const bool stats = device_stats != nullptr;
  const quantize_launch launch = plan_quantize(p, x.type, fast, stats);
  if (!stats) return launch_dependent(launch.kernel, launch.grid, launch.smem_bytes, stream, p);
  stream_allocation partials(sizeof(stats_partial) * static_cast<size_t>(launch.grid), stream);
  p.partials = static_cast<stats_partial*>(partials.ptr);
  launch_dependent(launch.kernel, launch.grid, launch.smem_bytes, stream, p);
  launch_finalize(p.partials, launch.grid, p.total_blocks, device_stats, stream);
}

quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                     const tensor_view& scales, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  quant_stats result;
  {
    // Validation happens in quantize_async before this allocation is used for anything.
    stream_allocation stats(sizeof(quant_stats), stream);
    quantize_async(x, rule, layout, packed, scales, static_cast<quant_stats*>(stats.ptr), stream);
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(&result, stats.ptr, sizeof result, cudaMemcpyDeviceToHost, stream));
  }
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout, const tensor_view& out,
                void* stream_ptr) {
  validate_mx_tensor(out, packed, scales, layout, mx_values::dequantize_output);
  const int dev = current_device();
  check_device_view(packed, "packed", dev);
  check_device_view(scales, "scales", dev);
  check_device_view(out, "out", dev);
  check_block_count(out, "out");

  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  dequant_params p{};
  p.packed = static_cast<const uint8_t*>(packed.data);
  p.scales = static_cast<const uint8_t*>(scales.data);
  p.out = out.as<uint8_t>();
  p.total_blocks = static_cast<int>(total_blocks_of(out));
  p.scale = make_scale_index(out, layout);
  if (p.total_blocks == 0) return;
  const bool fast = aligned16(packed.data) && aligned16(out.data);
  const bool is_f32 = out.type == dtype::f32;
  if (fast) {
    auto kernel = is_f32 ? dequantize_fast<dtype::f32> : dequantize_fast<dtype::bf16>;
    const int grid = grid_size(kernel, 0, layout::ceil_div(layout::ceil_div(p.total_blocks, 32), kWarpsPerCta));
    kernel<<<grid, kThreads, 0, stream>>>(p);
  } else {
    auto kernel = is_f32 ? dequantize_reference<dtype::f32> : dequantize_reference<dtype::bf16>;
    const int grid = grid_size(kernel, 0, layout::ceil_div(p.total_blocks, kThreads));
    kernel<<<grid, kThreads, 0, stream>>>(p);
  }
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda
