// make_checkpoint: writes a synthetic BF16 checkpoint in the gpt-oss layout (experts.gate_up_proj
// [E, H, 2I], experts.down_proj [E, I, H], biases and router per layer) for measuring the
// conversion (scripts/bench_convert.sh). Streams one expert at a time, so a checkpoint of any
// size needs about one expert's memory.
//
//   make_checkpoint OUT [--layers L] [--experts E] [--hidden H] [--intermediate I] [--size-gb G]
// --size-gb picks the number of layers for about G GB of expert weights (at least one layer).
// Default shape: gpt-oss's (E = 32, H = I = 2880).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "mxmoe/safetensors.h"

using namespace mxmoe;

namespace {

// Bits of a bf16 value with a roughly normal magnitude spread (2^-9 .. 2^2), from a counter hash:
// cheap enough to write gigabytes, varied enough to give the quantizer ordinary work.
uint16_t value(uint64_t i) {
  uint64_t x = i * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  const uint32_t exp = 118 + static_cast<uint32_t>((x >> 40) % 11);
  return static_cast<uint16_t>(((x & 1) << 15) | (exp << 7) | ((x >> 8) & 0x7f));
}

void fill(std::vector<uint16_t>& v, uint64_t salt) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(salt + i);
}

int usage(const char* why) {
  std::fprintf(stderr, "make_checkpoint: %s\nusage: make_checkpoint OUT [--layers L] [--experts E] [--hidden H] "
               "[--intermediate I] [--size-gb G]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return usage("OUT is required");
  const std::string out = argv[1];
  int64_t layers = 4, E = 32, H = 2880, I = 2880;
  double size_gb = 0;
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) return usage((std::string(argv[i]) + " needs a value").c_str());
    const std::string k = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (v <= 0) return usage((k + ": expected a positive number").c_str());
    if (k == "--layers") layers = static_cast<int64_t>(v);
    else if (k == "--experts") E = static_cast<int64_t>(v);
    else if (k == "--hidden") H = static_cast<int64_t>(v);
    else if (k == "--intermediate") I = static_cast<int64_t>(v);
    else if (k == "--size-gb") size_gb = v;
    else return usage(("unknown option " + k).c_str());
  }
  const double layer_bytes = 2.0 * static_cast<double>(E) * 3 * static_cast<double>(H * I);
  if (size_gb > 0) layers = std::max<int64_t>(1, std::llround(size_gb * 1e9 / layer_bytes));
  try {
    std::vector<tensor_decl> decls;
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      decls.push_back({p + "router.weight", dtype::bf16, {E, H}});
      decls.push_back({p + "router.bias", dtype::bf16, {E}});
      decls.push_back({p + "experts.gate_up_proj", dtype::bf16, {E, H, 2 * I}});
      decls.push_back({p + "experts.gate_up_proj_bias", dtype::bf16, {E, 2 * I}});
      decls.push_back({p + "experts.down_proj", dtype::bf16, {E, I, H}});
      decls.push_back({p + "experts.down_proj_bias", dtype::bf16, {E, H}});
    }
    safetensors_writer w(out, decls, {{"format", "pt"}, {"source", "mxmoe bench/make_checkpoint"}}, true);
    std::vector<uint16_t> gate_up(static_cast<size_t>(H * 2 * I)), down(static_cast<size_t>(I * H));
    std::vector<uint16_t> router(static_cast<size_t>(E * H)), small(static_cast<size_t>(E * 2 * I));
    uint64_t salt = 1;
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
      fill(router, salt += router.size());
      w.write(p + "router.weight", router.data(), router.size() * 2);
      w.write(p + "router.bias", router.data(), static_cast<size_t>(E) * 2);
      fill(small, salt += small.size());
      w.write(p + "experts.gate_up_proj_bias", small.data(), small.size() * 2);
      w.write(p + "experts.down_proj_bias", small.data(), static_cast<size_t>(E * H) * 2);
      for (int64_t e = 0; e < E; ++e) {
        fill(gate_up, salt += gate_up.size());
        w.write(p + "experts.gate_up_proj", gate_up.data(), gate_up.size() * 2, static_cast<uint64_t>(e) * gate_up.size() * 2);
        fill(down, salt += down.size());
        w.write(p + "experts.down_proj", down.data(), down.size() * 2, static_cast<uint64_t>(e) * down.size() * 2);
      }
    }
    w.commit();
    std::printf("%s: %lld layers, E=%lld H=%lld I=%lld, %.2f GB of expert weights\n", out.c_str(),
                static_cast<long long>(layers), static_cast<long long>(E), static_cast<long long>(H),
                static_cast<long long>(I), layer_bytes * static_cast<double>(layers) / 1e9);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
