// Streaming checkpoint conversion (include/mxmoe/convert.h). Built into the top library (it
// quantizes through the CPU quantizer and the CUDA pipeline), beside the checkpoint reader it
// stands on.
#include "mxmoe/convert.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "mxmoe/checkpoint.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/safetensors.h"

namespace mxmoe {
namespace {

constexpr size_t kCopyChunk = 64u << 20;           // bytes per read and write when copying a tensor
constexpr uint64_t kWorkerMemory = 3ull << 29;     // buffers of all cpu workers together (1.5 GiB)
constexpr int kPipelineSlots = 3;                  // matrices in flight on the GPU
constexpr int kReaders = 4;                        // threads reading each matrix on the cuda path

void copy_tensor(const safetensors_reader& r, const safetensors_entry& e, safetensors_writer& w, std::vector<uint8_t>& buf) {
  for (uint64_t off = 0; off < e.nbytes(); off += kCopyChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, e.nbytes() - off));
    buf.resize(std::max(buf.size(), n));
    r.read(e, off, n, buf.data());
    w.write(e.name, buf.data(), n, off);
  }
}

// Output declarations: each layer's expert tensors replaced (at the first of them) by
// `replacement(layer)`, every other tensor kept in file order.
template <class Replace>
std::vector<tensor_decl> output_decls(const safetensors_reader& r, const std::vector<checkpoint::moe_layer_info>& layers,
                                      Replace replacement) {
  std::map<std::string, size_t> owner;
  for (size_t i = 0; i < layers.size(); ++i)
    for (const auto& n : layers[i].expert_tensors) owner[n] = i;
  std::set<size_t> emitted;
  std::vector<tensor_decl> decls;
  for (const auto& e : r.entries()) {
    const auto it = owner.find(e.name);
    if (it == owner.end()) {
      decls.push_back({e.name, e.type, e.shape});
    } else if (emitted.insert(it->second).second) {
      for (auto& d : replacement(layers[it->second])) decls.push_back(std::move(d));
    }
  }
  return decls;
}

// Every layer's expert tensors, built once: a per-expert checkpoint (Qwen3, DeepSeek) has tens of
// thousands of them, and each file entry is looked up.
std::set<std::string> expert_tensor_set(const std::vector<checkpoint::moe_layer_info>& layers) {
  std::set<std::string> names;
  for (const auto& l : layers) names.insert(l.expert_tensors.begin(), l.expert_tensors.end());
  return names;
}

std::string expert_note(const checkpoint::moe_layer_info& l, int64_t expert) {
  return "layer " + std::to_string(l.layer) + " expert " + std::to_string(expert);
}

// Steps of a conversion: the copied tensors, then the experts. Experts finish out of order on
// several threads; they are reported in order (an expert once every earlier one is done), one
// call at a time, so the callback sees done = 1, 2, ... total.
class progress {
 public:
  progress(const progress_callback& cb, const safetensors_reader& r, const std::vector<checkpoint::moe_layer_info>& layers,
           const std::set<std::string>& expert_tensors)
      : cb_(cb) {
    for (const auto& e : r.entries()) {
      bytes_total_ += e.nbytes();
      if (!expert_tensors.count(e.name)) ++total_;
    }
    for (const auto& l : layers) {
      total_ += l.shape.experts;
      for (int64_t e = 0; e < l.shape.experts; ++e) experts_.push_back({expert_note(l, e), 0, 0});
    }
  }
  void copied(const safetensors_entry& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_done_ += e.nbytes();
    report(e.name);
  }
  // Matrix `part` (of `parts`) of expert `index` (in conversion order) is done, `bytes` read for it.
  void matrix_done(size_t index, int parts, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    experts_[index].parts += 1;
    experts_[index].bytes += bytes;
    for (; next_ < experts_.size() && experts_[next_].parts == parts; ++next_) {
      bytes_done_ += experts_[next_].bytes;
      report(experts_[next_].note);
    }
  }

