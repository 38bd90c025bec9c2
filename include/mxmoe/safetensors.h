// mxmoe/safetensors.h — reading and writing safetensors files (https://huggingface.co/docs/safetensors).
//
// Reader: the file is memory-mapped read-only and only the header is parsed up front, so tensor
// bytes are paged in when a tensor is used. read() copies bytes with pread instead, for streaming
// a file larger than memory: pages read that way are never mapped into the process, so they do not
// accumulate in its resident set as the mapped pages of a whole-file pass do. Every header field is validated before any tensor is
// handed out: header length against the file size, JSON syntax, dtype (BF16 F16 F32 U8 I32 I64),
// shape product x dtype size == end - begin, offsets inside the data section, no two tensors
// overlapping, "__metadata__" a map of strings. Anything else throws mxmoe::format_error naming
// the file, the tensor and what is wrong; no input makes the reader read outside the file.
// Gaps between tensors are tolerated (some writers align tensors).
//
// Writer: every tensor is declared up front (the header comes first in the file), then data is
// written in any order (a tensor may be written in pieces, e.g. one expert at a time; write() may
// be called from several threads at once) into an unnamed temporary file in the output's
// directory (O_TMPFILE): it has no name until commit() links it, so no temporary survives even
// a SIGKILL. commit() checks that every byte was written, fsyncs and links the file into place
// (with overwrite: under a temporary name, renamed over the output at once). Without commit()
// (an error, an exception, a killed process) the file vanishes and an existing output is never
// touched. Where the file system has no O_TMPFILE, a named temporary ".NAME.tmp-XXXXXX" next to
// the output is used instead and removed on failure (not after a SIGKILL); temp_path() names it.
// Write-back of each written piece starts at once (sync_file_range), so that the fsync at
// commit() has little left to do.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "mxmoe/dtype.h"

namespace mxmoe {

// A malformed file: names the file, the tensor (empty for header-level problems) and the defect.
class format_error : public std::runtime_error {
 public:
  format_error(std::string file, std::string tensor, const std::string& what);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }

 private:
  std::string file_, tensor_;
};

// safetensors dtype names ("BF16", ...) <-> mxmoe::dtype. Unknown names return false.
bool dtype_from_safetensors(std::string_view name, dtype* out);
const char* safetensors_dtype_name(dtype t);

struct safetensors_entry {
  std::string name;
  dtype type = dtype::u8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  uint64_t nbytes() const { return end - begin; }
};

class safetensors_reader {
 public:
  // Maps and validates `path`. Throws format_error (malformed) or std::system_error (I/O).
  explicit safetensors_reader(const std::string& path);
  // Validates an in-memory image that the caller keeps alive (fuzzing, tests); `name` is used in
  // error messages.
  safetensors_reader(std::span<const uint8_t> bytes, std::string name);
  ~safetensors_reader();
  safetensors_reader(safetensors_reader&&) noexcept;
  safetensors_reader& operator=(safetensors_reader&&) noexcept;
  safetensors_reader(const safetensors_reader&) = delete;
  safetensors_reader& operator=(const safetensors_reader&) = delete;

  const std::string& path() const { return path_; }
  // Entries in file (offset) order.
  const std::vector<safetensors_entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  // nullptr when absent.
  const safetensors_entry* find(std::string_view name) const;
  // Throws format_error naming the tensor when absent.
  const safetensors_entry& entry(std::string_view name) const;
  // A contiguous read-only view into the mapping (writing through it faults).
  tensor_view tensor(std::string_view name) const;
  tensor_view tensor(const safetensors_entry& e) const;
  std::span<const uint8_t> bytes(const safetensors_entry& e) const;
  // Copies `size` bytes from byte `offset` of the tensor's data into `dst` (pread on a file;
  // memcpy for an in-memory image). Throws mxmoe::invalid_argument for a range outside the tensor,
  // std::system_error for a failed read.
  void read(const safetensors_entry& e, uint64_t offset, size_t size, void* dst) const;

 private:
  void parse();
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  int fd_ = -1;  // kept open for read()
  uint64_t data_offset_ = 0;
  std::vector<safetensors_entry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

struct tensor_decl {
  std::string name;
  dtype type = dtype::u8;
  std::vector<int64_t> shape;
};

class safetensors_writer {
 public:
  // Validates the declarations (unique non-empty names, non-negative dims) and, unless
  // `overwrite`, that `path` does not exist — all before creating anything. Tensors are laid out
  // contiguously, widest element type first (declaration order within a type), so every tensor
  // is aligned to its element size; the header is padded with spaces to 8 bytes.
  safetensors_writer(std::string path, std::vector<tensor_decl> tensors,
                     std::map<std::string, std::string> metadata = {}, bool overwrite = false);
  ~safetensors_writer();  // removes the temporary file unless committed
  safetensors_writer(const safetensors_writer&) = delete;
  safetensors_writer& operator=(const safetensors_writer&) = delete;

  // Writes `bytes` at byte `offset` of tensor `name`. Pieces must not overlap. Thread-safe.
  void write(std::string_view name, const void* data, size_t bytes, uint64_t offset = 0);
  // Every byte of every tensor written? Then fsync, rename over the output, fsync the directory.
  // Large outputs are synced in the background as they are written (every kFlushBytes), so that
  // the device writes while the caller computes and commit() finds little to wait for.
  void commit();
  const std::string& path() const { return path_; }
  // The named temporary file; empty when the temporary is unnamed (O_TMPFILE).
  const std::string& temp_path() const { return temp_path_; }

 private:
  struct slot {
    tensor_decl decl;
    uint64_t begin = 0, size = 0;
    std::map<uint64_t, uint64_t> written;  // disjoint [begin, end) ranges within the tensor
  };
  void link_into_place();
  void flush_in_background();
  void stop_flusher();
  std::string path_, temp_path_;
  bool overwrite_ = false, committed_ = false;
  bool failed_write_ = false;  // a write() threw after claiming its range
  std::mutex mutex_;           // guards the slots' `written` ranges and failed_write_
  int fd_ = -1;
  uint64_t data_offset_ = 0;
  std::vector<slot> slots_;
  std::map<std::string, size_t, std::less<>> index_;
  // The background sync (its own lock: a sync may take long and must not hold up write()).
  std::mutex flush_mutex_;
  std::condition_variable flush_wake_;
  std::thread flusher_;
  uint64_t unflushed_ = 0;
  bool flush_requested_ = false, flusher_stop_ = false;
  int flush_errno_ = 0;  // the first failed background sync: commit() fails with it
};

// Convenience: writes whole in-memory tensors (views must be contiguous, host) in one go.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, tensor_view>>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, bool overwrite = false);

}  // namespace mxmoe
