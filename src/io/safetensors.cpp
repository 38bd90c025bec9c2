// safetensors reader (mmap, validate-everything-first) and writer (temporary file, fsync,
// rename). Limits: little-endian hosts only (as the format); headers above 100 MiB are refused.
#include "mxmoe/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "mxmoe/error.h"

namespace mxmoe {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
constexpr int kMaxJsonDepth = 3;                    // {tensor: {"shape": [..]}}
constexpr size_t kWriteBackBytes = 1u << 20;         // pieces from which write-back starts at once
constexpr uint64_t kFlushBytes = 256ull << 20;        // written bytes between background syncs

std::string describe(const std::string& file, const std::string& tensor, const std::string& what) {
  std::string s = file + ": ";
  if (!tensor.empty()) s += "tensor '" + tensor + "': ";
  return s + what;
}

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  throw std::system_error(errno, std::generic_category(), what + " '" + path + "'");
}

// Nesting depth of a JSON text, outside strings. Refusing deep nesting up front keeps the JSON
// library's recursive destructor and our walk bounded on hostile input.
int json_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') max_depth = std::max(max_depth, ++depth);
    else if (c == '}' || c == ']') --depth;
  }
  return max_depth;
}

// A non-negative integer field that fits in int64.
bool as_count(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return *out <= static_cast<uint64_t>(INT64_MAX);
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

void write_all(int fd, const void* data, size_t bytes, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

format_error::format_error(std::string file, std::string tensor, const std::string& what)
    : std::runtime_error(describe(file, tensor, what)), file_(std::move(file)), tensor_(std::move(tensor)) {}

bool dtype_from_safetensors(std::string_view name, dtype* out) {
  static const std::pair<std::string_view, dtype> kNames[] = {
      {"BF16", dtype::bf16}, {"F16", dtype::f16}, {"F32", dtype::f32},
      {"U8", dtype::u8},     {"I32", dtype::i32}, {"I64", dtype::i64}};
  for (const auto& [n, t] : kNames)
    if (n == name) {
      *out = t;
      return true;
    }
  return false;
}

const char* safetensors_dtype_name(dtype t) {
  switch (t) {
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
    case dtype::f32: return "F32";
    case dtype::u8: return "U8";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
  }
  return "?";
}

// ---- reader ------------------------------------------------------------------------------

safetensors_reader::safetensors_reader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw_errno("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw format_error(path, "", "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw_errno("cannot map", path);
    }
    base_ = static_cast<const uint8_t*>(p);
    mapped_ = true;
  }
  fd_ = fd;
  try {
    parse();
  } catch (...) {
    if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
    ::close(fd_);
    throw;
  }
}

safetensors_reader::safetensors_reader(std::span<const uint8_t> bytes, std::string name)
    : path_(std::move(name)), base_(bytes.data()), size_(bytes.size()) {
  parse();
}

safetensors_reader::~safetensors_reader() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

safetensors_reader::safetensors_reader(safetensors_reader&& o) noexcept
    : path_(std::move(o.path_)), base_(o.base_), size_(o.size_), mapped_(o.mapped_), fd_(o.fd_),
      data_offset_(o.data_offset_), entries_(std::move(o.entries_)), index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {
  o.mapped_ = false;
  o.base_ = nullptr;
  o.fd_ = -1;
}

