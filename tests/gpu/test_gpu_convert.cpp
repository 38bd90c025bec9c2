// Checkpoint conversion on the GPU (quantize_checkpoint with device cuda: cuda::matrix_pipeline)
// against the golden fingerprints of the sequential CPU converter (tests/cpu/convert_golden.h):
// every layout, float dtype and scale rule of convert_cases.h must give the same output file,
// byte for byte, and the same counts as the CPU path (the sums of squares, added in another order
// on the GPU, only to a relative 1e-6: stats_compare.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "cpu/convert_cases.h"
#include "cpu/convert_golden.h"
#include "mxmoe/convert.h"
#include "mxmoe/error.h"
#include "stats_compare.h"

namespace fs = std::filesystem;
using namespace mxmoe;
using namespace convert_cases;

namespace {

}  // namespace

TEST(GpuConvert, OutputBytesAsTheGoldenCpuConverter) {
  const fs::path d = fs::temp_directory_path() / ("mxmoe-test-gpu-convert-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::map<std::string, uint64_t> golden;
  for (const auto& g : kConvertGolden) golden[g.name] = g.file;
  int compared = 0;
  for (const case_spec& c : all_cases()) {
    const std::string in = (d / (case_name(c) + ".safetensors")).string();
    write_case(c, in);
    for (mx::scale_rule rule : mx::kAllScaleRules) {
      const std::string key = case_name(c) + "/" + mx::to_string(rule);
      quantize_options o;
      o.rule = rule;
      o.overwrite = true;
      o.allow_nonfinite = c.nonfinite;
      o.device = device_kind::cpu;
      const quantize_report cpu = quantize_checkpoint(in, (d / "cpu.safetensors").string(), o);
      o.device = device_kind::cuda;
      const std::string out = (d / "gpu.safetensors").string();
      const quantize_report gpu = quantize_checkpoint(in, out, o);
      ASSERT_TRUE(golden.count(key)) << key;
      EXPECT_EQ(file_hash(out), golden[key]) << key << ": GPU output bytes differ from the golden file";
      ASSERT_EQ(gpu.tensors.size(), cpu.tensors.size()) << key;
      for (size_t t = 0; t < gpu.tensors.size(); ++t)
        expect_same_stats(gpu.tensors[t].stats, cpu.tensors[t].stats, key + " " + gpu.tensors[t].name);
      ++compared;
    }
  }
  int quantize_entries = 0;
  for (const auto& [name, file] : golden) quantize_entries += name.find("/dequantize") == std::string::npos ? 1 : 0;
  EXPECT_EQ(compared, quantize_entries);
  fs::remove_all(d);
}

// NaN / Inf weights are refused on the GPU path too, naming the tensor, and nothing is written.
TEST(GpuConvert, NonfiniteWeightsRefused) {
  const fs::path d = fs::temp_directory_path() / ("mxmoe-test-gpu-convert-nan-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  for (const case_spec& c : all_cases()) {
    if (!c.nonfinite) continue;
    const std::string in = (d / "in.safetensors").string(), out = (d / "out.safetensors").string();
    write_case(c, in);
    quantize_options o;
    o.device = device_kind::cuda;
    std::string cpu_message;
    try {
      o.device = device_kind::cpu;
      quantize_checkpoint(in, out, o);
    } catch (const nonfinite_error& e) {
      cpu_message = e.what();
    }
    o.device = device_kind::cuda;
    try {
      quantize_checkpoint(in, out, o);
      ADD_FAILURE() << case_name(c) << ": NaN weights were not refused on cuda";
    } catch (const nonfinite_error& e) {
      EXPECT_EQ(std::string(e.what()), cpu_message) << case_name(c) << ": the first non-finite element differs";
    }
    EXPECT_FALSE(fs::exists(out));
  }
  fs::remove_all(d);
}
