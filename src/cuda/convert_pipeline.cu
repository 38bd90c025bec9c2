// The GPU stage of checkpoint conversion (cuda::matrix_pipeline, include/mxmoe/cuda.h): per slot,
// upload an expert matrix as the file stores it, reorder it to row-major [N, K] on the GPU, quantize
// it (quantize_async, the same kernels as cuda::quantize) and download the result, all on the
// slot's stream, so that slots overlap one another's copies and kernels.
#include <cuda_runtime.h>

#include <vector>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"

namespace mxmoe::cuda {
namespace {

constexpr int kTile = 32;  // transpose tile: 32 x 32 elements, 32 x 8 threads

// x·W form [K, N] -> [N, K] through shared memory, so that both the reads (along n) and the writes
// (along k) are coalesced.
template <class T>
__global__ void transpose_xw(const T* __restrict__ src, T* __restrict__ dst, layout::matrix_source s) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile, k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t k = k0 + i, n = n0 + threadIdx.x;
    if (k < s.cols && n < s.rows) tile[i][threadIdx.x] = src[s.offset(n, k)];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    const int64_t n = n0 + i, k = k0 + threadIdx.x;
    if (k < s.cols && n < s.rows) dst[n * s.cols + k] = tile[threadIdx.x][i];
  }
}

// Orders where every row is contiguous in the source (gate/up pairs): one row per block.
template <class T>
__global__ void gather_rows(const T* __restrict__ src, T* __restrict__ dst, layout::matrix_source s) {
  const int64_t n = blockIdx.x;
  const T* from = src + s.offset(n, 0);
  for (int64_t k = threadIdx.x; k < s.cols; k += blockDim.x) dst[n * s.cols + k] = from[k];
}

template <class T>
void launch_reorder(const void* src, void* dst, const layout::matrix_source& s, cudaStream_t stream) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  if (s.order == layout::source_order::xw) {
    const dim3 grid(static_cast<unsigned>((s.rows + kTile - 1) / kTile), static_cast<unsigned>((s.cols + kTile - 1) / kTile));
    transpose_xw<T><<<grid, dim3(kTile, 8), 0, stream>>>(in, out, s);
  } else {
    gather_rows<T><<<static_cast<unsigned>(s.rows), 256, 0, stream>>>(in, out, s);
  }
  MXMOE_CUDA_CHECK(cudaGetLastError());
}

struct pinned {
  void* ptr = nullptr;
  explicit pinned(size_t bytes) { MXMOE_CUDA_CHECK(cudaMallocHost(&ptr, bytes)); }
  ~pinned() { cudaFreeHost(ptr); }
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;
};

}  // namespace

struct matrix_pipeline::impl {
  struct slot {
    slot(size_t input_bytes, int64_t elements)
        : input(input_bytes), packed(static_cast<size_t>(elements / 2)), scales(static_cast<size_t>(elements / mx::kBlockSize)),
          stats(sizeof(quant_stats)), d_input(input_bytes), d_ordered(input_bytes), d_packed(static_cast<size_t>(elements / 2)),
          d_scales(static_cast<size_t>(elements / mx::kBlockSize)), d_stats(sizeof(quant_stats)) {
      MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    ~slot() { cudaStreamDestroy(stream); }
    pinned input, packed, scales, stats;
    device_buffer d_input, d_ordered, d_packed, d_scales, d_stats;
    cudaStream_t stream = nullptr;
    size_t packed_bytes = 0, scale_bytes = 0;
  };
  int device = 0;
  size_t max_input = 0;
  int64_t max_elements = 0;
  std::vector<std::unique_ptr<slot>> slots;

