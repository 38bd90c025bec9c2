// Device discovery, device memory and the device-tensor check (check.h) of the sm_90a backend.
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

int current_device() {
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void check_device_view(const tensor_view& v, const char* name, int device, size_t alignment) {
  MXMOE_CHECK_ARG(v.device == device_kind::cuda, name, "a cuda tensor (mxmoe::cuda backend)", "a cpu tensor");
  if (v.numel() == 0) return;
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, v.data);
  cudaGetLastError();
  MXMOE_CHECK_ARG(err == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
                  name, "a pointer to device memory", "a host or unknown pointer");
  MXMOE_CHECK_ARG(attr.device == device, name, "memory on the current device " + std::to_string(device),
                  "memory on device " + std::to_string(attr.device));
  const size_t misalign = reinterpret_cast<uintptr_t>(v.data) % alignment;
  MXMOE_CHECK_ARG(misalign == 0, name, std::to_string(alignment) + "-byte aligned data",
                  "address % " + std::to_string(alignment) + " = " + std::to_string(misalign));
}

}  // namespace mxmoe::cuda
