// The `mxmoe` binary end to end: quantize / inspect / dequantize round trip, --force and no
// half-written output on failure, run --device cpu verification, exit codes, the demo.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <csignal>
#include <thread>

#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/cuda.h"
#include "mxmoe/inspect.h"
#include "mxmoe/mx.h"
#include "mxmoe/quantize.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/verify.h"

namespace fs = std::filesystem;
using namespace mxmoe;

namespace {

struct result {
  int code;
  std::string out;
};

// Runs the shell command line `cmd` and returns its exit code and stdout.
result mxmoe_cmd_raw(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs `mxmoe ARGS` (stderr discarded unless `merge_stderr`) and returns its exit code and stdout.
result mxmoe_cmd(const std::string& args, bool merge_stderr = false) {
  return mxmoe_cmd_raw(std::string(MXMOE_BINARY_DIR) + "/bin/mxmoe " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mxmoe-test-cli-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A Qwen3-style per-expert BF16 checkpoint (E=4, H, I) with a router and one unrelated tensor.
  std::string write_bf16(const std::string& name, int64_t H, int64_t I, uint64_t seed) {
    return write_per_expert(name, H, I, seed, dtype::bf16);
  }
  // The same in element type `t` (bf16 or f16) for every tensor.
  std::string write_per_expert(const std::string& name, int64_t H, int64_t I, uint64_t seed, dtype type) {
    const int64_t E = 4;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.05f);
    storage_.emplace_back();
    auto& data = storage_.back();
    std::vector<std::pair<std::string, std::pair<dtype, std::vector<int64_t>>>> specs;
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
      specs.push_back({p + "gate_proj.weight", {type, {I, H}}});
      specs.push_back({p + "up_proj.weight", {type, {I, H}}});
      specs.push_back({p + "down_proj.weight", {type, {H, I}}});
    }
    specs.push_back({"model.layers.0.mlp.gate.weight", {type, {E, H}}});
    specs.push_back({"model.embed_tokens.weight", {type, {7, H}}});
    std::vector<std::pair<std::string, tensor_view>> t;
    for (auto& [tname, spec] : specs) {
      int64_t count = 1;
      for (int64_t d : spec.second) count *= d;
      data.emplace_back(static_cast<size_t>(count));
      for (auto& v : data.back()) v = type == dtype::f16 ? float_to_f16(n(rng)) : float_to_bf16(n(rng));
      t.emplace_back(tname, tensor_view(data.back().data(), spec.first, spec.second));
    }
    write_safetensors(path(name), t);
    return path(name);
  }

  // A gpt-oss-style fused checkpoint (E=4, H, I) with biases, router weight and router bias, every
  // tensor in element type `t` (bf16 or f16). `poison` tensors get a NaN at element `poison_at`.
  std::string write_gpt_oss(const std::string& name, int64_t H, int64_t I, uint64_t seed, dtype t,
                            const std::vector<std::string>& poison = {}, int64_t poison_at = 0) {
    const int64_t E = 4;
    const std::string p = "model.layers.0.mlp.";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> specs{
        {p + "experts.gate_up_proj", {E, H, 2 * I}}, {p + "experts.gate_up_proj_bias", {E, 2 * I}},
        {p + "experts.down_proj", {E, I, H}},        {p + "experts.down_proj_bias", {E, H}},
        {p + "router.weight", {E, H}},               {p + "router.bias", {E}}};
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 0.05f);
    storage_.emplace_back();
    auto& data = storage_.back();
    std::vector<std::pair<std::string, tensor_view>> tensors;
    for (const auto& [tname, shape] : specs) {
      int64_t count = 1;
      for (int64_t d : shape) count *= d;
      data.emplace_back(static_cast<size_t>(count));
      for (auto& v : data.back()) v = t == dtype::f16 ? float_to_f16(n(rng)) : float_to_bf16(n(rng));
      if (std::find(poison.begin(), poison.end(), tname) != poison.end())
        data.back()[static_cast<size_t>(poison_at)] = t == dtype::f16 ? float_to_f16(NAN) : float_to_bf16(NAN);
      tensors.emplace_back(tname, tensor_view(data.back().data(), t, shape));
    }
    write_safetensors(path(name), tensors);
    return path(name);
  }

  fs::path dir_;
  std::vector<std::vector<std::vector<uint16_t>>> storage_;
};

}  // namespace

