// Synthetic checkpoints for the conversion tests (tests/cpu/test_convert.cpp and the cuda
// comparison in tests/gpu/test_gpu_convert.cpp): both MoE layouts (gpt-oss fused x·W tensors and
// Qwen3/DeepSeek per-expert names), every float dtype, two MoE layers with odd shapes and other
// tensors around them. The values come from raw bit patterns of a counter-based hash, so a case
// is the same file on every machine and compiler (no <random> distributions), and they reach
// the quantizer's corners: blocks that saturate, tiny values that flush, zeros, outliers.
// The golden table (convert_golden.h) holds the hashes of what today's converter makes of them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/safetensors.h"

namespace convert_cases {

using namespace mxmoe;

inline uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a, 64 bits: the fingerprint the golden table records.
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

inline uint64_t file_hash(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return fnv1a(bytes.data(), bytes.size());
}

// Hash of every tensor's name and bytes (not the header's metadata).
inline uint64_t tensors_hash(const std::string& path) {
  const safetensors_reader r(path);
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& e : r.entries()) {
    h = fnv1a(e.name.data(), e.name.size(), h);
    const auto b = r.bytes(e);
    h = fnv1a(b.data(), b.size(), h);
  }
  return h;
}

inline uint64_t stats_hash(const quant_stats& s, uint64_t h) {
  const int64_t ints[] = {s.elements, s.blocks, s.saturated_blocks, s.clamped_elements, s.flushed_elements,
                          s.nonfinite_blocks};
  h = fnv1a(ints, sizeof ints, h);
  h = fnv1a(&s.signal_sq, sizeof s.signal_sq, h);
  return fnv1a(&s.error_sq, sizeof s.error_sq, h);
}

inline uint64_t report_hash(const quantize_report& r) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& t : r.tensors) {
    h = fnv1a(t.name.data(), t.name.size(), h);
    h = fnv1a(t.shape.data(), t.shape.size() * sizeof(int64_t), h);
    h = stats_hash(t.stats, h);
  }
  h = stats_hash(r.total, h);
  const uint64_t counts[] = {static_cast<uint64_t>(r.copied_tensors), r.copied_bytes, r.input_bytes, r.output_bytes};
  return fnv1a(counts, sizeof counts, h);
}

// Element `i` of tensor `salt` as raw bits of type t. Most blocks have a common magnitude with
// a spread of 2^6 (some saturate, some flush under the shared scale); every 37th element is an
// outlier and every 29th a zero.
inline uint32_t value_bits(dtype t, uint64_t salt, uint64_t i) {
  const uint64_t r = mix(salt * 0x100000001b3ull + i), block = mix(salt ^ (i / 32) ^ 0x51ed27);
  const int spread = static_cast<int>(r >> 58);          // 0..63 -> 0..5 after the shift below
  int exp = static_cast<int>(block % 9) - 6 - spread / 11;  // 2^-11 .. 2^2
  if (i % 37 == 5) exp += 7;
  const bool zero = i % 29 == 3;
  const uint32_t sign = static_cast<uint32_t>(r & 1);
  switch (t) {
    case dtype::bf16: return zero ? 0u : (sign << 15) | (static_cast<uint32_t>(127 + exp) << 7) | ((r >> 8) & 0x7f);
    case dtype::f16: return zero ? 0u : (sign << 15) | (static_cast<uint32_t>(15 + exp) << 10) | ((r >> 8) & 0x3ff);
    default: return zero ? 0u : (sign << 31) | (static_cast<uint32_t>(127 + exp) << 23) | ((r >> 8) & 0x7fffff);
  }
}

// A tensor of `shape` and type t, filled by value_bits; `nonfinite` puts a NaN and an Inf in it.
struct host_tensor {
  std::string name;
  dtype type;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline host_tensor make_tensor(std::string name, dtype t, std::vector<int64_t> shape, uint64_t salt, bool nonfinite = false) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  host_tensor h{std::move(name), t, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n * dtype_size(t)))};
  const size_t es = static_cast<size_t>(dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = value_bits(t, salt, static_cast<uint64_t>(i));
    std::memcpy(h.bytes.data() + static_cast<size_t>(i) * es, &bits, es);
  }
  if (nonfinite) {
    const uint32_t nan = t == dtype::f32 ? 0x7fc00000u : t == dtype::bf16 ? 0x7fc0u : 0x7e00u;
    const uint32_t inf = t == dtype::f32 ? 0xff800000u : t == dtype::bf16 ? 0xff80u : 0xfc00u;
    std::memcpy(h.bytes.data() + static_cast<size_t>(n / 3) * es, &nan, es);
    std::memcpy(h.bytes.data() + static_cast<size_t>(n - 7) * es, &inf, es);
  }
  return h;
}

