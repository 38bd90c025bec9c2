// safetensors reader and writer: round trips of every dtype, pieces written out of order,
// commit semantics (no half-written or replaced output), and each class of malformed header.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace fs = std::filesystem;
using namespace mxmoe;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mxmoe-test-st-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A file image: 8-byte little-endian header length, the header text, then `data`.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

// Parses `header` + data and returns the format_error message ("" when it parsed).
std::string parse_error(const std::string& header, size_t data_bytes) {
  const auto img = image(header, data_bytes);
  try {
    safetensors_reader r(std::span<const uint8_t>(img), "mem.safetensors");
    return "";
  } catch (const format_error& e) {
    return e.what();
  }
}

std::vector<std::string> files_in(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  return names;
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtypeAndMetadata) {
  const fs::path d = fresh_dir("roundtrip");
  const dtype types[] = {dtype::bf16, dtype::f16, dtype::f32, dtype::u8, dtype::i32, dtype::i64};
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::pair<std::string, tensor_view>> tensors;
  for (int i = 0; i < 6; ++i) {
    const std::vector<int64_t> shape{3, 5 + i};  // odd sizes: offsets not multiples of 8
    data.push_back(random_bytes(static_cast<size_t>(15 + 3 * i) * dtype_size(types[i]), 100 + i));
    tensors.emplace_back("t" + std::to_string(i), tensor_view(data.back().data(), types[i], shape));
  }
  std::vector<uint8_t> empty;
  tensors.emplace_back("empty", tensor_view(empty.data(), dtype::f32, {0, 7}));
  const std::string path = (d / "a.safetensors").string();
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "hello"}});

  const safetensors_reader r(path);
  ASSERT_EQ(r.entries().size(), tensors.size());
  EXPECT_EQ(r.metadata().at("note"), "hello");
  for (size_t i = 0; i < 6; ++i) {
    const auto& e = r.entry("t" + std::to_string(i));
    EXPECT_EQ(e.type, types[i]);
    EXPECT_EQ(e.shape, tensors[i].second.shape);
    const auto bytes = r.bytes(e);
    ASSERT_EQ(bytes.size(), data[i].size());
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), data[i].begin()));
    const tensor_view v = r.tensor(e);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(dtype_size(types[i])), 0u);
  }
  EXPECT_EQ(r.entry("empty").nbytes(), 0u);
  EXPECT_FALSE(r.contains("t9"));
  EXPECT_THROW(r.entry("t9"), format_error);
  fs::remove_all(d);
}

TEST(Safetensors, WriterTakesPiecesInAnyOrderAndChecksCompleteness) {
  const fs::path d = fresh_dir("pieces");
  const std::string path = (d / "p.safetensors").string();
  const auto a = random_bytes(40, 1);
  {
    safetensors_writer w(path, {{"a", dtype::f32, {10}}, {"b", dtype::u8, {3}}});
    w.write("a", a.data() + 24, 16, 24);
    w.write("a", a.data(), 8, 0);
    EXPECT_THROW(w.write("a", a.data(), 8, 20), invalid_argument);  // overlaps [24, 40)
    EXPECT_THROW(w.write("a", a.data(), 8, 36), invalid_argument);  // past the end
    EXPECT_THROW(w.write("c", a.data(), 1, 0), invalid_argument);
    w.write("a", a.data() + 8, 16, 8);
    EXPECT_THROW(w.commit(), invalid_argument);  // "b" never written
    EXPECT_FALSE(fs::exists(path));
    w.write("b", a.data(), 3, 0);
    w.commit();
  }
  const safetensors_reader r(path);
  const auto bytes = r.bytes(r.entry("a"));
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), a.begin()));
  EXPECT_EQ(files_in(d).size(), 1u);  // no temporary left behind
  fs::remove_all(d);
}

TEST(Safetensors, ExistingOutputIsKeptUnlessOverwrite) {
  const fs::path d = fresh_dir("keep");
  const std::string path = (d / "o.safetensors").string();
  { std::ofstream(path) << "precious"; }
  auto v = random_bytes(4, 2);
  const std::vector<std::pair<std::string, tensor_view>> t{{"x", tensor_view(v.data(), dtype::u8, {4})}};
  EXPECT_THROW(write_safetensors(path, t), invalid_argument);
  std::string content;
  std::getline(std::ifstream(path), content);
  EXPECT_EQ(content, "precious");
  EXPECT_EQ(files_in(d).size(), 1u);
  write_safetensors(path, t, {}, true);
  EXPECT_EQ(safetensors_reader(path).entries().size(), 1u);
  fs::remove_all(d);
}