safetensors_reader& safetensors_reader::operator=(safetensors_reader&& o) noexcept {
  if (this != &o) {
    if (mapped_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
    path_ = std::move(o.path_);
    base_ = o.base_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    data_offset_ = o.data_offset_;
    entries_ = std::move(o.entries_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.mapped_ = false;
    o.base_ = nullptr;
  }
  return *this;
}

void safetensors_reader::parse() {
  if (size_ < 8)
    throw format_error(path_, "", "file is " + std::to_string(size_) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];
  if (header_len > size_ - 8)
    throw format_error(path_, "", "header length " + std::to_string(header_len) + " exceeds the " +
                                      std::to_string(size_ - 8) + " bytes that follow it");
  if (header_len > kMaxHeaderBytes)
    throw format_error(path_, "", "header length " + std::to_string(header_len) + " exceeds the 100 MiB limit");
  data_offset_ = 8 + header_len;
  const uint64_t data_size = size_ - data_offset_;
  const std::string_view text(reinterpret_cast<const char*>(base_ + 8), header_len);
  if (json_depth(text) > kMaxJsonDepth)
    throw format_error(path_, "", "header JSON nests deeper than a safetensors header can");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw format_error(path_, "", std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw format_error(path_, "", "header is not a JSON object");

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw format_error(path_, "", "__metadata__ is not an object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw format_error(path_, "", "__metadata__ value of '" + k + "' is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) throw format_error(path_, "", "a tensor has an empty name");
    if (!value.is_object()) throw format_error(path_, name, "entry is not an object");
    const auto dt = value.find("dtype");
    const auto sh = value.find("shape");
    const auto off = value.find("data_offsets");
    if (dt == value.end() || sh == value.end() || off == value.end())
      throw format_error(path_, name, "entry lacks one of dtype, shape, data_offsets");
    if (!dt->is_string()) throw format_error(path_, name, "dtype is not a string");
    safetensors_entry e;
    e.name = name;
    if (!dtype_from_safetensors(dt->get<std::string>(), &e.type))
      throw format_error(path_, name, "unsupported dtype '" + dt->get<std::string>() +
                                          "' (supported: BF16, F16, F32, U8, I32, I64)");
    if (!sh->is_array()) throw format_error(path_, name, "shape is not an array");
    uint64_t bytes = static_cast<uint64_t>(dtype_size(e.type));
    bool overflow = false;
    for (const auto& d : *sh) {
      uint64_t v = 0;
      if (!as_count(d, &v)) throw format_error(path_, name, "shape has an entry that is not a non-negative integer");
      e.shape.push_back(static_cast<int64_t>(v));
      overflow = __builtin_mul_overflow(bytes, v, &bytes) || overflow;
    }
    if (!off->is_array() || off->size() != 2) throw format_error(path_, name, "data_offsets is not a pair");
    if (!as_count((*off)[0], &e.begin) || !as_count((*off)[1], &e.end))
      throw format_error(path_, name, "data_offsets are not non-negative integers");
    if (e.begin > e.end) throw format_error(path_, name, "data_offsets begin > end");
    if (e.end > data_size)
      throw format_error(path_, name, "data_offsets end " + std::to_string(e.end) + " lies past the " +
                                          std::to_string(data_size) + "-byte data section (truncated file?)");
    if (overflow || bytes != e.nbytes())
      throw format_error(path_, name, "shape " + shape_string(e.shape) + " of " + safetensors_dtype_name(e.type) +
                                          " does not match its " + std::to_string(e.nbytes()) + " bytes");
    entries_.push_back(std::move(e));
  }

  std::sort(entries_.begin(), entries_.end(), [](const safetensors_entry& a, const safetensors_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const safetensors_entry* prev = nullptr;
  for (const auto& e : entries_) {
    if (e.nbytes() == 0) continue;
    if (prev && prev->end > e.begin)
      throw format_error(path_, e.name, "data overlaps tensor '" + prev->name + "'");
    prev = &e;
  }
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
}

bool safetensors_reader::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

const safetensors_entry* safetensors_reader::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const safetensors_entry& safetensors_reader::entry(std::string_view name) const {
  const auto* e = find(name);
  if (!e) throw format_error(path_, std::string(name), "no such tensor");
  return *e;
}

std::span<const uint8_t> safetensors_reader::bytes(const safetensors_entry& e) const {
  return {base_ + data_offset_ + e.begin, static_cast<size_t>(e.nbytes())};
}

void safetensors_reader::read(const safetensors_entry& e, uint64_t offset, size_t size, void* dst) const {
  MXMOE_CHECK_ARG(offset <= e.nbytes() && size <= e.nbytes() - offset, e.name + " read",
                  "a range within its " + std::to_string(e.nbytes()) + " bytes",
                  "[" + std::to_string(offset) + ", " + std::to_string(offset + size) + ")");
  const uint64_t at = data_offset_ + e.begin + offset;
  if (fd_ < 0) {
    std::memcpy(dst, base_ + at, size);
    return;
  }
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pread(fd_, p + done, size - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("cannot read", path_);
    if (n == 0) throw format_error(path_, e.name, "file ends early (truncated while being read?)");
    done += static_cast<size_t>(n);
  }
}

tensor_view safetensors_reader::tensor(const safetensors_entry& e) const {
  const uint8_t* p = base_ + data_offset_ + e.begin;
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(dtype_size(e.type)) != 0)
    throw format_error(path_, e.name, "data is not aligned to its " + std::to_string(dtype_size(e.type)) +
                                          "-byte element size");
  return tensor_view(p, e.type, e.shape);
}

tensor_view safetensors_reader::tensor(std::string_view name) const { return tensor(entry(name)); }

// ---- writer ------------------------------------------------------------------------------

safetensors_writer::safetensors_writer(std::string path, std::vector<tensor_decl> tensors,
                                       std::map<std::string, std::string> metadata, bool overwrite)
    : path_(std::move(path)), overwrite_(overwrite) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Widest elements first: every tensor's size is a multiple of its element size, so all data
  // stays aligned without gaps (which strict readers refuse).
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const tensor_decl& a, const tensor_decl& b) { return dtype_size(a.type) > dtype_size(b.type); });
  uint64_t offset = 0;
  for (auto& t : tensors) {
    MXMOE_CHECK_ARG(!t.name.empty() && t.name != "__metadata__", "tensor name", "a non-empty name other than __metadata__",
                    "'" + t.name + "'");
    MXMOE_CHECK_ARG(!index_.count(t.name), "tensor name", "unique names", "'" + t.name + "' twice");
    uint64_t n = static_cast<uint64_t>(dtype_size(t.type));
    for (int64_t d : t.shape) {
      MXMOE_CHECK_ARG(d >= 0, t.name + " shape", "non-negative dimensions", shape_string(t.shape));
      n *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", safetensors_dtype_name(t.type)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    index_.emplace(t.name, slots_.size());
    slots_.push_back({std::move(t), offset, n, {}});
    offset += n;
  }
  MXMOE_CHECK_ARG(overwrite_ || !std::filesystem::exists(path_), "output",
                  "a path that does not exist (or overwrite, --force)", "existing file '" + path_ + "'");

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  data_offset_ = 8 + text.size();

  const std::filesystem::path out(path_);
  const std::filesystem::path dir = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
  fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
  if (fd_ < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE on this file system: a named temporary, which a SIGKILL would leave behind.
    std::string temp_name(".");
    temp_name.append(out.filename().string()).append(".tmp-XXXXXX");
    std::string templ = (dir / temp_name).string();
    fd_ = ::mkstemp(templ.data());
    if (fd_ >= 0) {
      temp_path_ = templ;
      ::fchmod(fd_, 0644);
    }
  }
  if (fd_ < 0) throw_errno("cannot create a temporary file next to", path_);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  try {
    write_all(fd_, len, 8, 0, temp_path_);
    write_all(fd_, text.data(), text.size(), 8, temp_path_);
  } catch (...) {
    ::close(fd_);
    if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
    throw;
  }
}

safetensors_writer::~safetensors_writer() {
  stop_flusher();
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void safetensors_writer::write(std::string_view name, const void* data, size_t bytes, uint64_t offset) {
  const auto it = index_.find(name);
  MXMOE_CHECK_ARG(it != index_.end(), "tensor name", "a declared tensor", "'" + std::string(name) + "'");
  slot& s = slots_[it->second];
  MXMOE_CHECK_ARG(offset <= s.size && bytes <= s.size - offset, s.decl.name + " write",
                  "a range within its " + std::to_string(s.size) + " bytes",
                  "[" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ")");
  if (bytes == 0) return;
  const uint64_t end = offset + bytes;
  {
    // The range is claimed before the bytes go out, so that threads write their pieces at once.
    std::lock_guard<std::mutex> lock(mutex_);
    MXMOE_CHECK_ARG(!committed_ && fd_ >= 0, "writer", "an open writer", "a committed one");
    auto next = s.written.lower_bound(offset);
    const bool overlaps_next = next != s.written.end() && next->first < end;
    const bool overlaps_prev = next != s.written.begin() && std::prev(next)->second > offset;
    MXMOE_CHECK_ARG(!overlaps_next && !overlaps_prev, s.decl.name + " write", "a range not written before",
                    "[" + std::to_string(offset) + ", " + std::to_string(end) + ")");
    uint64_t b = offset, e = end;
    if (next != s.written.begin() && std::prev(next)->second == b) {
      b = std::prev(next)->first;
      s.written.erase(std::prev(next));
    }
    if (next != s.written.end() && next->first == e) {
      e = next->second;
      s.written.erase(next);
    }
    s.written[b] = e;
  }
  const uint64_t at = data_offset_ + s.begin + offset;
  try {
    write_all(fd_, data, bytes, at, temp_path_.empty() ? path_ : temp_path_);
  } catch (...) {
    // The range was claimed as written: commit() must not trust the claims any more.
    std::lock_guard<std::mutex> lock(mutex_);
    failed_write_ = true;
    throw;
  }
  // Start write-back now (without waiting for it): the fsync at commit() then finds little dirty.
  if (bytes >= kWriteBackBytes) ::sync_file_range(fd_, static_cast<off_t>(at), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
  std::lock_guard<std::mutex> lock(flush_mutex_);
  unflushed_ += bytes;
  if (unflushed_ >= kFlushBytes) {
    unflushed_ = 0;
    flush_requested_ = true;
    if (!flusher_.joinable()) flusher_ = std::thread([this] { flush_in_background(); });
    flush_wake_.notify_one();
  }
}

// sync_file_range only starts write-back (and is a no-op on some file systems and sandboxes): a
// real sync as the data arrives keeps the dirty bytes bounded and the commit short.
void safetensors_writer::flush_in_background() {
  std::unique_lock<std::mutex> lock(flush_mutex_);
  for (;;) {
    flush_wake_.wait(lock, [&] { return flush_requested_ || flusher_stop_; });
    if (!flush_requested_) return;
    flush_requested_ = false;
    lock.unlock();
    const int rc = ::fdatasync(fd_);
    const int err = errno;
    lock.lock();
    if (rc != 0 && flush_errno_ == 0) flush_errno_ = err;
  }
}

void safetensors_writer::stop_flusher() {
  {
    std::lock_guard<std::mutex> lock(flush_mutex_);
    flusher_stop_ = true;
    flush_requested_ = false;
  }
  flush_wake_.notify_one();
  if (flusher_.joinable()) flusher_.join();
}

// The synced temporary becomes `path_`: an unnamed one is linked (under its final name, or, to
// replace an output, under a temporary name renamed over it at once); a named one is renamed.
void safetensors_writer::link_into_place() {
  if (!temp_path_.empty()) {
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) throw_errno("cannot rename the temporary file to", path_);
    return;
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
  if (!overwrite_) {
    // linkat refuses an existing name: the output appearing meanwhile is never replaced.
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path_.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      if (errno == EEXIST)
        throw invalid_argument("output", "a path that does not exist (or overwrite, --force)", "existing file '" + path_ + "'");
      throw_errno("cannot link the temporary file to", path_);
    }
    return;
  }
  const std::filesystem::path out(path_);
  const std::string link = (out.parent_path() / ("." + out.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                                                 "-" + std::to_string(fd_)))
                               .string();
  ::unlink(link.c_str());  // a leftover of a killed process with the same pid
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, link.c_str(), AT_SYMLINK_FOLLOW) != 0)
    throw_errno("cannot link the temporary file next to", path_);
  if (::rename(link.c_str(), path_.c_str()) != 0) {
    ::unlink(link.c_str());
    throw_errno("cannot rename the temporary file to", path_);
  }
}