TEST_F(Cli, QuantizeInspectDequantizeRoundTrip) {
  const std::string in = write_bf16("in.safetensors", 96, 64, 1), q = path("q.safetensors");
  const result r = mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["tensors"].size(), 2u);
  EXPECT_GT(j["total"]["sqnr_db"].get<double>(), 10.0);
  EXPECT_EQ(j["copied_tensors"], 2);  // router and embedding
  EXPECT_EQ(j["total"]["elements"], 4 * 3 * 96 * 64);

  {
    const safetensors_reader qr(q);
    EXPECT_TRUE(qr.contains("model.embed_tokens.weight"));
    EXPECT_TRUE(qr.contains("model.layers.0.mlp.gate.weight"));
    EXPECT_FALSE(qr.contains("model.layers.0.mlp.experts.0.gate_proj.weight"));
    const auto info = checkpoint::find_moe_layer(qr, 0);
    EXPECT_EQ(info.layout, checkpoint::moe_layout::mxfp4_gpt_oss);
    EXPECT_EQ(qr.metadata().at("mxmoe.scale_rule"), "even");
    // The bytes equal a direct quantization of the expert with the library.
    const safetensors_reader src(in);
    std::vector<uint8_t> gate_up_buf, down_buf;
    const auto expert = checkpoint::read_expert(src, checkpoint::find_moe_layer(src, 0), 3, gate_up_buf, down_buf);
    const auto g = checkpoint::gate_up_geometry(info.shape);
    std::vector<uint8_t> packed(static_cast<size_t>(g.rows * g.row_bytes())), scales(static_cast<size_t>(g.rows * g.scale_cols()));
    mxmoe::quantize(expert.gate_up, mx::scale_rule::even, scale_layout::linear,
                    tensor_view(packed.data(), dtype::u8, {g.rows, g.row_bytes()}),
                    tensor_view(scales.data(), dtype::u8, {g.rows, g.scale_cols()}));
    const uint8_t* fb = qr.bytes(qr.entry("model.layers.0.mlp.experts.gate_up_proj_blocks")).data() + g.code_offset(3, 0, 0).byte;
    const uint8_t* fs_ = qr.bytes(qr.entry("model.layers.0.mlp.experts.gate_up_proj_scales")).data() + g.scale_offset(3, 0, 0);
    EXPECT_TRUE(std::equal(packed.begin(), packed.end(), fb));
    EXPECT_TRUE(std::equal(scales.begin(), scales.end(), fs_));
  }

  const result ins = mxmoe_cmd("inspect " + q + " --source " + in + " --json");
  ASSERT_EQ(ins.code, 0);
  const auto ij = nlohmann::json::parse(ins.out);
  const auto& layer = ij["moe_layers"][0];
  EXPECT_EQ(layer["source_match"]["even"]["blocks_equal_pct"].get<double>(), 100.0);
  EXPECT_LT(layer["source_match"]["floor"]["scales_equal_pct"].get<double>(), 100.0);
  for (const auto& [name, w] : layer["weights"].items()) {
    const auto rules = w["consistent_rules"].get<std::vector<std::string>>();
    EXPECT_NE(std::find(rules.begin(), rules.end(), "even"), rules.end()) << name;
  }
  const result text = mxmoe_cmd("inspect " + q);
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("consistent with"), std::string::npos);

  // dequantize -> quantize -> dequantize reproduces the same BF16 values.
  const std::string d1 = path("d1.safetensors"), q2 = path("q2.safetensors"), d2 = path("d2.safetensors");
  ASSERT_EQ(mxmoe_cmd("dequantize " + q + " " + d1).code, 0);
  ASSERT_EQ(mxmoe_cmd("quantize " + d1 + " " + q2 + " --rule floor --device cpu").code, 0);
  ASSERT_EQ(mxmoe_cmd("dequantize " + q2 + " " + d2).code, 0);
  const safetensors_reader a(d1), b(d2);
  for (const char* n : {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"}) {
    const auto x = a.bytes(a.entry(n)), y = b.bytes(b.entry(n));
    ASSERT_EQ(x.size(), y.size());
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << n;
  }
}