TEST(Safetensors, AbandonedWriterRemovesItsTemporaryFile) {
  const fs::path d = fresh_dir("abandon");
  const std::string path = (d / "x.safetensors").string();
  {
    safetensors_writer w(path, {{"a", dtype::u8, {4}}});
    // An unnamed temporary (O_TMPFILE) leaves nothing in the directory even before the end; a
    // named one (file systems without O_TMPFILE) lies next to the output.
    if (w.temp_path().empty()) {
      EXPECT_TRUE(files_in(d).empty());
    } else {
      EXPECT_TRUE(fs::exists(w.temp_path()));
      EXPECT_EQ(fs::path(w.temp_path()).parent_path(), d);
    }
  }
  EXPECT_TRUE(files_in(d).empty());
  EXPECT_THROW(safetensors_writer(path, {{"a", dtype::u8, {1}}, {"a", dtype::u8, {1}}}), invalid_argument);
  EXPECT_THROW(safetensors_writer(path, {{"a", dtype::u8, {-1}}}), invalid_argument);
  EXPECT_TRUE(files_in(d).empty());
  fs::remove_all(d);
}

TEST(Safetensors, HeaderPaddedSoThatDataIsAligned) {
  const fs::path d = fresh_dir("align");
  const std::string path = (d / "x.safetensors").string();
  auto v = random_bytes(8, 3);
  write_safetensors(path, {{"abc", tensor_view(v.data(), dtype::i64, {1})}});
  std::ifstream f(path, std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(fs::file_size(path), 8 + n + 8);
  fs::remove_all(d);
}

TEST(Safetensors, MalformedHeadersThrowFormatErrorNamingTheProblem) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  EXPECT_EQ(parse_error(ok, 16), "");
  // truncated data section: the tensor's end lies past the file
  EXPECT_NE(parse_error(ok, 15).find("tensor 'w'"), std::string::npos);
  EXPECT_NE(parse_error(ok, 15).find("past"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4).find("'F8_E4M3'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16).find("does not match"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 12)
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}})", 16), "");
  EXPECT_NE(parse_error(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0).find("non-negative"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", 1).find("begin > end"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w":{"dtype":"U8","shape":[1]}})", 1).find("lacks"), std::string::npos);
  EXPECT_NE(parse_error(R"({"__metadata__":{"k":1}})", 0).find("__metadata__"), std::string::npos);
  EXPECT_NE(parse_error(R"({"w": )", 0).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("[1,2]", 0).find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(std::string(10000, '[') + std::string(10000, ']'), 0).find("nests"), std::string::npos);

  // header length beyond the file, and files too short to hold one
  auto img = image(ok, 16);
  img[7] = 0x80;
  EXPECT_THROW(safetensors_reader(std::span<const uint8_t>(img), "m"), format_error);
  const uint8_t tiny[3] = {1, 2, 3};
  EXPECT_THROW(safetensors_reader(std::span<const uint8_t>(tiny, 3), "m"), format_error);
}

TEST(Safetensors, MisalignedTensorIsRefusedOnlyWhenViewed) {
  const std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[1,3]}})";
  // Pad the header so that the data section itself is 8-byte aligned in the buffer.
  std::string padded = h + std::string((8 - h.size() % 8) % 8, ' ');
  std::vector<uint64_t> storage((8 + padded.size() + 8) / 8 + 1);
  const auto img = image(padded, 3);
  std::memcpy(storage.data(), img.data(), img.size());
  const safetensors_reader r(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(storage.data()), img.size()), "m");
  EXPECT_NO_THROW(r.tensor("a"));
  EXPECT_THROW(r.tensor("b"), format_error);
  EXPECT_EQ(r.bytes(r.entry("b")).size(), 2u);
}

TEST(Safetensors, FileErrorsAreReported) {
  const fs::path d = fresh_dir("files");
  EXPECT_THROW(safetensors_reader((d / "missing").string()), std::system_error);
  const std::string empty = (d / "empty").string();
  { std::ofstream f(empty); }
  EXPECT_THROW(safetensors_reader{empty}, format_error);
  EXPECT_THROW(safetensors_reader{d.string()}, format_error);  // a directory
  fs::remove_all(d);
}
