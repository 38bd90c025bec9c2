// mxmoe/validate.h — argument checks shared by every MoE backend (CPU reference, CUDA layer,
// dispatch). Each check throws mxmoe::invalid_argument naming the argument and what was
// expected, before the caller writes anything.
//
// Optional views: a view is *absent* when it is default-constructed (no data and no shape).
// A view that carries a shape but a null pointer is a caller bug and is rejected ("non-null
// data") whenever it holds at least one element, so that after validation `empty()` and
// "absent" mean the same thing.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"

namespace mxmoe {

// True for a default-constructed view (no data, no shape): an optional argument not given.
inline bool is_absent(const tensor_view& v) { return v.data == nullptr && v.shape.empty(); }

// `v` must have one of `types`, exactly `shape`, contiguous strides, and non-null data when it
// holds any element. `name` is what the error message calls it ("weights.gate_up_bias", "routing.ids").
void check_tensor(const tensor_view& v, const char* name, std::initializer_list<dtype> types,
                  const std::vector<int64_t>& shape);

// The routing part of validate(moe_config) for `experts` experts (in [1, 512]); `prefix` names
// the struct in messages ("cfg.routing" -> "cfg.routing.top_k").
void validate_routing_config(const routing_config& r, int64_t experts, const char* prefix);

// Where the routing of a call comes from (after validate_routing_input has passed).
enum class routing_source : uint8_t {
  logits,          // routing.logits given
  precomputed,     // routing.ids and routing.weights given
  router_weights,  // nothing given: logits = x·Wrᵀ + br from the weights' router tensors
};
routing_source routing_source_of(const routing_input& r);

// routing: either logits f32 | bf16 [tokens, E]; or ids i32 [tokens, k] with weights f32
// [tokens, k] (same device); or nothing (the caller then needs router weights and checks them).
// Values are checked only in host memory (device == cpu): ids in [0, E), weights finite. Device
// ids and weights are not range-checked on the host.
void validate_routing_input(const routing_input& routing, const moe_config& cfg, int64_t tokens);

// An expert map (moe.h) for `experts` experts: empty, or `experts` entries of -1 or a local index,
// the local indices 0 .. n - 1 each exactly once, n >= 1. Returns n, the experts held (`experts`
// for an empty map).
int64_t validate_expert_map(const std::vector<int32_t>& expert_map, int64_t experts);

// x bf16 | f32 [T, H], out f32 | bf16 [T, H] (same T, same device), contiguous.
void validate_moe_io(const tensor_view& x, const tensor_view& out, const moe_config& cfg);

}  // namespace mxmoe
