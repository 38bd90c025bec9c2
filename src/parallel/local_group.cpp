// The in-process group of P ranks (include/mxmoe/parallel.h): the stand-in for NCCL that runs the
// parallel layers' bookkeeping without it. A collective is two waits on one barrier around plain
// copies: every rank first posts what it sends, then each copies what it receives out of the
// others' send buffers, and nobody returns before everybody has copied (so no send buffer is
// reused early). A device group synchronizes the caller's stream first: not capturable.
#include <barrier>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "mxmoe/error.h"
#include "mxmoe/parallel.h"
#include "ops.h"

namespace mxmoe::parallel {
namespace {

struct group_state {
  group_state(int n, device_kind d) : ranks(n), device(d), barrier(n), posted(static_cast<size_t>(n)) {}
  const int ranks;
  const device_kind device;
  std::barrier<> barrier;
  std::vector<std::vector<communicator::exchange>> posted;  // each rank's parts of the collective in progress
};

class local_communicator final : public communicator {
 public:
  local_communicator(std::shared_ptr<group_state> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->ranks; }
  device_kind device() const override { return g_->device; }
  std::string name() const override {
    return std::string("in-process group on ") + (g_->device == device_kind::cuda ? "one GPU" : "the host");
  }

  void all_to_all(const std::vector<exchange>& parts, void* stream) override {
    run(parts, stream, [&](int q, const exchange& mine, const exchange& theirs) {
      copy(static_cast<uint8_t*>(mine.recv) + static_cast<size_t>(q) * mine.bytes,
           static_cast<const uint8_t*>(theirs.send) + static_cast<size_t>(rank_) * theirs.bytes, mine.bytes, stream);
    });
  }

  void all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    run({{send, recv, bytes}}, stream, [&](int q, const exchange& mine, const exchange& theirs) {
      copy(static_cast<uint8_t*>(mine.recv) + static_cast<size_t>(q) * mine.bytes, theirs.send, mine.bytes, stream);
    });
  }

 private:
  void copy(void* dst, const void* src, size_t bytes, void* stream) const {
    if (g_->device == device_kind::cuda) cuda_ops::copy(dst, src, bytes, stream);
    else if (bytes) std::memcpy(dst, src, bytes);
  }

  // Posts `parts`, waits for every rank, receives with fn(q, mine, q's same part) for every rank q
  // and part i, waits again. The byte counts must agree (a collective): every rank sees the same
  // mismatch and throws after the second wait, so none is left waiting.
  template <class F>
  void run(const std::vector<exchange>& parts, void* stream, F&& fn) {
    if (g_->device == device_kind::cuda) cuda_ops::synchronize(stream);
    g_->posted[static_cast<size_t>(rank_)] = parts;
    g_->barrier.arrive_and_wait();
    std::string mismatch;
    for (int q = 0; q < g_->ranks && mismatch.empty(); ++q) {
      const auto& theirs = g_->posted[static_cast<size_t>(q)];
      bool same = theirs.size() == parts.size();
      for (size_t i = 0; same && i < parts.size(); ++i) same = theirs[i].bytes == parts[i].bytes;
      if (!same) mismatch = "rank " + std::to_string(q) + " posted other byte counts than rank " + std::to_string(rank_);
    }
    std::exception_ptr failed;
    if (mismatch.empty()) {
      try {
        for (int q = 0; q < g_->ranks; ++q)
          for (size_t i = 0; i < parts.size(); ++i) fn(q, parts[i], g_->posted[static_cast<size_t>(q)][i]);
        if (g_->device == device_kind::cuda) cuda_ops::synchronize(stream);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    g_->barrier.arrive_and_wait();
    MXMOE_CHECK_ARG(mismatch.empty(), "communicator", "the same exchange sizes on every rank (a collective)", mismatch);
    if (failed) std::rethrow_exception(failed);
  }

  std::shared_ptr<group_state> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<communicator>> make_local_group(int ranks, device_kind device) {
  MXMOE_CHECK_ARG(ranks >= 1 && ranks <= 1024, "ranks", "a value in [1, 1024]", std::to_string(ranks));
  MXMOE_CHECK_ARG(device == device_kind::cpu || device == device_kind::cuda, "device", "cpu | cuda",
                  std::to_string(static_cast<int>(device)));
  auto g = std::make_shared<group_state>(ranks, device);
  std::vector<std::unique_ptr<communicator>> group;
  for (int r = 0; r < ranks; ++r) group.push_back(std::make_unique<local_communicator>(g, r));
  return group;
}

void run_ranks(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> failed(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        failed[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace mxmoe::parallel
