// `mxmoe bench`: the MoE layer benchmark (bench/moe_bench.h), the same code as bench_moe.
#include <memory>

#include "cli_common.h"
#include "moe_bench.h"

namespace mxmoe::cli {

command add_bench_command(CLI::App& root) {
  auto opt = std::make_shared<bench::moe_bench_options>();
  CLI::App* cmd = root.add_subcommand("bench", "Benchmark the MoE layer on the GPU (needs an sm_90 GPU)");
  set_details(cmd,
      "Times the MXFP4 MoE layer (CUDA-graph replay, median of --iters) for each shape and token count and prints "
      "µs, GB/s, TFLOP/s and the fraction of the memory/compute floor measured in the same run. Needs a CUDA build "
      "and an sm_90 GPU (exit code 3 otherwise).\n\n"
      "Examples:\n  mxmoe bench\n  mxmoe bench --shapes gpt-oss-120b --tokens 1,8,128 --json bench.json\n"
      "  mxmoe bench --torch-json torch_baseline.json --peer-json peer.json --json bench.json");
  cmd->add_option("--shapes", opt->shapes, "model presets to benchmark")->delimiter(',');
  cmd->add_option("--tokens", opt->tokens, "token counts")->delimiter(',')->check(integer_in(1, int64_t{1} << 20));
  cmd->add_option("--iters", opt->iters, "timed replays per point (median reported)")->check(integer_in(1, 100000));
  cmd->add_option("--json", opt->json_out, "write the results as JSON to this file")->check(output_path());
  cmd->add_option("--torch-json", opt->torch_json, "torch BF16 baseline results (bench/torch_baseline.py) to compare with")
      ->check(existing_file());
  cmd->add_option("--peer-json", opt->peer_json,
                  "the peer's results (bench/peer_triton.py: triton_kernels matmul_ogs as vLLM 0.33.0 runs it) to compare with")
      ->check(existing_file());
  cmd->add_option("--commit", opt->commit, "commit id recorded in the JSON");
  cmd->add_option("--ep", opt->ep, "expert parallelism over P GPUs, one process each (scripts/launch.sh -n P)")
      ->check(integer_in(1, 512));
  cmd->add_option("--tp", opt->tp, "tensor parallelism over P GPUs, one process each (scripts/launch.sh -n P)")
      ->check(integer_in(1, 512));
  return {cmd, [opt] { return bench::run_moe_bench(*opt); }};
}

}  // namespace mxmoe::cli