 private:
  void report(const std::string& note) {
    ++done_;
    if (cb_) cb_({done_, total_, note, bytes_done_, bytes_total_});
  }
  struct expert {
    std::string note;
    int parts;
    uint64_t bytes;
  };
  const progress_callback& cb_;
  std::mutex mutex_;
  std::vector<expert> experts_;
  size_t next_ = 0;
  int64_t done_ = 0, total_ = 0;
  uint64_t bytes_done_ = 0, bytes_total_ = 0;
};

// One expert matrix to quantize, and where its codes and scales go.
struct matrix_job {
  checkpoint::expert_matrix m;
  size_t expert_index = 0;  // in conversion order (progress)
  size_t tensor = 0;        // index of its tensor_report
  int64_t expert = 0;
  std::string blocks, scales;
  uint64_t blocks_at = 0, scales_at = 0;
  int64_t elements() const { return m.source.size(); }
};

std::vector<matrix_job> matrix_jobs(const safetensors_reader& r, const std::vector<checkpoint::moe_layer_info>& layers) {
  std::vector<matrix_job> jobs;
  size_t expert_index = 0;
  for (size_t li = 0; li < layers.size(); ++li) {
    const auto& l = layers[li];
    const auto names = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    for (int64_t ex = 0; ex < l.shape.experts; ++ex, ++expert_index)
      for (const bool is_gu : {true, false}) {
        const layout::checkpoint_mxfp4& g = is_gu ? gu : dn;
        jobs.push_back({checkpoint::expert_matrix_of(r, l, ex, is_gu), expert_index, 2 * li + (is_gu ? 0 : 1), ex,
                        is_gu ? names.gate_up_blocks : names.down_blocks, is_gu ? names.gate_up_scales : names.down_scales,
                        static_cast<uint64_t>(g.code_offset(ex, 0, 0).byte), static_cast<uint64_t>(g.scale_offset(ex, 0, 0))});
      }
  }
  return jobs;
}

// The matrix's pieces, read back to back into `raw`; their addresses in `pieces`.
void read_matrix(const safetensors_reader& r, const checkpoint::expert_matrix& m, uint8_t* raw,
                 std::vector<const uint8_t*>& pieces) {
  pieces.clear();
  for (const auto& p : m.pieces) {
    r.read(*p.entry, p.offset, static_cast<size_t>(p.bytes), raw);
    pieces.push_back(raw);
    raw += p.bytes;
  }
}

// The first NaN / Inf of the matrix in file order (its quantization found one), as an error.
[[noreturn]] void refuse_nonfinite(const matrix_job& j, const uint8_t* raw) {
  for (const auto& p : j.m.pieces) {
    const int64_t n = p.rows * p.cols;
    for (int64_t i = 0; i < n; ++i) {
      const float v = load_float(raw, j.m.type, i);
      if (std::isfinite(v)) continue;
      throw nonfinite_error(p.entry->name, "finite weights (allow_nonfinite, --allow-nonfinite, keeps them as NaN blocks)",
                            std::string(std::isnan(v) ? "NaN" : "Inf") + " at [" + std::to_string(i / p.cols) + ", " +
                                std::to_string(i % p.cols) + "] of expert " + std::to_string(j.expert) + " (" +
                                shape_string({p.rows, p.cols}) + ")");
    }
    raw += p.bytes;
  }
  throw std::logic_error("quantization counted a non-finite block in " + j.m.pieces.front().entry->name +
                         " but its bytes hold none");
}

// The first failure by job order: jobs are taken in order, so every job before a failed one has
// been taken and finishes, and the lowest failing job is found however the threads ran.
class first_failure {
 public:
  void record(size_t job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_ || job < job_) {
      error_ = std::current_exception();
      job_ = job;
    }
    failed_ = true;
  }
  bool failed() const { return failed_; }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  size_t job_ = 0;
  std::atomic<bool> failed_{false};
};

