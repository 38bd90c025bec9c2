// moe/repack.cu — checkpoint layout -> sm90 fragment layout, one expert per launch, on the
// device. Every output word and scale byte is computed from the layout header's inverse maps
// (layout::sm90_fragment::code_coord / scale_coord, layout::gate_up_rows), the checkpoint
// offsets (layout::checkpoint_mxfp4) and the fragment word's bit placement (mx.h): no layout is
// restated here. Padding gets code 0 and scale byte 0, so it can never turn into NaN.
// Biases are converted to float and put in kernel row order on the device as well.
#include <cuda_runtime.h>

#include "check.h"
#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "kernels.h"

namespace mxmoe::cuda::sm90 {
namespace {

__device__ __forceinline__ int64_t source_row(int64_t n, bool has_gate_up, const layout::gate_up_rows& gu) {
  return has_gate_up ? gu.kernel_to_checkpoint(n) : n;
}

// One thread per fragment word: the 8 codes its slots hold, found by the layout's inverse, packed
// by mx::fragment_word_pack.
__global__ void repack_codes_kernel(const uint8_t* __restrict__ blocks, layout::checkpoint_mxfp4 ck,
                                    layout::sm90_fragment frag, bool has_gate_up, layout::gate_up_rows gu,
                                    uint32_t* __restrict__ out) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= frag.weight_words()) return;
  uint8_t codes[8];
#pragma unroll
  for (int slot = 0; slot < 8; ++slot) {
    int64_t n, k;
    codes[slot] = 0;
    if (!frag.code_coord({w, slot}, &n, &k)) continue;
    const layout::nibble_pos src = ck.code_offset(0, source_row(n, has_gate_up, gu), k);
    codes[slot] = mx::unpack_e2m1(blocks[src.byte], src.high);
  }
  out[w] = mx::fragment_word_pack(codes);
}

__global__ void repack_scales_kernel(const uint8_t* __restrict__ scales, layout::checkpoint_mxfp4 ck,
                                     layout::sm90_fragment frag, bool has_gate_up, layout::gate_up_rows gu,
                                     uint8_t* __restrict__ out, uint32_t* __restrict__ out_of_range) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= frag.scale_bytes()) return;
  int64_t n, kb;
  uint8_t s = 0;
  if (frag.scale_coord(o, &n, &kb)) {
    s = scales[ck.scale_offset(0, source_row(n, has_gate_up, gu), kb)];
    if (s == 0 || s > 128) *out_of_range = 1;  // the same value from every writer: no atomic needed
  }
  out[o] = s;
}

// dst[e, r] = float(src[e, source row of r]) for bf16 / f16 / f32 sources.
__global__ void prepare_bias_kernel(const void* __restrict__ src, dtype type, int64_t experts, int64_t rows,
                                    bool has_gate_up, layout::gate_up_rows gu, float* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= experts * rows) return;
  const int64_t e = i / rows, from = e * rows + source_row(i % rows, has_gate_up, gu);
  float v;
  switch (type) {
    case dtype::f32: v = static_cast<const float*>(src)[from]; break;
    case dtype::bf16: v = bf16_to_float(static_cast<const uint16_t*>(src)[from]); break;
    default: v = f16_to_float(static_cast<const uint16_t*>(src)[from]); break;
  }
  dst[i] = v;
}

}  // namespace

void launch_prepare_bias(const void* src, dtype type, int64_t experts, int64_t rows, bool has_gate_up,
                         layout::gate_up_rows gate_up, float* dst, cudaStream_t stream) {
  const int64_t n = experts * rows;
  prepare_bias_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(src, type, experts, rows, has_gate_up,
                                                                                  gate_up, dst);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void launch_repack_expert(const uint8_t* ckpt_blocks, const uint8_t* ckpt_scales, int64_t rows, int64_t cols,
                          bool has_gate_up, layout::gate_up_rows gate_up, uint8_t* codes, uint8_t* scales,
                          uint32_t* scale_out_of_range, cudaStream_t stream) {
  const layout::checkpoint_mxfp4 ck{1, rows, cols};
  const layout::sm90_fragment frag{rows, cols};
  repack_codes_kernel<<<static_cast<unsigned>((frag.weight_words() + 255) / 256), 256, 0, stream>>>(
      ckpt_blocks, ck, frag, has_gate_up, gate_up, reinterpret_cast<uint32_t*>(codes));
  MXMOE_CUDA_CHECK(cudaGetLastError());
  repack_scales_kernel<<<static_cast<unsigned>((frag.scale_bytes() + 255) / 256), 256, 0, stream>>>(
      ckpt_scales, ck, frag, has_gate_up, gate_up, scales, scale_out_of_range);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
