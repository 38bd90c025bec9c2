// PLACEHOLDER — the MoE benchmark (issue 4).
#include <cstdio>
#include "moe_bench.h"
namespace mxmoe::bench {
int run_moe_bench(const moe_bench_options&) { std::fprintf(stderr, "not yet\n"); return 3; }
}  // namespace mxmoe::bench
