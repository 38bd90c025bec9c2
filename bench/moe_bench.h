// The MoE layer benchmark, callable from `mxmoe bench` and bench_moe. See moe_bench.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mxmoe::bench {

struct moe_bench_options {
  std::vector<std::string> shapes{"gpt-oss-120b", "qwen3-30b-a3b", "kimi-k2"};
  std::vector<int64_t> tokens{1, 8, 32, 64, 128, 512, 2048, 8192, 16384};
  int iters = 30;                 // timed graph replays per point (median reported)
  std::string json_out;           // write the results JSON here ("" = don't)
  std::string torch_json;         // torch BF16 baseline measured in this run (bench/torch_baseline.py)
  std::string peer_json;          // the peer measured in this run (bench/peer_triton.py)
  std::string commit = "unknown";
};

// Runs the benchmark, prints the table; returns a process exit code.
int run_moe_bench(const moe_bench_options& opt);

}  // namespace mxmoe::bench
