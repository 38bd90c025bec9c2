// Per-stream zeroed device counters (see stream_counter.h).
#include "stream_counter.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "check.h"

namespace mxmoe::cuda {
namespace {

constexpr int kCountersPerSlab = 1024;

struct device_counters {
  std::vector<unsigned*> slabs;  // never freed: counters stay valid for the life of the process
  int next_in_slab = kCountersPerSlab;
  // cudaStreamGetId: unique for the life of the process, never reused by a later stream.
  std::map<unsigned long long, unsigned*> by_stream;
};

}  // namespace

unsigned* stream_counter(cudaStream_t stream) {
  int device = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&device));
  unsigned long long id = 0;
  MXMOE_CUDA_CHECK(cudaStreamGetId(stream, &id));

  static std::mutex mutex;
  static std::map<int, device_counters> devices;
  const std::lock_guard<std::mutex> lock(mutex);
  device_counters& d = devices[device];
  if (const auto it = d.by_stream.find(id); it != d.by_stream.end()) return it->second;
  if (d.next_in_slab == kCountersPerSlab) {
    unsigned* slab = nullptr;
    MXMOE_CUDA_CHECK(cudaMalloc(&slab, sizeof(unsigned) * kCountersPerSlab));
    d.slabs.push_back(slab);
    d.next_in_slab = 0;
  }
  unsigned* counter = d.slabs.back() + d.next_in_slab;
  // Zeroed on the stream itself: ordered before everything enqueued on it afterwards, also for a
  // non-blocking stream that does not wait for the legacy default stream.
  MXMOE_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(unsigned), stream));
  ++d.next_in_slab;
  d.by_stream.emplace(id, counter);
  return counter;
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MXMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace mxmoe::cuda
