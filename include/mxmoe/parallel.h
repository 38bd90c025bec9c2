// mxmoe/parallel.h — one MoE layer over P ranks: expert parallelism (EP: each rank holds some
// experts whole, tokens travel to them) and tensor parallelism (TP: each rank holds a shard of
// every expert along I), over a small communicator interface with two implementations: NCCL
// (one process per GPU, loaded at run time) and an in-process group of P ranks (threads, plain
// copies) that tests and `mxmoe run --ep/--tp` use without NCCL. A floor above forward.h; the
// placement and the cuts of the weights are shard.h's. docs/parallel.md explains the data flow,
// the launcher (scripts/launch.sh) and how to run across hosts.
//
//   auto comm = parallel::nccl_from_environment();          // RANK, WORLD_SIZE, MXMOE_NCCL_ID_FILE
//   auto owners = contiguous_owners(E, comm->size());
//   owned_weights mine = select_experts(full, cfg, expert_map_of(owners, comm->rank()));
//   parallel::ep_layer ep(mine.weights(), cfg, *comm, {.owners = owners, .max_tokens = T});
//   ep.forward(x, routing, out, stream);                    // this rank's tokens in, their output out
//
// Collective calls: every rank of a group calls forward() with the same T, in the same order.
// A layer runs one forward at a time (it owns its buffers).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/forward.h"
#include "mxmoe/moe.h"
#include "mxmoe/shard.h"

namespace mxmoe::parallel {

// ---- communicator ------------------------------------------------------------------------

// The collectives EP and TP need. Buffers live on device(): host memory for a cpu group, device
// memory of the current GPU for cuda. A cuda communicator's calls are ordered on `stream` (a
// cudaStream_t; nullptr: the default stream); a cpu one returns when the data has arrived.
class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual device_kind device() const = 0;
  virtual std::string name() const = 0;  // "nccl 2.28.9", "in-process group on the host"
  // Rank r's bytes [q * bytes, (q + 1) * bytes) of `send` arrive at rank q's `recv` at r * bytes,
  // for every rank q, r itself included.
  struct exchange {
    const void* send;
    void* recv;
    size_t bytes;  // per peer
  };
  // Every exchange of `parts` in one step (one NCCL group: one launch for all of them).
  virtual void all_to_all(const std::vector<exchange>& parts, void* stream) = 0;
  // recv [r * bytes, (r + 1) * bytes) = rank r's `send` (bytes), for every rank r.
  virtual void all_gather(const void* send, void* recv, size_t bytes, void* stream) = 0;
};

// P ranks in one process: element r is rank r. Each rank is driven by its own thread; a collective
// waits for all P ranks, copies (memcpy on the host; for device_kind::cuda, device-to-device on the
// current GPU after synchronizing the caller's stream — a test stand-in, not capturable), then
// waits again. The group's state lives while any of its communicators does.
std::vector<std::unique_ptr<communicator>> make_local_group(int ranks, device_kind device);
// Runs fn(r) for r in [0, ranks) on a thread each (threads start on CUDA device 0), joins them
// all, then rethrows the exception of the lowest rank that threw.
void run_ranks(int ranks, const std::function<void(int)>& fn);

// ---- NCCL (libnccl.so.2 loaded with dlopen: no link-time dependency) ---------------------------

// True when NCCL can be loaded: $MXMOE_NCCL_LIBRARY, else "libnccl.so.2" through the dynamic
// loader's search path. `why`: the reason when not (a CPU-only build, dlopen's message).
bool nccl_available(std::string* why = nullptr);

struct nccl_unique_id {
  std::array<char, 128> bytes{};  // ncclUniqueId
};
// ncclGetUniqueId. Throws mxmoe::unsupported when NCCL is unavailable (the reason).
nccl_unique_id nccl_new_unique_id();

// A communicator of `ranks` ranks over NCCL on the current device (ncclCommInitRank; every rank
// calls it with the same id). NCCL_NVLS_ENABLE is set to 0, when unset, before NCCL is first
// loaded: mxmoe never asks for NVLink multicast. Throws mxmoe::unsupported when NCCL is unavailable, std::runtime_error with
// NCCL's message when it fails.
std::unique_ptr<communicator> nccl_communicator(const nccl_unique_id& id, int rank, int ranks);

// Where a process stands in a launch (scripts/launch.sh, or any launcher setting these):
// RANK, WORLD_SIZE, LOCAL_RANK, MXMOE_NCCL_ID_FILE.
struct launch_info {
  bool launched = false;  // WORLD_SIZE is set
  int rank = 0, ranks = 1, local_rank = 0;
  std::string id_file;
};
// Throws mxmoe::invalid_argument naming the variable when a value is malformed.
launch_info launch_info_from_environment();