TEST_F(Cli, ForceAndNoHalfWrittenOutput) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 2), out = path("out.safetensors");
  { std::ofstream(out) << "keep me"; }
  EXPECT_EQ(mxmoe_cmd("quantize " + in + " " + out + " --rule mse --device cpu").code, 2);
  std::string content;
  std::getline(std::ifstream(out), content);
  EXPECT_EQ(content, "keep me");
  EXPECT_EQ(mxmoe_cmd("quantize " + in + " " + out + " --rule mse --device cpu --force").code, 0);
  EXPECT_NO_THROW(safetensors_reader{out});

  // H = 48 is not a multiple of 32: refused before anything is written.
  const std::string odd = write_bf16("odd.safetensors", 48, 32, 3), none = path("none.safetensors");
  const result r = mxmoe_cmd("quantize " + odd + " " + none + " --rule even --device cpu", true);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("multiples of 32"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(none));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(Cli, RunVerifiesOnCpuFromCheckpointPresetAndInputs) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 4), q = path("q.safetensors");
  ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule rceil --device cpu").code, 0);
  const result r = mxmoe_cmd("run --checkpoint " + q + " --tokens 5 --device cpu --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_EQ(j["reference"], "cpu f64");
  EXPECT_EQ(j["routing"], "softmax_topk");
  EXPECT_LT(j["rel_l2"].get<double>(), j["threshold"].get<double>());

  // inputs from a file, output written
  std::vector<float> x(3 * 64), logits(3 * 4);
  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  for (auto& v : x) v = n(rng);
  for (auto& v : logits) v = n(rng);
  const std::string inputs = path("acts.safetensors"), out = path("out.safetensors");
  write_safetensors(inputs, {{"x", tensor_view(x.data(), dtype::f32, {3, 64})}, {"logits", tensor_view(logits.data(), dtype::f32, {3, 4})}});
  const result r2 = mxmoe_cmd("run --checkpoint " + q + " --layer 0 --inputs " + inputs + " --output " + out + " --device cpu");
  EXPECT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("PASS"), std::string::npos);
  const safetensors_reader o(out);
  EXPECT_EQ(o.entry("out").shape, (std::vector<int64_t>{3, 64}));
  // logits of the wrong width
  write_safetensors(inputs, {{"x", tensor_view(x.data(), dtype::f32, {3, 64})}, {"logits", tensor_view(logits.data(), dtype::f32, {4, 3})}}, {}, true);
  EXPECT_EQ(mxmoe_cmd("run --checkpoint " + q + " --inputs " + inputs + " --device cpu").code, 2);

  const result p = mxmoe_cmd("run --preset gpt-oss-20b --experts 4 --tokens 2 --device cpu --json");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(nlohmann::json::parse(p.out)["passed"].get<bool>());
}

TEST_F(Cli, ExitCodesForBadUsageAndMissingBackend) {
  EXPECT_EQ(mxmoe_cmd("").code, 2);
  EXPECT_EQ(mxmoe_cmd("--help").code, 0);
  EXPECT_EQ(mxmoe_cmd("frobnicate").code, 2);
  EXPECT_EQ(mxmoe_cmd("quantize a b").code, 2);                                 // no --rule, missing file
  EXPECT_EQ(mxmoe_cmd("run --preset no-such-model --device cpu").code, 2);
  EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --checkpoint x --device cpu").code, 2);
  EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --experts 1000").code, 2);
  const std::string junk = path("junk.safetensors");
  { std::ofstream(junk) << "this is not a safetensors file at all"; }
  const result bad = mxmoe_cmd("inspect " + junk, true);
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("junk.safetensors"), std::string::npos) << bad.out;
  for (const char* c : {"demo", "quantize", "dequantize", "inspect", "run", "bench"}) {
    const result h = mxmoe_cmd(std::string(c) + " --help");
    EXPECT_EQ(h.code, 0) << c;
    EXPECT_NE(h.out.find("Exit codes"), std::string::npos) << c;
  }
  std::string why;
  if (!cuda::available(&why)) {
    EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 1 --device cuda").code, 3);
    EXPECT_EQ(mxmoe_cmd("demo --device cuda").code, 3);
  }
}

// --ep / --tp in one process: the in-process group on the CPU, verified like a plain run.
TEST_F(Cli, RunSplitOverRanksVerifies) {
  const result ep = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 6 --device cpu --ep 3 --json");
  ASSERT_EQ(ep.code, 0) << ep.out;
  const auto j = nlohmann::json::parse(ep.out);
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_NE(j["parallel"].get<std::string>().find("EP over 3 ranks"), std::string::npos) << j["parallel"];
  const result tp = mxmoe_cmd("run --preset gpt-oss-20b --experts 4 --tokens 2 --device cpu --tp 8");
  EXPECT_EQ(tp.code, 0) << tp.out;
  EXPECT_NE(tp.out.find("TP over 8 ranks"), std::string::npos) << tp.out;
  EXPECT_NE(tp.out.find("PASS"), std::string::npos) << tp.out;
  EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 5 --device cpu --ep 2").code, 2);  // 5 over 2
  EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 4 --device cpu --ep 2 --tp 2").code, 2);
}

