// The MoE layer benchmark, callable from `mxmoe bench` and bench_moe. See moe_bench.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mxmoe/cuda.h"

namespace mxmoe::bench {

struct moe_bench_options {
  std::vector<std::string> shapes{"gpt-oss-120b", "qwen3-30b-a3b", "kimi-k2"};
  std::vector<int64_t> tokens{1, 8, 32, 64, 128, 512, 2048, 8192, 16384};
  int iters = 30;                 // timed graph replays per point (median reported)
  std::string json_out;           // write the results JSON here ("" = don't)
  std::string torch_json;         // torch BF16 baseline measured in this run (bench/torch_baseline.py)
  std::string peer_json;          // the peer measured in this run (bench/peer_triton.py)
  std::string commit = "unknown";
  // The L2 flush before each timed replay: "dirty", a 256 MiB memset (the L2 full of dirty lines,
  // which the forward writes back as it evicts them, as after a kernel that wrote), or "clean", a
  // 256 MiB read (clean lines only: no write-back inside the timing).
  std::string l2_flush = "dirty";
  // > 1: the layer over P ranks of an NCCL group, one process per GPU launched by
  // scripts/launch.sh (moe_bench_parallel.cu): expert or tensor parallelism.
  int ep = 1, tp = 1;
};

// Runs the benchmark, prints the table; returns a process exit code. With ep or tp > 1 it runs
// run_moe_bench_parallel.
int run_moe_bench(const moe_bench_options& opt);
int run_moe_bench_parallel(const moe_bench_options& opt);

// Shared by moe_bench.cu and moe_bench_parallel.cu (CUDA builds only).
void random_device_bytes(cuda::device_buffer& b, uint64_t seed, int lo, int span);  // splitmix64 bytes in [lo, lo + span)
double median(std::vector<double> v);
double measure_copy_tbps();  // device copy bandwidth, bytes read + written, TB/s

// The four checkpoint-layout MXFP4 expert tensors of `held` (E, H, I of what one GPU holds) drawn
// on the device with the synthetic recipe (include/mxmoe/synthetic.h): random codes, scale bytes
// around synthetic::scale_centre(K), K = H for GEMM1 and `down_scale_k` for GEMM2 (the whole
// layer's I also for a tensor-parallel shard, so that its partial has its share). Seeds seed .. seed + 3.
struct device_expert_weights {
  device_expert_weights(const moe_shape& held, int64_t down_scale_k, uint64_t seed);
  void bind(moe_weights& w) const;  // points w's four expert tensors here
  moe_shape shape;
  cuda::device_buffer gate_up_blocks, gate_up_scales, down_blocks, down_scales;
};

}  // namespace mxmoe::bench
