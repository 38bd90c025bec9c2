// Checks shared by the sm_90a backend's host code (quantize launcher, MoE layer, runtime):
// CUDA runtime errors become exceptions, and device tensors are checked once, in one way.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "mxmoe/dtype.h"

// A failed CUDA runtime call throws std::runtime_error with the call, the file and the line; it
// never returns silently. The one CUDA error check of the library and the benchmarks.
#define MXMOE_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t mxmoe_err_ = (call);                                                      \
    if (mxmoe_err_ != cudaSuccess)                                                              \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(mxmoe_err_) +   \
                               " in " #call " at " __FILE__ ":" + std::to_string(__LINE__));    \
  } while (0)

namespace mxmoe::cuda {

// The current CUDA device (cudaGetDevice).
int current_device();

// `v` (named `name` in messages) must be a cuda tensor; when it holds any element, its data must
// point to device (or managed) memory of `device` and be `alignment`-byte aligned. Throws
// mxmoe::invalid_argument naming the argument. Shapes, dtypes and strides are the caller's checks.
void check_device_view(const tensor_view& v, const char* name, int device, size_t alignment = 1);

}  // namespace mxmoe::cuda