TEST_F(Cli, DemoRunsAndVerifies) {
  const result r = mxmoe_cmd("demo --device cpu --json --tokens 16");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rules"].size(), 4u);
  std::map<std::string, nlohmann::json> rules;
  for (const auto& row : j["rules"]) rules[row["rule"]] = row;
  // rceil never saturates; floor saturates more blocks than even; mse has the best SQNR.
  EXPECT_EQ(rules["rceil"]["saturated_blocks_pct"].get<double>(), 0.0);
  EXPECT_GT(rules["floor"]["saturated_blocks_pct"].get<double>(), rules["even"]["saturated_blocks_pct"].get<double>());
  for (const char* other : {"floor", "even", "rceil"})
    EXPECT_GE(rules["mse"]["sqnr_db"].get<double>(), rules[other]["sqnr_db"].get<double>());
  EXPECT_TRUE(j["run"]["passed"].get<bool>());
  EXPECT_EQ(j["run"]["backend"], "cpu");
  const result text = mxmoe_cmd("demo --tokens 8");
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("PASS"), std::string::npos);
}

// ---- issue 16: what a new user hits (F16 checkpoints, non-finite values, bounds, argument
// errors, inspect on refused layers, output that matches the docs) --------------------------

// F16 checkpoints keep their router and biases as F16 after quantize; run must accept them.
TEST_F(Cli, RunAcceptsF16RouterAndBiasesAfterQuantize) {
  for (const bool gpt_oss : {false, true}) {
    const std::string in = gpt_oss ? write_gpt_oss("in-oss.safetensors", 64, 32, 6, dtype::f16)
                                   : write_per_expert("in.safetensors", 64, 32, 6, dtype::f16),
                      q = path(gpt_oss ? "q-oss.safetensors" : "q.safetensors");
    ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu --force").code, 0);
    const result r = mxmoe_cmd("run --checkpoint " + q + " --tokens 3 --device cpu", true);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  }
}

// Bad arguments: "OPTION: expected WHAT; got 'VALUE'", exit code 2, before any work.
TEST_F(Cli, ArgumentErrorsSayWhatIsExpected) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 7), out = path("out.safetensors");
  const auto expect_error = [](const std::string& args, const std::string& message) {
    const result r = mxmoe_cmd(args, true);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
    EXPECT_LT(r.out.size(), 400u) << args << "\n" << r.out;  // one clear message, not a dump
  };
  expect_error("quantize " + in + " " + out + " --rule banana", "--rule: expected one of floor, even, rceil, mse; got 'banana'");
  expect_error("run --preset gpt-oss-20b --layer -1", "--layer: expected an integer in [0, 999999999]; got '-1'");
  expect_error("run --preset gpt-oss-20b --tokens many", "--tokens: expected an integer in [");
  expect_error("run --preset gpt-oss-20b --device gpu", "--device: expected one of auto, cpu, cuda; got 'gpu'");
  expect_error("run --preset gpt-oss-20b --reference f16", "--reference: expected one of auto, f64, f32, none; got 'f16'");
  expect_error("frobnicate", "unknown command 'frobnicate'; expected one of demo, quantize, dequantize, inspect, run, bench");
  expect_error("inspect " + path("missing.safetensors"), "FILE: expected an existing file; got '" + path("missing.safetensors") + "'");
  // Outputs are checked before the work: a directory, or a directory that does not exist.
  expect_error("run --preset gpt-oss-20b --experts 4 --tokens 1 --device cpu --output " + dir_.string(),
               "--output: expected a file path, not a directory; got '" + dir_.string() + "'");
  expect_error("run --preset gpt-oss-20b --experts 4 --tokens 1 --device cpu --output " + path("no/such/out.safetensors"),
               "--output: expected a path in an existing directory; got '" + path("no/such/out.safetensors") + "'");
  expect_error("demo --device cpu --keep " + in, "--keep: expected a directory (or a path to create one); got '" + in + "'");
  EXPECT_FALSE(fs::exists(out));
}

// Runs `cmd` (a shell command line) under a pseudo-terminal, as a user at a terminal would, and
// returns what the terminal showed (stdout and stderr together).
namespace {
std::string on_terminal(const std::string& cmd) {
  return mxmoe_cmd_raw("script -qec '" + cmd + "' /dev/null").out;
}
}  // namespace

