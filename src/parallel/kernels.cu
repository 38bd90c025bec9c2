// parallel/kernels.cu — the steps of the parallel layers on the GPU (ops.h defines what each
// computes; ops_cpu.cpp is the plain reference the CPU tests check).
//
//   ep_plan      one CTA of 1024 threads: for each destination rank, the tokens that go there are
//                numbered in token order by a block-wide scan per chunk of 1024 tokens (positions,
//                the slot_token inverse, the flags). Deterministic: no atomics decide a position.
//                T / 1024 * P scans: microseconds at decode sizes.
//   ep_pack      one CTA per send row: the token's x row (16-byte vectors), its ids and weights, or
//                the pad id and weight 0 for an unused row.
//   ep_combine   one thread per 8 hidden values of a token: the returned rows summed in rank
//                order in f32, rounded once to bf16.
//   sum_partials one thread per 8 values: the TP partials summed in rank order.
// x, the rows sent and returned and the output are bf16; H is a multiple of 32, so a row is a
// whole number of 16-byte vectors, and every buffer comes from cudaMalloc (256-byte aligned).
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "check.h"
#include "mxmoe/dtype.h"
#include "ops.h"

namespace mxmoe::parallel::cuda_ops {
namespace {

constexpr int kPlanThreads = 1024;
using plan_scan = cub::BlockScan<int, kPlanThreads>;

__global__ void __launch_bounds__(kPlanThreads) ep_plan_kernel(ep_call c) {
  __shared__ typename plan_scan::TempStorage tmp;
  __shared__ uint32_t flags;
  const int tid = threadIdx.x;
  if (tid == 0) flags = 0;
  __syncthreads();
  for (int q = 0; q < c.ranks; ++q) {
    int64_t running = 0;  // tokens before this chunk that go to q (the same in every thread)
    for (int64_t t0 = 0; t0 < c.tokens; t0 += kPlanThreads) {
      const int64_t t = t0 + tid;
      const int32_t* ids = c.ids + t * c.top_k;
      const int goes = t < c.tokens && ep_sends(ids, c.top_k, c.experts, c.owners, q) ? 1 : 0;
      if (q == 0 && t < c.tokens && ep_bad_id(ids, c.top_k, c.experts)) atomicOr(&flags, kBadExpertFlag);
      int before, total;
      plan_scan(tmp).ExclusiveSum(goes, before, total);
      __syncthreads();  // tmp is reused by the next scan
      if (t < c.tokens) {
        const int64_t pos = running + before;
        int32_t sent = -1;
        if (goes && pos < c.capacity) {
          sent = static_cast<int32_t>(pos);
          c.slot_token[q * c.capacity + pos] = static_cast<int32_t>(t);
        } else if (goes) {
          atomicOr(&flags, kOverflowFlag);
        }
        c.sent[q * c.tokens + t] = sent;
      }
      running += total;
    }
    for (int64_t pos = running + tid; pos < c.capacity; pos += kPlanThreads) c.slot_token[q * c.capacity + pos] = -1;
  }
  __syncthreads();
  if (tid == 0) *c.flags = flags;
}

constexpr int kPackThreads = 128;

__global__ void __launch_bounds__(kPackThreads) ep_pack_kernel(ep_call c) {
  const int64_t r = blockIdx.x;  // send row q * C + pos
  const int q = static_cast<int>(r / c.capacity);
  const int32_t t = c.slot_token[r];
  if (threadIdx.x < c.top_k) {
    const int j = threadIdx.x;
    c.send_ids[r * c.top_k + j] = t >= 0 ? c.ids[static_cast<int64_t>(t) * c.top_k + j] : c.pad_ids[q];
    c.send_w[r * c.top_k + j] = t >= 0 ? c.weights[static_cast<int64_t>(t) * c.top_k + j] : 0.0f;
  }
  const int64_t vecs = c.hidden / 8;
  uint4* dst = static_cast<uint4*>(c.send_x) + r * vecs;
  const uint4* src = static_cast<const uint4*>(c.x) + static_cast<int64_t>(t) * vecs;
  for (int64_t v = threadIdx.x; v < vecs; v += kPackThreads) dst[v] = t >= 0 ? src[v] : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ void add_bf16x8(float (&acc)[8], uint4 y) {
  const uint32_t w[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    acc[2 * q] += bf16_to_float(static_cast<uint16_t>(w[q] & 0xFFFFu));
    acc[2 * q + 1] += bf16_to_float(static_cast<uint16_t>(w[q] >> 16));
  }
}

__device__ __forceinline__ uint4 to_bf16x8(const float (&acc)[8]) {
  uint32_t o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    o[q] = static_cast<uint32_t>(float_to_bf16(acc[2 * q])) | (static_cast<uint32_t>(float_to_bf16(acc[2 * q + 1])) << 16);
  return make_uint4(o[0], o[1], o[2], o[3]);
}

__global__ void ep_combine_kernel(ep_call c) {
  const int64_t vecs = c.hidden / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= c.tokens * vecs) return;
  const int64_t t = i / vecs, v = i % vecs;
  const uint4* ret = static_cast<const uint4*>(c.ret);
  float acc[8] = {};
  for (int q = 0; q < c.ranks; ++q) {
    const int32_t pos = c.sent[q * c.tokens + t];
    if (pos >= 0) add_bf16x8(acc, ret[(q * c.capacity + pos) * vecs + v]);
  }
  static_cast<uint4*>(c.out)[i] = to_bf16x8(acc);
}

__global__ void sum_partials_kernel(partial_sum s) {
  const int64_t vecs = s.elements / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= vecs) return;
  const uint4* p = static_cast<const uint4*>(s.partials);
  float acc[8] = {};
  for (int r = 0; r < s.ranks; ++r) add_bf16x8(acc, p[r * vecs + i]);
  static_cast<uint4*>(s.out)[i] = to_bf16x8(acc);
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void ep_plan(const ep_call& c, void* stream) {
  ep_plan_kernel<<<1, kPlanThreads, 0, static_cast<cudaStream_t>(stream)>>>(c);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void ep_pack(const ep_call& c, void* stream) {
  if (c.ranks * c.capacity == 0) return;
  ep_pack_kernel<<<static_cast<unsigned>(c.ranks * c.capacity), kPackThreads, 0, static_cast<cudaStream_t>(stream)>>>(c);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void ep_combine(const ep_call& c, void* stream) {
  const int64_t n = c.tokens * (c.hidden / 8);
  if (n == 0) return;
  ep_combine_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(c);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void sum_partials(const partial_sum& s, void* stream) {
  const int64_t n = s.elements / 8;
  if (n == 0) return;
  sum_partials_kernel<<<blocks_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(s);
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

void copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
}

void synchronize(void* stream) { MXMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

uint32_t read_flags(const uint32_t* flags) {
  uint32_t v = 0;
  MXMOE_CUDA_CHECK(cudaMemcpy(&v, flags, 4, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace mxmoe::parallel::cuda_ops
