// Device discovery and device memory for the sm_90a backend.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

namespace mxmoe::cuda {

bool available(std::string* why, int device) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (why) *why = err != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(err) + ")"
                                       : std::string("no CUDA device");
    cudaGetLastError();
    return false;
  }
  if (device < 0 || device >= n) {
    if (why) *why = "device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " present)";
    return false;
  }
  cudaDeviceProp prop{};
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9 || prop.minor != 0) {
    if (why)
      *why = std::string(prop.name) + " is sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
             "; this build's kernels are sm_90a (Hopper) only";
    return false;
  }
  return true;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "none";
  }
  return prop.name;
}

device_buffer::device_buffer(size_t bytes) : bytes_(bytes) {
  if (bytes) MXMOE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}
device_buffer::~device_buffer() {
  if (ptr_) cudaFree(ptr_);
}
device_buffer::device_buffer(device_buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
device_buffer& device_buffer::operator=(device_buffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}
void device_buffer::upload(const void* host, size_t bytes, size_t offset) {
  MXMOE_CHECK_ARG(offset + bytes <= bytes_, "bytes", "at most " + std::to_string(bytes_ - offset),
                  std::to_string(bytes));
  MXMOE_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}
void device_buffer::download(void* host, size_t bytes, size_t offset) const {
  MXMOE_CHECK_ARG(offset + bytes <= bytes_, "bytes", "at most " + std::to_string(bytes_ - offset),
                  std::to_string(bytes));
  MXMOE_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}
void device_buffer::fill(uint8_t byte) {
  if (bytes_) MXMOE_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_));
}
void synchronize() { MXMOE_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace mxmoe::cuda
