// bench_moe — command-line front of the MoE layer benchmark (moe_bench.cu).
//   bench_moe [--shapes a,b] [--tokens 1,8,...] [--iters N] [--json PATH] [--torch-json PATH] [--peer-json PATH]
//             [--commit SHA]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "moe_bench.h"

namespace {
template <class F>
void split(const char* s, F&& add) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) add(item);
}
}  // namespace

int main(int argc, char** argv) {
  mxmoe::bench::moe_bench_options opt;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&] {
      if (!v) {
        std::fprintf(stderr, "bench_moe: %s needs a value\n", a);
        std::exit(2);
      }
      ++i;
      return v;
    };
    if (!std::strcmp(a, "--shapes")) {
      opt.shapes.clear();
      split(need(), [&](const std::string& s) { opt.shapes.push_back(s); });
    } else if (!std::strcmp(a, "--tokens")) {
      opt.tokens.clear();
      split(need(), [&](const std::string& s) { opt.tokens.push_back(std::stoll(s)); });
    } else if (!std::strcmp(a, "--iters")) {
      opt.iters = std::atoi(need());
    } else if (!std::strcmp(a, "--json")) {
      opt.json_out = need();
    } else if (!std::strcmp(a, "--torch-json")) {
      opt.torch_json = need();
    } else if (!std::strcmp(a, "--peer-json")) {
      opt.peer_json = need();
    } else if (!std::strcmp(a, "--commit")) {
      opt.commit = need();
    } else {
      std::fprintf(stderr,
                   "usage: bench_moe [--shapes gpt-oss-120b,qwen3-30b-a3b,kimi-k2] [--tokens 1,8,32,...] "
                   "[--iters 30] [--json PATH] [--torch-json PATH] [--peer-json PATH] [--commit SHA]\n");
      return std::strcmp(a, "--help") ? 2 : 0;
    }
  }
  return mxmoe::bench::run_moe_bench(opt);
}
