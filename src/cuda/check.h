// Error checking for CUDA runtime calls inside the library: a failed call throws with the call,
// the file and line, never returns silently.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define MXMOE_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t mxmoe_err_ = (call);                                                      \
    if (mxmoe_err_ != cudaSuccess)                                                              \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(mxmoe_err_) +   \
                               " in " #call " at " __FILE__ ":" + std::to_string(__LINE__));    \
  } while (0)