// No unbounded, silent work: T = 0 refused; the CPU work of a run bounded (with the way out:
// --reference none on a GPU); progress on a terminal.
TEST_F(Cli, RunRefusesEmptyAndUnboundedWorkAndShowsProgress) {
  const result zero = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 0 --device cpu", true);
  EXPECT_EQ(zero.code, 2) << zero.out;
  EXPECT_NE(zero.out.find("--tokens: expected an integer in [1, 1048576]; got '0'"), std::string::npos) << zero.out;

  const auto t0 = std::chrono::steady_clock::now();
  const result big = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 1048576 --device cpu", true);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_EQ(big.code, 2) << big.out;
  EXPECT_NE(big.out.find("--tokens"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("multiply-adds"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("--reference none"), std::string::npos) << big.out;

  // Without verification: the output is produced and said to be unverified.
  const result none = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 4 --device cpu --reference none --json");
  ASSERT_EQ(none.code, 0) << none.out;
  const auto j = nlohmann::json::parse(none.out);
  EXPECT_EQ(j["reference"], "none");
  EXPECT_FALSE(j["verified"].get<bool>());
  EXPECT_TRUE(j["passed"].is_null());
  const result text = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 4 --device cpu --reference none");
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("not verified (--reference none)"), std::string::npos) << text.out;

  // Progress on a terminal, none when stderr is not one.
  const std::string bin = std::string(MXMOE_BINARY_DIR) + "/bin/mxmoe";
  const std::string shown = on_terminal(bin + " run --preset qwen3-30b-a3b --experts 8 --tokens 4 --device cpu");
  EXPECT_NE(shown.find("reference cpu f64"), std::string::npos) << shown;
  EXPECT_EQ(mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 4 --device cpu", true).out.find("\r"),
            std::string::npos);
  const std::string in = write_bf16("in.safetensors", 64, 32, 8), q = path("q.safetensors");
  ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu").code, 0);
  const std::string inspected = on_terminal(bin + " inspect " + q + " --source " + in);
  EXPECT_NE(inspected.find("inspect ["), std::string::npos) << inspected;
  EXPECT_NE(inspected.find("4/4"), std::string::npos) << inspected;
}

// The library side of inspect's progress: one step per expert of every matched layer.
TEST_F(Cli, MatchScaleRulesReportsProgress) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 9), q = path("q.safetensors");
  ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu").code, 0);
  const safetensors_reader file(q), source(in);
  std::vector<int64_t> done;
  int64_t total = 0;
  checkpoint::match_scale_rules(file, checkpoint::find_moe_layer(file, 0), source, [&](const convert_progress& p) {
    done.push_back(p.done);
    total = p.total;
  });
  EXPECT_EQ(done, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(total, 4);
}

namespace {
// An MXFP4 checkpoint (E=4, H=64, I=32) with an f32 router: random codes, scales 2^-4..2^0. One
// router element can be made NaN, one gate_up scale byte 0xFF (a NaN block).
void write_mxfp4(const std::string& file, int64_t router_nan_at = -1, int64_t nan_scale_at = -1) {
  const moe_shape shape{4, 64, 32};
  const std::string p = checkpoint::gpt_oss_prefix(0);
  std::mt19937 rng(11);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::pair<std::string, tensor_view>> tensors;
  for (const auto& d : checkpoint::mxfp4_layer_decls(p, shape)) {
    int64_t n = 1;
    for (int64_t s : d.shape) n *= s;
    bytes.emplace_back(static_cast<size_t>(n));
    const bool scales = d.name.find("_scales") != std::string::npos;
    for (auto& b : bytes.back()) b = static_cast<uint8_t>(scales ? 123 + rng() % 5 : rng() % 256);
    if (scales && d.name.find("gate_up") != std::string::npos && nan_scale_at >= 0)
      bytes.back()[static_cast<size_t>(nan_scale_at)] = mx::kE8M0Nan;
    tensors.emplace_back(d.name, tensor_view(bytes.back().data(), d.type, d.shape));
  }
  std::vector<float> router(static_cast<size_t>(shape.experts * shape.hidden));
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (auto& v : router) v = normal(rng);
  if (router_nan_at >= 0) router[static_cast<size_t>(router_nan_at)] = NAN;
  tensors.emplace_back(p + "router.weight", tensor_view(router.data(), dtype::f32, {shape.experts, shape.hidden}));
  write_safetensors(file, tensors);
}
}  // namespace