// The NCCL communicator of a launched process: selects the GPU (LOCAL_RANK among the visible
// ones, device 0 when the launcher left one visible), rank 0 writes a new unique id to the id
// file (a temporary then a rename), the others wait for it (up to $MXMOE_NCCL_TIMEOUT seconds,
// default 120), then nccl_communicator. Throws mxmoe::invalid_argument when not launched.
std::unique_ptr<communicator> nccl_from_environment();

// ---- expert parallelism -------------------------------------------------------------------

// ep_layer::read_error_flags bits.
inline constexpr uint32_t kBadExpertFlag = 1u;  // an expert id outside [0, E) was dropped
inline constexpr uint32_t kOverflowFlag = 2u;   // a token exceeded a peer's capacity

struct ep_options {
  std::vector<int32_t> owners;  // [E]: each expert's rank; empty: contiguous_owners(E, P)
  int64_t max_tokens = 0;       // the largest T of a call (buffers are sized for it), >= 1
  // Tokens a rank sends one peer per call at most (fixed-size exchanges: no host synchronization);
  // 0: T, which never drops anything. A token past it loses its slots on that peer (they
  // contribute 0) and sets bit 1 of read_error_flags().
  int64_t capacity = 0;
};

// Each call: this rank routes its T tokens over all E experts; sends each token once to every
// rank that owns one of its experts (its row of x, its k global ids and weights), in token order,
// into a fixed segment of capacity(T) rows per peer; runs its experts on the P * capacity(T) rows
// it received (the expert map drops the slots owned elsewhere; unused rows carry an expert held
// elsewhere and cost no GEMM work); sends each row's result back; and sums, per token, the results
// of the ranks it went to in rank order (f32, one rounding to the output type). Identical calls
// give identical bits; the result is the one-GPU layer's within the rounding of each rank's
// partial sum (bf16 on cuda).
class ep_layer {
 public:
  // weights: this rank's experts (select_experts with expert_map_of(owners, rank)), router
  // tensors [E]; cfg: the whole layer's. Prepared on comm.device().
  ep_layer(const moe_weights& weights, const moe_config& cfg, communicator& comm, const ep_options& options);
  ~ep_layer();
  ep_layer(const ep_layer&) = delete;
  ep_layer& operator=(const ep_layer&) = delete;

  const moe_config& config() const;
  int64_t capacity(int64_t tokens) const;  // rows per peer of a call of T tokens
  // Bytes per peer the two exchanges of a call of T tokens move (dispatch, then return).
  size_t dispatch_bytes(int64_t tokens) const;
  size_t return_bytes(int64_t tokens) const;

  // x [T, H], routing (moe.h: logits or ids + weights; cpu also the router weights), out [T, H],
  // on comm.device(): cpu x bf16 | f32 and out f32 | bf16 (every rank the same dtypes); cuda x
  // and out bf16 with device logits or ids + weights. T <= max_tokens, the same on every rank.
  // cuda: no host synchronization beyond NCCL's own; capturable in a CUDA graph with NCCL.
  void forward(const tensor_view& x, const routing_input& routing, const tensor_view& out, void* stream = nullptr);
  // Of the last forward with tokens (synchronizes): bit 0 an expert id outside [0, E) was dropped
  // (here or in a token this rank received), bit 1 a token exceeded the capacity of a peer.
  uint32_t read_error_flags() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// ---- tensor parallelism -------------------------------------------------------------------

// Each rank holds shard {rank, P} along I (shard.h) of every expert, runs the whole call on it
// (the same x and routing on every rank), and the partial outputs are gathered and summed in rank
// order (f32, one rounding): every rank ends with the same bits, the one-GPU layer's within the
// rounding of each partial (bf16 on cuda).
struct tp_options {
  int64_t max_tokens = 0;  // the largest T of a call (buffers are sized for it), >= 1
  // false: the weights are the whole layer in host memory (MXFP4), cut here into this rank's
  // shard. true: they are this rank's shard already (shard_weights(weights, cfg, {rank, P}), in
  // host or device memory: what a loader reading only its part holds).
  bool sharded = false;
};

class tp_layer {
 public:
  // cfg: the whole layer's (I); the shard's I_r is shard_intermediate(I, {rank, P}).
  tp_layer(const moe_weights& weights, const moe_config& cfg, communicator& comm, const tp_options& options);
  ~tp_layer();
  tp_layer(const tp_layer&) = delete;
  tp_layer& operator=(const tp_layer&) = delete;

  const moe_config& config() const;        // the whole layer's
  const prepared_moe& shard() const;       // this rank's shard (config().shape.intermediate = I_r)
  size_t gather_bytes(int64_t tokens) const;  // bytes each rank contributes to the gather

  // As ep_layer::forward, with the same x and routing on every rank.
  void forward(const tensor_view& x, const routing_input& routing, const tensor_view& out, void* stream = nullptr);
  uint32_t read_error_flags() const;  // the shard's (prepared_moe::read_error_flags)

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace mxmoe::parallel