// Seconds spent per stage of a conversion, summed over threads, printed to stderr at the end when
// MXMOE_CONVERT_PROFILE is set: how the pipeline's time divides (docs/performance.md).
class stage_profile {
 public:
  enum stage { setup, copy, read, submit, slot_wait, gpu_wait, write, commit, count };
  static constexpr const char* kNames[count] = {"setup", "copy", "read", "submit", "slot_wait", "gpu_wait", "write", "commit"};
  class timer {
   public:
    timer(stage_profile& p, stage s) : p_(p), s_(s), t0_(std::chrono::steady_clock::now()) {}
    ~timer() { p_.ns_[s_] += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(); }
    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;

   private:
    stage_profile& p_;
    stage s_;
    std::chrono::steady_clock::time_point t0_;
  };
  void print(double wall) const {
    if (!std::getenv("MXMOE_CONVERT_PROFILE")) return;
    std::string line = "mxmoe convert profile (s, summed over threads): wall " + std::to_string(wall);
    for (int s = 0; s < count; ++s)  // stages this path does not have (the cpu path's read, gpu_wait, ...) left out
      if (ns_[s].load() > 0) line += std::string(", ") + kNames[s] + " " + std::to_string(ns_[s].load() * 1e-9);
    std::fprintf(stderr, "%s\n", line.c_str());
  }

 private:
  std::array<std::atomic<int64_t>, count> ns_{};
};

// A few threads that run the pieces of one task together: run(n, fn) calls fn(0) .. fn(n - 1) on
// the pool's threads and the caller's, returns once all are done and rethrows the first failure.
// One thread copying from the page cache runs at a fraction of what the host's memory does, so
// the cuda path reads each matrix in parallel chunks (writes are not split: one file's buffered
// writes serialize in the kernel, measured in docs/performance.md).
class chunk_pool {
 public:
  explicit chunk_pool(int threads) {
    for (int t = 1; t < threads; ++t) pool_.emplace_back([this] { serve(); });
  }
  ~chunk_pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : pool_) t.join();
  }
  chunk_pool(const chunk_pool&) = delete;
  chunk_pool& operator=(const chunk_pool&) = delete;

  void run(size_t n, const std::function<void(size_t)>& fn) {
    std::unique_lock<std::mutex> lock(mutex_);
    fn_ = &fn;
    count_ = n;
    next_ = 0;
    pending_ = n;
    error_ = nullptr;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    work();
    lock.lock();
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      size_t i;
      const std::function<void(size_t)>* fn;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (next_ >= count_) return;
        i = next_++;
        fn = fn_;
      }
      std::exception_ptr failed;
      try {
        (*fn)(i);
      } catch (...) {
        failed = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed && !error_) error_ = failed;
      if (--pending_ == 0) done_.notify_all();
    }
  }
  void serve() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }
  std::vector<std::thread> pool_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t count_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

constexpr uint64_t kIoChunk = 4u << 20;  // bytes per piece of a parallel read

// The pieces of `m`, back to back into `dst`, read in kIoChunk pieces by the pool.
void read_matrix_parallel(const safetensors_reader& r, const checkpoint::expert_matrix& m, uint8_t* dst, chunk_pool& pool) {
  struct chunk {
    const safetensors_entry* entry;
    uint64_t offset;
    size_t bytes;
    uint8_t* dst;
  };
  std::vector<chunk> chunks;
  for (const auto& p : m.pieces) {
    for (uint64_t off = 0; off < p.bytes; off += kIoChunk)
      chunks.push_back({p.entry, p.offset + off, static_cast<size_t>(std::min<uint64_t>(kIoChunk, p.bytes - off)), dst + off});
    dst += p.bytes;
  }
  pool.run(chunks.size(), [&](size_t i) { r.read(*chunks[i].entry, chunks[i].offset, chunks[i].bytes, chunks[i].dst); });
}

// What every path does with a quantized matrix: refuse NaN / Inf, write codes and scales, keep the
// statistics for the in-order merge, report progress.
struct job_sink {
  const std::vector<matrix_job>& jobs;
  const quantize_options& options;
  safetensors_writer& w;
  progress& prog;
  std::vector<quant_stats>& stats;