// NaN / Inf in the weights or the inputs is reported as such (exit code 6), naming the tensor as
// the file names it and the first index, before anything runs, not as a verification failure.
TEST_F(Cli, RunReportsNonFiniteWeightsAndInputs) {
  const std::string clean = path("clean.safetensors"), router = path("router.safetensors"), scale = path("scale.safetensors");
  write_mxfp4(clean);
  write_mxfp4(router, 64 + 5);
  write_mxfp4(scale, -1, 2 * 2 + 1);  // expert 0, row 2, block 1 of [E, 2I, H/32]
  ASSERT_EQ(mxmoe_cmd("run --checkpoint " + clean + " --tokens 2 --device cpu").code, 0);

  const auto expect_nonfinite = [](const std::string& args, const std::string& message) {
    const result r = mxmoe_cmd(args, true);
    EXPECT_EQ(r.code, 6) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
    EXPECT_EQ(r.out.find("rel-L2"), std::string::npos) << r.out;
  };
  expect_nonfinite("run --checkpoint " + router + " --tokens 2 --device cpu",
                   "tensor 'model.layers.0.mlp.router.weight' holds NaN at [1, 5]");
  expect_nonfinite("run --checkpoint " + scale + " --tokens 2 --device cpu",
                   "tensor 'model.layers.0.mlp.experts.gate_up_proj_scales' holds scale byte 0xFF (NaN) at [0, 2, 1]");

  std::vector<float> x(3 * 64, 0.5f), logits(3 * 4, 0.0f);
  x[64 + 7] = INFINITY;
  const std::string inputs = path("acts.safetensors");
  write_safetensors(inputs, {{"x", tensor_view(x.data(), dtype::f32, {3, 64})}, {"logits", tensor_view(logits.data(), dtype::f32, {3, 4})}});
  expect_nonfinite("run --checkpoint " + clean + " --inputs " + inputs + " --device cpu",
                   "tensor 'x of --inputs " + inputs + "' holds Inf at [1, 7]");
  x[64 + 7] = 0.5f;
  logits[2] = NAN;
  write_safetensors(inputs, {{"x", tensor_view(x.data(), dtype::f32, {3, 64})}, {"logits", tensor_view(logits.data(), dtype::f32, {3, 4})}}, {}, true);
  expect_nonfinite("run --checkpoint " + clean + " --inputs " + inputs + " --device cpu",
                   "tensor 'logits of --inputs " + inputs + "' holds NaN at [0, 2]");
}

// inspect lists what it can read and marks what it refuses (exit code 2 when something was
// refused); layers are labelled with their own element type.
TEST_F(Cli, InspectListsWhatItCanReadAndMarksWhatItRefuses) {
  const std::string good = write_per_expert("f16.safetensors", 64, 32, 12, dtype::f16);
  const result f16 = mxmoe_cmd("inspect " + good + " --json");
  ASSERT_EQ(f16.code, 0) << f16.out;
  const auto fj = nlohmann::json::parse(f16.out);
  EXPECT_EQ(fj["moe_layers"][0]["weight_dtype"], "f16");
  EXPECT_EQ(fj["moe_layers"][0]["layout"].get<std::string>().rfind("f16 ", 0), 0u) << fj["moe_layers"][0]["layout"];
  const result f16_text = mxmoe_cmd("inspect " + good);
  EXPECT_NE(f16_text.out.find("f16 (per-expert"), std::string::npos) << f16_text.out;
  EXPECT_EQ(f16_text.out.find("bf16"), std::string::npos) << f16_text.out;

  // Layer 0: gpt-oss fused with an I32 down_proj; layer 1: a per-expert layer that is fine.
  const int64_t E = 2, H = 32, I = 32;
  std::vector<uint16_t> gu(static_cast<size_t>(E * H * 2 * I), float_to_bf16(0.25f)), w(static_cast<size_t>(I * H), float_to_bf16(0.5f));
  std::vector<int32_t> bad(static_cast<size_t>(E * I * H), 1);
  std::vector<std::pair<std::string, tensor_view>> t{
      {"model.layers.0.mlp.experts.gate_up_proj", tensor_view(gu.data(), dtype::bf16, {E, H, 2 * I})},
      {"model.layers.0.mlp.experts.down_proj", tensor_view(bad.data(), dtype::i32, {E, I, H})}};
  for (int e = 0; e < 2; ++e)
    for (const char* part : {"gate_proj", "up_proj", "down_proj"})
      t.emplace_back("model.layers.1.mlp.experts." + std::to_string(e) + "." + part + ".weight",
                     tensor_view(w.data(), dtype::bf16, {I, H}));
  const std::string mixed = path("mixed.safetensors");
  write_safetensors(mixed, t);
  const result r = mxmoe_cmd("inspect " + mixed, true);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model.layers.0.mlp.experts.down_proj"), std::string::npos) << r.out;  // listed
  EXPECT_NE(r.out.find("I32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE layer 0 (model.layers.0.mlp.): refused:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE layer 1 (model.layers.1.mlp.): bf16 (per-expert"), std::string::npos) << r.out;
  const result rj = mxmoe_cmd("inspect " + mixed + " --json");
  EXPECT_EQ(rj.code, 2);
  const auto j = nlohmann::json::parse(rj.out);
  EXPECT_EQ(j["tensors"].size(), 8u);
  ASSERT_EQ(j["moe_layers"].size(), 1u);
  EXPECT_EQ(j["moe_layers"][0]["layer"], 1);
  ASSERT_EQ(j["refused_layers"].size(), 1u);
  EXPECT_EQ(j["refused_layers"][0]["layer"], 0);
  EXPECT_EQ(j["refused_layers"][0]["tensor"], "model.layers.0.mlp.experts.down_proj");
  EXPECT_NE(j["refused_layers"][0]["reason"].get<std::string>().find("I32"), std::string::npos);
}

