// The steps of the parallel layers on the host (ops.h defines what each computes): the CPU path of
// ep_layer / tp_layer, and what the CPU tests check the dispatch bookkeeping with.
#include <algorithm>
#include <cstring>

#include "mxmoe/dtype.h"
#include "ops.h"

namespace mxmoe::parallel::cpu_ops {
namespace {

void store(void* out, dtype type, int64_t i, float v) {
  if (type == dtype::f32) static_cast<float*>(out)[i] = v;
  else static_cast<uint16_t*>(out)[i] = float_to_bf16(v);
}

}  // namespace

void ep_plan(const ep_call& c) {
  uint32_t flags = 0;
  std::fill_n(c.slot_token, c.ranks * c.capacity, -1);
  for (int q = 0; q < c.ranks; ++q) {
    int64_t count = 0;
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int32_t* ids = c.ids + t * c.top_k;
      int32_t& pos = c.sent[q * c.tokens + t];
      pos = -1;
      if (!ep_sends(ids, c.top_k, c.experts, c.owners, q)) continue;
      if (count < c.capacity) {
        pos = static_cast<int32_t>(count);
        c.slot_token[q * c.capacity + count] = static_cast<int32_t>(t);
      } else {
        flags |= kOverflowFlag;
      }
      ++count;
    }
  }
  for (int64_t t = 0; t < c.tokens; ++t)
    if (ep_bad_id(c.ids + t * c.top_k, c.top_k, c.experts)) flags |= kBadExpertFlag;
  *c.flags = flags;
}

void ep_pack(const ep_call& c) {
  const size_t row = static_cast<size_t>(c.hidden * dtype_size(c.x_type));
  for (int q = 0; q < c.ranks; ++q)
    for (int64_t pos = 0; pos < c.capacity; ++pos) {
      const int64_t r = q * c.capacity + pos;
      const int32_t t = c.slot_token[r];
      for (int j = 0; j < c.top_k; ++j) {
        c.send_ids[r * c.top_k + j] = t >= 0 ? c.ids[t * c.top_k + j] : c.pad_ids[q];
        c.send_w[r * c.top_k + j] = t >= 0 ? c.weights[t * c.top_k + j] : 0.0f;
      }
      if (t >= 0)
        std::memcpy(static_cast<uint8_t*>(c.send_x) + r * row, static_cast<const uint8_t*>(c.x) + t * row, row);
      else
        std::memset(static_cast<uint8_t*>(c.send_x) + r * row, 0, row);
    }
}

void ep_combine(const ep_call& c) {
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t n = 0; n < c.hidden; ++n) {
      float acc = 0.0f;
      for (int q = 0; q < c.ranks; ++q) {
        const int32_t pos = c.sent[q * c.tokens + t];
        if (pos >= 0) acc += load_float(c.ret, c.ret_type, (q * c.capacity + pos) * c.hidden + n);
      }
      store(c.out, c.out_type, t * c.hidden + n, acc);
    }
}

void sum_partials(const partial_sum& s) {
  for (int64_t i = 0; i < s.elements; ++i) {
    float acc = 0.0f;
    for (int r = 0; r < s.ranks; ++r) acc += load_float(s.partials, s.type, r * s.elements + i);
    store(s.out, s.out_type, i, acc);
  }
}

}  // namespace mxmoe::parallel::cpu_ops