  void finish(size_t j, const quant_stats& st, const uint8_t* raw, const uint8_t* packed, const uint8_t* scales) {
    const matrix_job& job = jobs[j];
    if (st.nonfinite_blocks > 0 && !options.allow_nonfinite) refuse_nonfinite(job, raw);
    w.write(job.blocks, packed, static_cast<size_t>(job.elements() / 2), job.blocks_at);
    w.write(job.scales, scales, static_cast<size_t>(job.elements() / mx::kBlockSize), job.scales_at);
    stats[j] = st;
    prog.matrix_done(job.expert_index, 2, job.m.bytes());
  }
};

// What one CPU worker holds for a matrix: the bytes read, one band of reordered rows, and the
// codes and scales of the whole matrix (0.53 bytes per element) until they are written.
uint64_t cpu_worker_bytes(const matrix_job& j) {
  const uint64_t band = static_cast<uint64_t>(cpu::quantize_chunk_rows(j.m.source.cols) * j.m.source.cols) *
                        static_cast<uint64_t>(dtype_size(j.m.type));
  const uint64_t elements = static_cast<uint64_t>(j.elements());
  return j.m.bytes() + band + elements / 2 + elements / mx::kBlockSize;
}

int cpu_workers(const quantize_options& o, const std::vector<matrix_job>& jobs) {
  uint64_t per_worker = 1;
  for (const auto& j : jobs) per_worker = std::max(per_worker, cpu_worker_bytes(j));
  const int cores = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int by_memory = static_cast<int>(std::max<uint64_t>(1, kWorkerMemory / per_worker));
  return std::clamp(std::min(cores, by_memory), 1, static_cast<int>(std::max<size_t>(1, jobs.size())));
}

// One matrix on the calling thread, in bands of the quantizer's chunk rows: each band is reordered
// (unless the file already stores rows) and quantized while it is in cache, and the bands'
// statistics merged in order are those of one quantize call on the whole matrix (the converter's
// output and report do not depend on the banding).
quant_stats quantize_matrix(const matrix_job& job, mx::scale_rule rule, const std::vector<const uint8_t*>& pieces,
                            std::vector<uint8_t>& band_buf, uint8_t* packed, uint8_t* scales) {
  const layout::matrix_source& s = job.m.source;
  const int64_t band = cpu::quantize_chunk_rows(s.cols);
  const size_t row_bytes = static_cast<size_t>(s.cols * dtype_size(job.m.type));
  const bool reorder = s.order != layout::source_order::row_major;
  if (reorder) band_buf.resize(std::max(band_buf.size(), static_cast<size_t>(band) * row_bytes));
  quant_stats st;
  for (int64_t n0 = 0; n0 < s.rows; n0 += band) {
    const int64_t n = std::min(band, s.rows - n0);
    const uint8_t* x = pieces.front() + static_cast<size_t>(n0) * row_bytes;
    if (reorder) {
      checkpoint::reorder_rows(job.m, pieces.data(), n0, n0 + n, band_buf.data());
      x = band_buf.data();
    }
    // One thread per matrix: the workers are the parallelism.
    st.merge(cpu::quantize(tensor_view(x, job.m.type, {n, s.cols}), rule, scale_layout::linear,
                           tensor_view(packed + n0 * s.cols / 2, dtype::u8, {n, s.cols / 2}),
                           tensor_view(scales + n0 * s.cols / mx::kBlockSize, dtype::u8, {n, s.cols / mx::kBlockSize}), 1));
  }
  return st;
}