namespace {
// 4e-3, 1.5e-2: how help and docs write a tolerance.
std::string tolerance_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  std::string s = buf;
  if (s.compare(1, 2, ".0") == 0) s.erase(1, 2);
  const size_t e = s.find("e-0");
  if (e != std::string::npos) s.erase(e + 2, 1);
  return s;
}
}  // namespace

// Output matches the docs: thresholds from tolerance_for (verify.h) in help and docs/cli.md,
// --json failures as a JSON error object, the no-GPU reason in plain words.
TEST_F(Cli, HelpDocsAndJsonErrorsAgreeWithTheProgram) {
  std::ifstream doc_file(std::string(MXMOE_SOURCE_DIR) + "/docs/cli.md");
  const std::string docs((std::istreambuf_iterator<char>(doc_file)), std::istreambuf_iterator<char>());
  const result help = mxmoe_cmd("run --help");
  const forward_tolerance cpu = tolerance_for(device_kind::cpu), gpu = tolerance_for(device_kind::cuda);
  for (const std::string& t : {"rel-L2 " + tolerance_text(cpu.rel_l2), "rel-L2 " + tolerance_text(gpu.rel_l2),
                               "max error " + tolerance_text(gpu.max_err_rel)}) {
    EXPECT_NE(help.out.find(t), std::string::npos) << t << "\n" << help.out;
    EXPECT_NE(docs.find(t), std::string::npos) << t << " not in docs/cli.md";
  }

  // --json: a failing command still prints one JSON document on stdout.
  const result bad = mxmoe_cmd("run --preset qwen3-30b-a3b --experts 8 --tokens 0 --device cpu --json");
  EXPECT_EQ(bad.code, 2);
  const auto j = nlohmann::json::parse(bad.out);
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_EQ(j["argument"], "--tokens");
  EXPECT_NE(j["error"].get<std::string>().find("expected an integer in [1, 1048576]"), std::string::npos) << j;
  const result missing = mxmoe_cmd("run --preset no-such --device cpu --json");
  EXPECT_EQ(missing.code, 2);
  EXPECT_EQ(nlohmann::json::parse(missing.out)["argument"], "--preset");
  const std::string junk = path("junk.safetensors");
  { std::ofstream(junk) << "not a safetensors file"; }
  const result malformed = mxmoe_cmd("inspect " + junk + " --json");
  EXPECT_EQ(malformed.code, 2);
  const auto mj = nlohmann::json::parse(malformed.out);
  EXPECT_EQ(mj["exit_code"], 2);
  EXPECT_EQ(mj["file"], junk);

  // Without a usable GPU the demo says so plainly, the CUDA error only as detail.
  std::string why;
  if (!cuda::available(&why)) {
    const result demo = mxmoe_cmd("demo --tokens 4");
    EXPECT_EQ(demo.code, 0);
    EXPECT_NE(demo.out.find("no usable sm_90 GPU or CUDA driver was found, so the CPU backend runs (detail: "),
              std::string::npos) << demo.out;
    EXPECT_NE(docs.find("no usable sm_90 GPU or CUDA driver was found, so the CPU backend runs (detail: "),
              std::string::npos);
  }
}

