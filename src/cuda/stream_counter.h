// One device counter per CUDA stream that is zero whenever a kernel on that stream starts, for
// work handed out through an atomic counter without a memset node before every launch.
//
// Contract for the code that uses the counter: the work on the stream that uses it puts it back to
// zero before the next user can start (the quantize kernel's counter is reset by the statistics
// kernel that follows it). Work on one stream runs in order, so the next user finds zero again.
// Not for work being captured into a CUDA graph: a graph may later run on any stream, next to
// direct launches on this one; captured work needs its own counter (allocated and zeroed in the
// graph).
#pragma once

#include <cuda_runtime.h>

namespace mxmoe::cuda {

// The counter of `stream` (nullptr: the legacy default stream) on the current device. Allocated on
// the first call for a stream and zeroed on that stream, so it is ready for work enqueued after the
// call; lives until the process ends (4 bytes per stream that ever asked). Thread-safe.
unsigned* stream_counter(cudaStream_t stream);

// Whether `stream` is capturing work into a CUDA graph.
bool stream_is_capturing(cudaStream_t stream);

}  // namespace mxmoe::cuda
