// moe/repack.cu — checkpoint layout -> sm90 fragment layout, one expert per launch, on the
// device. Every output byte is computed from the layout header's inverse maps
// (layout::sm90_fragment::code_coord / scale_coord, layout::gate_up_rows) and the checkpoint
// offsets (layout::checkpoint_mxfp4): no layout is restated here. Padding gets code 0 and scale
// byte 0, so it can never turn into NaN.
#include <cuda_runtime.h>

#include "check.h"
#include "mxmoe/layout.h"
#include "kernels.h"

namespace mxmoe::cuda::sm90 {
namespace {

__device__ __forceinline__ int64_t source_row(int64_t n, bool has_gate_up, const layout::gate_up_rows& gu) {
  return has_gate_up ? gu.kernel_to_checkpoint(n) : n;
}

__global__ void repack_codes_kernel(const uint8_t* __restrict__ blocks, layout::checkpoint_mxfp4 ck,
                                    layout::sm90_fragment frag, bool has_gate_up, layout::gate_up_rows gu,
                                    uint8_t* __restrict__ out) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= frag.weight_bytes()) return;
  uint8_t byte = 0;
  for (int high = 0; high < 2; ++high) {
    int64_t n, k;
    if (!frag.code_coord({b, high}, &n, &k)) continue;
    const layout::nibble_pos src = ck.code_offset(0, source_row(n, has_gate_up, gu), k);
    const uint8_t code = static_cast<uint8_t>((blocks[src.byte] >> (4 * src.high)) & 0xFu);
    byte |= static_cast<uint8_t>(code << (4 * high));
  }
  out[b] = byte;
}

__global__ void repack_scales_kernel(const uint8_t* __restrict__ scales, layout::checkpoint_mxfp4 ck,
                                     layout::sm90_fragment frag, bool has_gate_up, layout::gate_up_rows gu,
                                     uint8_t* __restrict__ out) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= frag.scale_bytes()) return;
  int64_t n, kb;
  out[o] = frag.scale_coord(o, &n, &kb) ? scales[ck.scale_offset(0, source_row(n, has_gate_up, gu), kb)] : 0;
}

}  // namespace

void launch_repack_expert(const uint8_t* ckpt_blocks, const uint8_t* ckpt_scales, int64_t rows, int64_t cols,
                          bool has_gate_up, layout::gate_up_rows gate_up, uint8_t* codes, uint8_t* scales,
                          cudaStream_t stream) {
  const layout::checkpoint_mxfp4 ck{1, rows, cols};
  const layout::sm90_fragment frag{rows, cols};
  repack_codes_kernel<<<static_cast<unsigned>((frag.weight_bytes() + 255) / 256), 256, 0, stream>>>(
      ckpt_blocks, ck, frag, has_gate_up, gate_up, codes);
  MXMOE_CUDA_CHECK(cudaGetLastError());
  repack_scales_kernel<<<static_cast<unsigned>((frag.scale_bytes() + 255) / 256), 256, 0, stream>>>(
      ckpt_scales, ck, frag, has_gate_up, gate_up, scales);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mxmoe::cuda::sm90
