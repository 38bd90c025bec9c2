// `mxmoe bench` in a build without CUDA.
#include <cstdio>

#include "moe_bench.h"

namespace mxmoe::bench {
int run_moe_bench(const moe_bench_options&) {
  std::fprintf(stderr, "mxmoe bench: this build has no CUDA backend (no nvcc at configure time)\n");
  return 3;
}
}  // namespace mxmoe::bench