void quantize_on_cpu(const safetensors_reader& r, const std::vector<matrix_job>& jobs, job_sink& sink, int workers) {
  std::atomic<size_t> next{0};
  first_failure failure;
  const auto worker = [&] {
    std::vector<uint8_t> raw, band, packed, scales;
    std::vector<const uint8_t*> pieces;
    for (size_t j = next++; j < jobs.size() && !failure.failed(); j = next++) {
      try {
        const matrix_job& job = jobs[j];
        raw.resize(std::max(raw.size(), static_cast<size_t>(job.m.bytes())));
        read_matrix(r, job.m, raw.data(), pieces);
        packed.resize(static_cast<size_t>(job.elements() / 2));
        scales.resize(static_cast<size_t>(job.elements() / mx::kBlockSize));
        const quant_stats st = quantize_matrix(job, sink.options.rule, pieces, band, packed.data(), scales.data());
        sink.finish(j, st, raw.data(), packed.data(), scales.data());
      } catch (...) {
        failure.record(j);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < workers; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  failure.rethrow();
}

// The calling thread reads matrix j into slot j % S and submits it; a writer thread waits for the
// slots in order, writes them and frees them. Reading, the GPU's copies and kernels (on the slots'
// streams) and writing overlap.
void quantize_on_cuda(const safetensors_reader& r, const std::vector<matrix_job>& jobs, job_sink& sink, stage_profile& prof) {
  uint64_t largest = 0;
  int64_t most = 0;
  for (const auto& j : jobs) {
    largest = std::max(largest, j.m.bytes());
    most = std::max(most, j.elements());
  }
  cuda::matrix_pipeline pipe = [&] {
    stage_profile::timer t(prof, stage_profile::setup);
    return cuda::matrix_pipeline(kPipelineSlots, static_cast<size_t>(largest), most);
  }();
  chunk_pool readers(kReaders);
  std::mutex mutex;
  std::condition_variable changed;
  size_t submitted = 0, written = 0;
  first_failure failure;
  std::thread writer([&] {
    for (size_t j = 0; j < jobs.size(); ++j) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return submitted > j || failure.failed(); });
        if (submitted <= j) return;
      }
      const int slot = static_cast<int>(j % kPipelineSlots);
      try {
        quant_stats st;
        {
          stage_profile::timer t(prof, stage_profile::gpu_wait);
          st = pipe.wait(slot);
        }
        stage_profile::timer t(prof, stage_profile::write);
        sink.finish(j, st, pipe.input(slot), pipe.packed(slot), pipe.scales(slot));
      } catch (...) {
        failure.record(j);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        written = j + 1;
      }
      changed.notify_all();
      if (failure.failed()) return;
    }
  });
  for (size_t j = 0; j < jobs.size() && !failure.failed(); ++j) {
    {
      stage_profile::timer t(prof, stage_profile::slot_wait);
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return j < written + kPipelineSlots || failure.failed(); });
      if (failure.failed()) break;
    }
    const int slot = static_cast<int>(j % kPipelineSlots);
    try {
      {
        stage_profile::timer t(prof, stage_profile::read);
        read_matrix_parallel(r, jobs[j].m, pipe.input(slot), readers);
      }
      stage_profile::timer t(prof, stage_profile::submit);
      pipe.submit(slot, jobs[j].m.type, jobs[j].m.source, sink.options.rule);
    } catch (...) {
      failure.record(j);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.failed()) submitted = j + 1;
    }
    changed.notify_all();
  }
  changed.notify_all();
  writer.join();
  failure.rethrow();
}

uint64_t decl_bytes(const std::vector<tensor_decl>& decls) {
  uint64_t total = 0;
  for (const auto& d : decls) {
    uint64_t n = static_cast<uint64_t>(dtype_size(d.type));
    for (int64_t s : d.shape) n *= static_cast<uint64_t>(s);
    total += n;
  }
  return total;
}

}  // namespace