  slot& at(int s) {
    MXMOE_CHECK_ARG(s >= 0 && s < static_cast<int>(slots.size()), "slot",
                    "in [0, " + std::to_string(slots.size()) + ")", std::to_string(s));
    MXMOE_CUDA_CHECK(cudaSetDevice(device));
    return *slots[static_cast<size_t>(s)];
  }
};

matrix_pipeline::matrix_pipeline(int slots, size_t max_input_bytes, int64_t max_elements) : impl_(std::make_unique<impl>()) {
  MXMOE_CHECK_ARG(slots >= 1, "slots", "at least 1", std::to_string(slots));
  MXMOE_CHECK_ARG(max_elements > 0 && max_elements % mx::kBlockSize == 0, "max_elements", "a positive multiple of 32",
                  std::to_string(max_elements));
  MXMOE_CUDA_CHECK(cudaGetDevice(&impl_->device));
  impl_->max_input = max_input_bytes;
  impl_->max_elements = max_elements;
  for (int s = 0; s < slots; ++s) impl_->slots.push_back(std::make_unique<impl::slot>(max_input_bytes, max_elements));
}

matrix_pipeline::~matrix_pipeline() {
  if (!impl_) return;
  cudaSetDevice(impl_->device);
  for (auto& s : impl_->slots) cudaStreamSynchronize(s->stream);  // nothing may still use the buffers
}

int matrix_pipeline::slots() const { return static_cast<int>(impl_->slots.size()); }
uint8_t* matrix_pipeline::input(int s) { return static_cast<uint8_t*>(impl_->at(s).input.ptr); }
const uint8_t* matrix_pipeline::packed(int s) const { return static_cast<const uint8_t*>(impl_->at(s).packed.ptr); }
const uint8_t* matrix_pipeline::scales(int s) const { return static_cast<const uint8_t*>(impl_->at(s).scales.ptr); }

void matrix_pipeline::submit(int s, dtype type, const layout::matrix_source& source, mx::scale_rule rule) {
  impl::slot& sl = impl_->at(s);
  MXMOE_CHECK_ARG(type == dtype::bf16 || type == dtype::f16 || type == dtype::f32, "type", "bf16 | f16 | f32",
                  to_string(type));
  const size_t bytes = static_cast<size_t>(source.size()) * static_cast<size_t>(dtype_size(type));
  MXMOE_CHECK_ARG(bytes <= impl_->max_input && source.size() <= impl_->max_elements && source.cols % mx::kBlockSize == 0,
                  "source", "a matrix within the pipeline's buffers, K a multiple of 32",
                  std::to_string(source.rows) + " x " + std::to_string(source.cols));
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(sl.d_input.data(), sl.input.ptr, bytes, cudaMemcpyHostToDevice, sl.stream));
  void* x = sl.d_input.data();
  if (source.order != layout::source_order::row_major) {
    if (dtype_size(type) == 2) launch_reorder<uint16_t>(sl.d_input.data(), sl.d_ordered.data(), source, sl.stream);
    else launch_reorder<uint32_t>(sl.d_input.data(), sl.d_ordered.data(), source, sl.stream);
    x = sl.d_ordered.data();
  }
  sl.packed_bytes = static_cast<size_t>(source.size() / 2);
  sl.scale_bytes = static_cast<size_t>(source.size() / mx::kBlockSize);
  quantize_async(tensor_view(x, type, {source.rows, source.cols}, device_kind::cuda), rule, scale_layout::linear,
                 sl.d_packed.view(dtype::u8, {source.rows, source.cols / 2}),
                 sl.d_scales.view(dtype::u8, {source.rows, source.cols / mx::kBlockSize}),
                 static_cast<quant_stats*>(sl.d_stats.data()), sl.stream);
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(sl.packed.ptr, sl.d_packed.data(), sl.packed_bytes, cudaMemcpyDeviceToHost, sl.stream));
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(sl.scales.ptr, sl.d_scales.data(), sl.scale_bytes, cudaMemcpyDeviceToHost, sl.stream));
  MXMOE_CUDA_CHECK(cudaMemcpyAsync(sl.stats.ptr, sl.d_stats.data(), sizeof(quant_stats), cudaMemcpyDeviceToHost, sl.stream));
}

quant_stats matrix_pipeline::wait(int s) {
  impl::slot& sl = impl_->at(s);
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(sl.stream));
  return *static_cast<const quant_stats*>(sl.stats.ptr);
}

}  // namespace mxmoe::cuda
