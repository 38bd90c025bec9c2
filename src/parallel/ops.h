// Internal steps of the parallel layers (include/mxmoe/parallel.h) and the one definition of the
// expert-parallel dispatch that both implementations follow: the host one (ops_cpu.cpp, what the
// CPU tests check) and the device one (kernels.cu).
//
// Dispatch of one call (T tokens, k slots, P ranks, C = capacity rows per peer):
//   sends(t, q)   token t goes to rank q: one of its ids is in [0, E) and owned by q
//   position      sent[q, t] = #{t' < t : sends(t', q)} when < C, else -1 (overflow, bit 1);
//                 slot_token[q, pos] = t; rows past rank q's count: -1
//   send row      send_x[q, pos] = x[t], send_ids[q, pos, :] = ids[t, :], send_w[q, pos, :] =
//                 weights[t, :]; an unused row gets ids pad_id[q] (an expert q does not own: its
//                 slots are dropped there at no GEMM cost) and weights 0
//   receive       row (source s, pos) = s * C + pos of recv_x [P * C, H]: the rank's layer runs
//                 on all P * C rows, its expert map dropping the slots owned elsewhere
//   combine       out[t] = sum over q = 0 .. P-1 with sent[q, t] >= 0 of ret[q, sent[q, t]]
//                 (ret: what rank q computed for that row), in f32, rounded once
// An expert id outside [0, E) goes nowhere and sets bit 0 (the receiver's layer flags it too when
// the token goes to a rank for another slot).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mxmoe/dtype.h"
#include "mxmoe/hd.h"
#include "mxmoe/parallel.h"

namespace mxmoe::parallel {

MXMOE_HD bool ep_sends(const int32_t* ids_of_token, int top_k, int64_t experts, const int32_t* owners, int q) {
  for (int j = 0; j < top_k; ++j) {
    const int32_t e = ids_of_token[j];
    if (e >= 0 && e < experts && owners[e] == q) return true;
  }
  return false;
}

MXMOE_HD bool ep_bad_id(const int32_t* ids_of_token, int top_k, int64_t experts) {
  for (int j = 0; j < top_k; ++j)
    if (ids_of_token[j] < 0 || ids_of_token[j] >= experts) return true;
  return false;
}

// Pointers of one expert-parallel call, on the host (cpu) or the current GPU (cuda).
struct ep_call {
  int ranks = 1, top_k = 1;
  int64_t tokens = 0, capacity = 0, hidden = 0, experts = 0;
  const int32_t* owners = nullptr;   // [E]
  const int32_t* pad_ids = nullptr;  // [P]
  const int32_t* ids = nullptr;      // [T, k] this rank's routing
  const float* weights = nullptr;    // [T, k]
  const void* x = nullptr;           // [T, H], x_type
  dtype x_type = dtype::bf16;
  int32_t* sent = nullptr;        // [P, T]
  int32_t* slot_token = nullptr;  // [P, C]
  uint32_t* flags = nullptr;      // [1]
  void* send_x = nullptr;         // [P, C, H], x_type
  int32_t* send_ids = nullptr;    // [P, C, k]
  float* send_w = nullptr;        // [P, C, k]
  const void* ret = nullptr;      // [P, C, H], ret_type: the rows' results, back from their ranks
  dtype ret_type = dtype::bf16;
  void* out = nullptr;            // [T, H], out_type
  dtype out_type = dtype::bf16;
};

// out[i] = sum over r in rank order of partials[r * n + i] (f32), rounded once: the TP reduction.
struct partial_sum {
  int ranks = 1;
  int64_t elements = 0;
  const void* partials = nullptr;  // [P, n], type
  dtype type = dtype::bf16;
  void* out = nullptr;             // [n], out_type
  dtype out_type = dtype::bf16;
};

namespace cpu_ops {
void ep_plan(const ep_call& c);     // sent, slot_token, flags
void ep_pack(const ep_call& c);     // send_x, send_ids, send_w
void ep_combine(const ep_call& c);  // out
void sum_partials(const partial_sum& s);
}  // namespace cpu_ops

// The same on the current GPU, ordered on `stream` (kernels.cu; a CPU-only build throws
// mxmoe::unsupported). cuda: x, send_x, ret and out are bf16.
namespace cuda_ops {
void ep_plan(const ep_call& c, void* stream);
void ep_pack(const ep_call& c, void* stream);
void ep_combine(const ep_call& c, void* stream);
void sum_partials(const partial_sum& s, void* stream);
void copy(void* dst, const void* src, size_t bytes, void* stream);  // device to device
void synchronize(void* stream);
uint32_t read_flags(const uint32_t* flags);  // synchronizes
}  // namespace cuda_ops

}  // namespace mxmoe::parallel