quantize_report quantize_checkpoint(const std::string& in, const std::string& out, const quantize_options& options) {
  const auto start = std::chrono::steady_clock::now();
  stage_profile prof;
  MXMOE_CHECK_ARG(options.device == device_kind::cpu || options.device == device_kind::cuda, "options.device",
                  "cpu | cuda", std::to_string(static_cast<int>(options.device)));
  MXMOE_CHECK_ARG(options.threads >= 0, "options.threads", "0 (one per core) or more", std::to_string(options.threads));
  if (options.device == device_kind::cuda) {
    std::string why;
    stage_profile::timer t(prof, stage_profile::setup);
    if (!cuda::available(&why)) throw unsupported("quantize_checkpoint on cuda: no usable GPU: " + why);
  }
  const safetensors_reader r(in);
  const auto layers = checkpoint::find_moe_layers(r);
  MXMOE_CHECK_ARG(!layers.empty(), "IN", "a checkpoint with MoE expert weights (gpt-oss or Qwen3/DeepSeek names)",
                  "no MoE layer in " + in);
  for (const auto& l : layers) {
    MXMOE_CHECK_ARG(l.layout != checkpoint::moe_layout::mxfp4_gpt_oss, "IN", "a BF16 checkpoint",
                    "layer " + std::to_string(l.layer) + " already in MXFP4");
    MXMOE_CHECK_ARG(l.shape.hidden % mx::kBlockSize == 0 && l.shape.intermediate % mx::kBlockSize == 0, "IN",
                    "hidden and intermediate sizes that are multiples of 32",
                    "layer " + std::to_string(l.layer) + " with H=" + std::to_string(l.shape.hidden) +
                        ", I=" + std::to_string(l.shape.intermediate));
  }
  moe_config cfg = checkpoint::layer_config(r, layers.front());
  cfg.gate_up = layout::gate_up_order::interleaved;  // what the gpt-oss layout stores
  std::map<std::string, std::string> meta = r.metadata();
  meta["mxmoe.moe_config"] = checkpoint::config_to_json(cfg);
  meta["mxmoe.scale_rule"] = mx::to_string(options.rule);
  if (!meta.count("format")) meta["format"] = "pt";

  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    return checkpoint::mxfp4_layer_decls(l.prefix, l.shape);
  });
  const std::vector<matrix_job> jobs = matrix_jobs(r, layers);
  safetensors_writer w(out, decls, meta, options.overwrite);

  quantize_report rep;
  const std::set<std::string> expert_tensors = expert_tensor_set(layers);
  progress prog(options.on_progress, r, layers, expert_tensors);
  std::vector<uint8_t> buf;
  for (const auto& e : r.entries()) {
    rep.input_bytes += e.nbytes();
    if (expert_tensors.count(e.name)) continue;
    stage_profile::timer t(prof, stage_profile::copy);
    copy_tensor(r, e, w, buf);
    ++rep.copied_tensors;
    rep.copied_bytes += e.nbytes();
    prog.copied(e);
  }
  buf = {};
  std::vector<quant_stats> stats(jobs.size());
  job_sink sink{jobs, options, w, prog, stats};
  if (options.device == device_kind::cuda) {
    quantize_on_cuda(r, jobs, sink, prof);
    rep.workers = kPipelineSlots;
  } else {
    rep.workers = cpu_workers(options, jobs);
    quantize_on_cpu(r, jobs, sink, rep.workers);
  }
  // Merged in file order (expert by expert, as the sequential converter did): the same sums
  // however the matrices were scheduled.
  for (const auto& l : layers) {
    const auto names = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    rep.tensors.push_back({names.gate_up_blocks, {gu.experts, gu.rows, gu.scale_cols(), mx::kPackedBlockBytes}, {}});
    rep.tensors.push_back({names.down_blocks, {dn.experts, dn.rows, dn.scale_cols(), mx::kPackedBlockBytes}, {}});
  }
  for (size_t j = 0; j < jobs.size(); ++j) rep.tensors[jobs[j].tensor].stats.merge(stats[j]);
  for (const auto& t : rep.tensors) rep.total.merge(t.stats);
  {
    stage_profile::timer t(prof, stage_profile::commit);
    w.commit();
  }
  rep.output_bytes = decl_bytes(decls);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  prof.print(rep.seconds);
  return rep;
}

