// `mxmoe run --ep P | --tp P`: one MoE layer split over P ranks (include/mxmoe/parallel.h),
// verified against the whole layer's reference like run_verified (cli_common.h).
#pragma once

#include <string>

#include "cli_common.h"

namespace mxmoe::cli {

struct parallel_request {
  int ep = 1, tp = 1;  // ranks of expert / tensor parallelism (one of them > 1)
};

struct parallel_outcome {
  verified_run run;         // out: the whole [T, H] output, f32
  std::string description;  // "EP over 2 ranks (in-process group, cuda), 8 tokens per rank"
  bool primary = true;      // false on ranks != 0 of a launch: they leave --output to rank 0
};

// The P ranks run in this process over the in-process group (threads; cpu or one GPU) unless the
// process was launched as one of P (WORLD_SIZE = P, scripts/launch.sh): then it is that rank of an
// NCCL group (cuda only) and gathers the other ranks' outputs to verify the whole call.
// EP: rank r holds the contiguous experts of layout::even_split{E, P} and the r-th T/P tokens
// (T must be a multiple of P); TP: every rank the whole call and shard {r, P} of I.
parallel_outcome run_verified_parallel(const moe_weights& weights, const moe_config& cfg,
                                       const synthetic::layer_inputs& in, device_kind backend,
                                       std::optional<cpu::precision> reference, const parallel_request& request);

}  // namespace mxmoe::cli
