// Replays the fuzzing corpus (tests/fuzz/corpus: valid and hostile files, minimized by libFuzzer):
// every file must either parse or throw mxmoe::format_error — never crash, never anything else.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mxmoe/checkpoint.h"
#include "mxmoe/safetensors.h"

namespace fs = std::filesystem;

TEST(SafetensorsCorpus, EveryFileParsesOrThrowsFormatError) {
  const fs::path dir = fs::path(MXMOE_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int parsed = 0, rejected = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      const mxmoe::safetensors_reader r(std::span<const uint8_t>(bytes), f.path().filename().string());
      for (const auto& e : r.entries()) {
        const auto b = r.bytes(e);
        ASSERT_GE(b.data(), bytes.data()) << f.path();
        ASSERT_LE(b.data() + b.size(), bytes.data() + bytes.size()) << f.path();
      }
      try {
        (void)mxmoe::checkpoint::find_moe_layers(r);
      } catch (const mxmoe::format_error&) {
      }
      ++parsed;
    } catch (const mxmoe::format_error& e) {
      EXPECT_NE(std::string(e.what()).find(f.path().filename().string()), std::string::npos) << e.what();
      ++rejected;
    }
  }
  // The corpus holds both kinds; an empty or one-sided corpus would make this test vacuous.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}