enum class naming { gpt_oss, per_expert };

struct case_spec {
  naming layout;
  dtype type;
  bool nonfinite = false;
};

inline std::string case_name(const case_spec& c) {
  return std::string(c.layout == naming::gpt_oss ? "gpt_oss_" : "per_expert_") + to_string(c.type) +
         (c.nonfinite ? "_nonfinite" : "");
}

// Writes the case's checkpoint to `path`. gpt-oss: layers 1 and 3 (E = 3, H = 96, I = 160), with
// biases, router and embeddings; per-expert: layers 0 and 2 (E = 5, H = 64, I = 96), with a router,
// a shared expert and a norm between them.
inline void write_case(const case_spec& c, const std::string& path) {
  std::vector<host_tensor> t;
  t.push_back(make_tensor("model.embed_tokens.weight", dtype::bf16, {7, c.layout == naming::gpt_oss ? 96 : 64}, 1));
  if (c.layout == naming::gpt_oss) {
    const int64_t E = 3, H = 96, I = 160;
    for (int layer : {1, 3}) {
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
      const uint64_t s = 100 * static_cast<uint64_t>(layer);
      t.push_back(make_tensor(p + "router.weight", dtype::bf16, {E, H}, s + 1));
      t.push_back(make_tensor(p + "router.bias", dtype::bf16, {E}, s + 2));
      t.push_back(make_tensor(p + "experts.gate_up_proj", c.type, {E, H, 2 * I}, s + 3, c.nonfinite && layer == 3));
      t.push_back(make_tensor(p + "experts.gate_up_proj_bias", dtype::bf16, {E, 2 * I}, s + 4));
      t.push_back(make_tensor(p + "experts.down_proj", c.type, {E, I, H}, s + 5, c.nonfinite && layer == 1));
      t.push_back(make_tensor(p + "experts.down_proj_bias", dtype::bf16, {E, H}, s + 6));
      t.push_back(make_tensor("model.layers." + std::to_string(layer) + ".self_attn.q_proj.weight", dtype::bf16, {32, H},
                              s + 7));
    }
  } else {
    const int64_t E = 5, H = 64, I = 96;
    for (int layer : {0, 2}) {
      const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
      const uint64_t s = 1000 * static_cast<uint64_t>(layer + 1);
      t.push_back(make_tensor(p + "gate.weight", dtype::f32, {E, H}, s + 1));
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = p + "experts." + std::to_string(e) + ".";
        const uint64_t se = s + 10 * static_cast<uint64_t>(e + 1);
        const bool nf = c.nonfinite && e == 3 && layer == 2;
        t.push_back(make_tensor(ep + "gate_proj.weight", c.type, {I, H}, se + 1));
        t.push_back(make_tensor(ep + "up_proj.weight", c.type, {I, H}, se + 2, nf));
        t.push_back(make_tensor(ep + "down_proj.weight", c.type, {H, I}, se + 3));
      }
      t.push_back(make_tensor(p + "shared_experts.gate_proj.weight", dtype::bf16, {32, H}, s + 4));
      t.push_back(make_tensor("model.layers." + std::to_string(layer) + ".post_attention_layernorm.weight", dtype::f32, {H},
                              s + 5));
    }
  }
  std::vector<std::pair<std::string, tensor_view>> views;
  for (const auto& h : t) views.emplace_back(h.name, tensor_view(h.bytes.data(), h.type, h.shape));
  write_safetensors(path, views, {{"source", "mxmoe convert_cases"}}, true);
}

inline std::vector<case_spec> all_cases() {
  std::vector<case_spec> v;
  for (naming n : {naming::gpt_oss, naming::per_expert})
    for (dtype t : {dtype::bf16, dtype::f16, dtype::f32}) v.push_back({n, t, false});
  v.push_back({naming::gpt_oss, dtype::bf16, true});
  v.push_back({naming::per_expert, dtype::f32, true});
  return v;
}

}  // namespace convert_cases
