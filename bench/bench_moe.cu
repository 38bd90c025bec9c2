// bench_moe — command-line front of the MoE layer benchmark (moe_bench.cu).
//   bench_moe [--shapes a,b] [--tokens 1,8,...] [--iters N] [--json PATH] [--torch-json PATH] [--peer-json PATH]
//             [--commit SHA] [--ep P | --tp P] [--l2-flush dirty|clean]
// --ep / --tp: the layer over P GPUs, one process each: scripts/launch.sh -n P -- bench_moe --ep P ...
#include <cstdio>
#include <cstdlib>
#include <exception>
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

int run(int argc, char** argv) {
  mxmoe::bench::moe_bench_options opt;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const bool known = !std::strcmp(a, "--shapes") || !std::strcmp(a, "--tokens") || !std::strcmp(a, "--iters") ||
                       !std::strcmp(a, "--json") || !std::strcmp(a, "--torch-json") || !std::strcmp(a, "--peer-json") ||
                       !std::strcmp(a, "--commit") || !std::strcmp(a, "--ep") || !std::strcmp(a, "--tp") ||
                       !std::strcmp(a, "--l2-flush");
    if (!known) {
      std::fprintf(stderr,
                   "usage: bench_moe [--shapes gpt-oss-120b,qwen3-30b-a3b,kimi-k2] [--tokens 1,8,32,...] "
                   "[--iters 30] [--json PATH] [--torch-json PATH] [--peer-json PATH] [--commit SHA] [--ep P | --tp P] "
                   "[--l2-flush dirty|clean]\n");
      return std::strcmp(a, "--help") ? 2 : 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_moe: %s needs a value\n", a);
      return 2;
    }
    const char* v = argv[++i];
    if (!std::strcmp(a, "--shapes")) {
      opt.shapes.clear();
      split(v, [&](const std::string& s) { opt.shapes.push_back(s); });
    } else if (!std::strcmp(a, "--tokens")) {
      opt.tokens.clear();
      split(v, [&](const std::string& s) { opt.tokens.push_back(std::stoll(s)); });
    } else if (!std::strcmp(a, "--iters")) {
      opt.iters = std::atoi(v);
    } else if (!std::strcmp(a, "--json")) {
      opt.json_out = v;
    } else if (!std::strcmp(a, "--torch-json")) {
      opt.torch_json = v;
    } else if (!std::strcmp(a, "--peer-json")) {
      opt.peer_json = v;
    } else if (!std::strcmp(a, "--ep")) {
      opt.ep = std::atoi(v);
    } else if (!std::strcmp(a, "--tp")) {
      opt.tp = std::atoi(v);
    } else if (!std::strcmp(a, "--l2-flush")) {
      if (std::strcmp(v, "dirty") && std::strcmp(v, "clean")) {
        std::fprintf(stderr, "bench_moe: --l2-flush: expected 'dirty' or 'clean', got '%s'\n", v);
        return 2;
      }
      opt.l2_flush = v;
    } else {
      opt.commit = v;
    }
  }
  return mxmoe::bench::run_moe_bench(opt);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe: %s\n", e.what());
    return 4;
  }
}