void dequantize_checkpoint(const std::string& in, const std::string& out, const dequantize_options& options) {
  const safetensors_reader r(in);
  const auto layers = checkpoint::find_moe_layers(r);
  MXMOE_CHECK_ARG(!layers.empty(), "IN", "a checkpoint with MXFP4 MoE layers", "no MoE layer in " + in);
  for (const auto& l : layers)
    MXMOE_CHECK_ARG(l.layout == checkpoint::moe_layout::mxfp4_gpt_oss, "IN", "an MXFP4 checkpoint",
                    "layer " + std::to_string(l.layer) + " in layout " + checkpoint::to_string(l.layout));
  const auto decls = output_decls(r, layers, [](const checkpoint::moe_layer_info& l) {
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_xw_geometry(l.shape), dn = checkpoint::down_xw_geometry(l.shape);
    return std::vector<tensor_decl>{{n.gate_up, dtype::bf16, {gu.experts, gu.cols, gu.rows}},
                                    {n.down, dtype::bf16, {dn.experts, dn.cols, dn.rows}}};
  });
  // The scale rule describes MXFP4 content only; the MoE configuration holds for the BF16 layer.
  std::map<std::string, std::string> meta = r.metadata();
  meta.erase("mxmoe.scale_rule");
  safetensors_writer w(out, decls, meta, options.overwrite);
  const std::set<std::string> expert_tensors = expert_tensor_set(layers);
  progress prog(options.on_progress, r, layers, expert_tensors);
  std::vector<uint8_t> buf;
  for (const auto& e : r.entries()) {
    if (expert_tensors.count(e.name)) continue;
    copy_tensor(r, e, w, buf);
    prog.copied(e);
  }
  size_t expert_index = 0;
  // Each expert's codes and scales are read (pread) into these, not touched through the mapping,
  // so memory stays at one expert's matrices whatever the file size.
  std::vector<uint8_t> blocks, scales;
  std::vector<uint16_t> values, transposed;
  for (const auto& l : layers) {
    const auto q = checkpoint::mxfp4_tensor_names(l.prefix);
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(l.prefix);
    const auto gu = checkpoint::gate_up_geometry(l.shape), dn = checkpoint::down_geometry(l.shape);
    const auto gu_xw = checkpoint::gate_up_xw_geometry(l.shape), dn_xw = checkpoint::down_xw_geometry(l.shape);
    for (int64_t ex = 0; ex < l.shape.experts; ++ex) {
      for (const auto* g : {&gu, &dn}) {
        const bool is_gu = g == &gu;
        const layout::checkpoint_xw& xw = is_gu ? gu_xw : dn_xw;
        blocks.resize(static_cast<size_t>(g->rows * g->row_bytes()));
        scales.resize(static_cast<size_t>(g->rows * g->scale_cols()));
        r.read(r.entry(is_gu ? q.gate_up_blocks : q.down_blocks), static_cast<uint64_t>(g->code_offset(ex, 0, 0).byte),
               blocks.size(), blocks.data());
        r.read(r.entry(is_gu ? q.gate_up_scales : q.down_scales), static_cast<uint64_t>(g->scale_offset(ex, 0, 0)),
               scales.size(), scales.data());
        values.resize(static_cast<size_t>(g->rows * g->cols));
        dequantize(tensor_view(blocks.data(), dtype::u8, {g->rows, g->row_bytes()}),
                   tensor_view(scales.data(), dtype::u8, {g->rows, g->scale_cols()}),
                   scale_layout::linear, tensor_view(values.data(), dtype::bf16, {g->rows, g->cols}));
        // Checkpoint rows are outputs; the gpt-oss BF16 layout stores the x·W form.
        transposed.resize(values.size());
        for (int64_t row = 0; row < g->rows; ++row)
          for (int64_t k = 0; k < g->cols; ++k)
            transposed[static_cast<size_t>(xw.offset(0, row, k))] = values[static_cast<size_t>(row * g->cols + k)];
        w.write(is_gu ? n.gate_up : n.down, transposed.data(), transposed.size() * 2,
                static_cast<uint64_t>(xw.offset(ex, 0, 0)) * 2);
      }
      prog.matrix_done(expert_index++, 1,
                       static_cast<uint64_t>(gu.rows * (gu.row_bytes() + gu.scale_cols()) + dn.rows * (dn.row_bytes() + dn.scale_cols())));
    }
  }
  w.commit();
}

}  // namespace mxmoe