void safetensors_writer::commit() {
  MXMOE_CHECK_ARG(!committed_ && fd_ >= 0, "writer", "an open writer", "a committed one");
  MXMOE_CHECK_ARG(!failed_write_, "writer", "every write() to have succeeded", "a failed write");
  for (const auto& s : slots_) {
    const uint64_t done = s.written.empty() ? 0 : s.written.begin()->second - s.written.begin()->first;
    MXMOE_CHECK_ARG(s.size == 0 || (s.written.size() == 1 && done == s.size), s.decl.name,
                    "all " + std::to_string(s.size) + " bytes written", "an incomplete tensor");
  }
  const std::string& temp = temp_path_.empty() ? path_ : temp_path_;
  stop_flusher();
  // A failed background sync may have consumed the error the fsync below would report.
  if (flush_errno_ != 0) {
    errno = flush_errno_;
    throw_errno("cannot sync", temp);
  }
  if (::fsync(fd_) != 0) throw_errno("cannot sync", temp);
  MXMOE_CHECK_ARG(overwrite_ || !std::filesystem::exists(path_), "output",
                  "a path that does not exist (or overwrite, --force)", "existing file '" + path_ + "'");
  link_into_place();
  committed_ = true;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno("cannot close", path_);
  const std::filesystem::path out(path_);
  const std::string dir = out.has_parent_path() ? out.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, tensor_view>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool overwrite) {
  std::vector<tensor_decl> decls;
  for (const auto& [name, v] : tensors) {
    MXMOE_CHECK_ARG(v.device == device_kind::cpu && v.contiguous(), name, "a contiguous host tensor",
                    "a strided or device tensor");
    decls.push_back({name, v.type, v.shape});
  }
  safetensors_writer w(path, std::move(decls), metadata, overwrite);
  for (const auto& [name, v] : tensors) w.write(name, v.data, v.nbytes());
  w.commit();
}

}  // namespace mxmoe