// NaN / Inf weights are refused by default (exit code 6, the tensor as the file names it, the
// expert and the first [row, col] of its matrix in the file), and nothing is left behind;
// --allow-nonfinite keeps them as NaN blocks, counted.
TEST_F(Cli, QuantizeRefusesNonfiniteWeightsUnlessAllowed) {
  const std::string tensor = "model.layers.0.mlp.experts.gate_up_proj";
  // gate_up_proj [E, H, 2I] = [4, 64, 64]: expert 1, row 3, column 17.
  const std::string in = write_gpt_oss("nan.safetensors", 64, 32, 5, dtype::bf16, {tensor}, 64 * 64 + 3 * 64 + 17);
  const std::string out = path("q.safetensors");
  const result r = mxmoe_cmd("quantize " + in + " " + out + " --rule even --device cpu", true);
  EXPECT_EQ(r.code, 6) << r.out;
  EXPECT_NE(r.out.find("non-finite input: argument '" + tensor + "'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NaN at [3, 17] of expert 1 ([64, 64])"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--allow-nonfinite"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // the input alone
  const result j = mxmoe_cmd("quantize " + in + " " + out + " --rule even --device cpu --json");
  EXPECT_EQ(j.code, 6);
  const auto err = nlohmann::json::parse(j.out);
  EXPECT_EQ(err["tensor"], tensor);
  EXPECT_EQ(err["exit_code"], 6);

  const result ok = mxmoe_cmd("quantize " + in + " " + out + " --rule even --device cpu --allow-nonfinite --json");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["total"]["nonfinite_blocks"], 1);
}

// OUT of quantize and dequantize is checked before any work: not a directory, in one that exists.
TEST_F(Cli, ConversionOutputPathsCheckedFirst) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 3), q = path("q.safetensors");
  ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu").code, 0);
  for (const std::string cmd : {"quantize " + in + " {} --rule even --device cpu", "dequantize " + q + " {}"}) {
    for (const auto& [target, message] :
         {std::pair{dir_.string(), "OUT: expected a file path, not a directory; got '" + dir_.string() + "'"},
          std::pair{path("no/such.safetensors"),
                    "OUT: expected a path in an existing directory; got '" + path("no/such.safetensors") + "'"}}) {
      std::string line = cmd;
      line.replace(line.find("{}"), 2, target);
      const result r = mxmoe_cmd(line, true);
      EXPECT_EQ(r.code, 2) << line << "\n" << r.out;
      EXPECT_NE(r.out.find(message), std::string::npos) << line << "\n" << r.out;
    }
  }
}

// A dequantized BF16 file holds no MXFP4 scale rule; the MoE configuration (still true) stays.
TEST_F(Cli, DequantizedFileDropsTheScaleRule) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 4), q = path("q.safetensors"), d = path("d.safetensors");
  ASSERT_EQ(mxmoe_cmd("quantize " + in + " " + q + " --rule mse --device cpu").code, 0);
  ASSERT_EQ(safetensors_reader(q).metadata().count("mxmoe.scale_rule"), 1u);
  ASSERT_EQ(mxmoe_cmd("dequantize " + q + " " + d).code, 0);
  const auto meta = safetensors_reader(d).metadata();
  EXPECT_EQ(meta.count("mxmoe.scale_rule"), 0u);
  EXPECT_EQ(meta.at("mxmoe.moe_config"), safetensors_reader(q).metadata().at("mxmoe.moe_config"));
}

// quantize reports its rate (human and --json) and shows it with the time left on a terminal.
TEST_F(Cli, QuantizeReportsThroughput) {
  const std::string in = write_bf16("in.safetensors", 64, 32, 6), q = path("q.safetensors");
  const result j = mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu --json");
  ASSERT_EQ(j.code, 0);
  const auto rep = nlohmann::json::parse(j.out);
  EXPECT_GT(rep["input_gb_per_s"].get<double>(), 0.0);
  EXPECT_GE(rep["workers"].get<int>(), 1);
  const result text = mxmoe_cmd("quantize " + in + " " + q + " --rule even --device cpu --force");
  EXPECT_NE(text.out.find(" GB/s of input, "), std::string::npos) << text.out;
  const std::string shown =
      on_terminal(std::string(MXMOE_BINARY_DIR) + "/bin/mxmoe quantize " + in + " " + q + " --rule even --device cpu --force");
  EXPECT_NE(shown.find(" GB/s, "), std::string::npos) << shown;
  EXPECT_NE(shown.find(" s left "), std::string::npos) << shown;
}

// SIGKILL in the middle of a conversion leaves neither an output nor a temporary file: the
// temporary is unnamed (O_TMPFILE) until the finished file is linked into place.
TEST_F(Cli, KilledQuantizeLeavesNothingBehind) {
  const std::string in = path("big.safetensors"), out = path("q.safetensors");
  // 16 experts of H = I = 2048: 400 MB of BF16 experts, seconds of work on a small machine.
  ASSERT_EQ(mxmoe_cmd_raw(std::string(MXMOE_BINARY_DIR) + "/bin/make_checkpoint " + in +
                          " --layers 1 --experts 16 --hidden 2048 --intermediate 2048 >/dev/null")
                .code,
            0);
  const std::string bin = std::string(MXMOE_BINARY_DIR) + "/bin/mxmoe";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(bin.c_str(), bin.c_str(), "quantize", in.c_str(), out.c_str(), "--rule", "mse", "--device", "cpu",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill once the output file is open (a descriptor into dir_ other than the input): mid-run.
  bool writing = false;
  for (int i = 0; i < 2000 && !writing; ++i) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      const std::string target = fs::read_symlink(fd.path(), ec).string();
      writing = writing || (target.rfind(dir_.string(), 0) == 0 && target != in);
    }
    if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(writing) << "the conversion never opened its output";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "it ended before the kill; use a larger file";
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"big.safetensors"});
}
