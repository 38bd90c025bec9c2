// mxmoe/shard.h — how one MoE layer is split over P ranks (docs/parallel.md): which experts a rank
// holds (expert parallelism, EP) and which part of every expert's intermediate dimension I
// (tensor parallelism, TP), and the host-side cuts of a layer's checkpoint-layout weights.
//
//   EP  rank r holds some experts whole; expert_map (moe.h) says which. Routing still runs over
//       all E experts; a slot routed elsewhere contributes nothing on r. The contiguous placement
//       gives rank r the experts layout::even_split{E, P} puts in part r.
//   TP  rank r holds, of every expert, the I/32 blocks layout::even_split{I/32, P} puts in part r:
//       I_r = 32 * blocks_r (2880 over 8 ranks: 12, 12, 11, 11, 11, 11, 11, 11 blocks). GEMM1's
//       gate and up rows of those outputs, GEMM2's K columns of those blocks, the gate_up bias of
//       those rows; the down bias on rank 0 only. Each shard is an ordinary layer (I_r a multiple of
//       32); the sum of the shards' outputs is the layer's output.
#pragma once

#include <cstdint>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"

namespace mxmoe {

// Rank `rank` of `ranks` along I.
struct tp_shard {
  int rank = 0, ranks = 1;
};

// The first intermediate index of shard `s` and its size I_r, for a layer of I = `intermediate`
// (a multiple of 32). Throws mxmoe::invalid_argument unless 1 <= ranks <= I/32 (every rank holds
// at least one block) and 0 <= rank < ranks.
int64_t shard_begin(int64_t intermediate, const tp_shard& s);
int64_t shard_intermediate(int64_t intermediate, const tp_shard& s);

// Each expert's rank under the contiguous placement: layout::even_split{experts, ranks}.
// Throws unless 1 <= ranks <= experts.
std::vector<int32_t> contiguous_owners(int64_t experts, int ranks);
// The expert map (moe.h) of rank `rank` given each expert's rank (`owners`, values in [0, ranks)):
// local indices in expert order. Throws when rank holds no expert.
std::vector<int32_t> expert_map_of(const std::vector<int32_t>& owners, int rank);

// A tensor owning its bytes (host memory); absent when it has no shape.
struct owned_tensor {
  std::vector<uint8_t> bytes;
  dtype type = dtype::u8;
  std::vector<int64_t> shape;
  tensor_view view() const;  // absent view for an absent tensor
  static owned_tensor copy_of(const tensor_view& host);  // absent stays absent
};

// A layer's weights owning their bytes: what the cuts below return.
struct owned_weights {
  moe_config cfg;  // the cut's configuration (a TP shard: I = I_r)
  weight_format format = weight_format::mxfp4;
  owned_tensor gate_up_blocks, gate_up_scales, down_blocks, down_scales, gate_up, down;
  owned_tensor gate_up_bias, down_bias, router_weight, router_bias, correction_bias;
  moe_weights weights() const;  // views of the bytes above; valid while this lives
};

// The experts `expert_map` holds, out of weights holding all E experts (host memory, MXFP4 or
// bf16): expert tensors and biases [E_held, ...] in local-index order; router tensors copied whole.
owned_weights select_experts(const moe_weights& weights, const moe_config& cfg, const std::vector<int32_t>& expert_map);

// Shard `s` along I of MXFP4 weights in host memory that hold the experts of `expert_map` (empty:
// all; see the file header for what a shard holds). Throws mxmoe::invalid_argument for bf16 or
// device weights and for a shard that does not fit (shard_begin).
owned_weights shard_weights(const moe_weights& weights, const moe_config& cfg, const tp_shard& s,
                            const std::vector<int32_t>& expert_map = {});

}  // namespace mxmoe
