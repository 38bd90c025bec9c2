#include "device_guard.h"

#include <array>
#include <mutex>
#include <string>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"

#if MXMOE_C_API_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mxmoe::c_api {
namespace {

// cuda::available() reads the device properties (slow); its answer cannot change while the
// process runs, so it is asked once per device.
constexpr int kCachedDevices = 64;
struct availability {
  std::once_flag once;
  bool ok = false;
  std::string why;
};
std::array<availability, kCachedDevices> g_devices;

void require_available(int device) {
  MXMOE_CHECK_ARG(device >= 0, "device", "a CUDA device ordinal >= 0", std::to_string(device));
  std::string why;
  if (device >= kCachedDevices) {
    if (!cuda::available(&why, device)) throw unsupported("cuda:" + std::to_string(device) + ": " + why);
    return;
  }
  availability& a = g_devices[static_cast<size_t>(device)];
  std::call_once(a.once, [&] { a.ok = cuda::available(&a.why, device); });
  if (!a.ok) throw unsupported("cuda:" + std::to_string(device) + ": " + a.why);
}

}  // namespace

device_guard::device_guard(int device) {
  require_available(device);
#if MXMOE_C_API_CUDA
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) {
    err = cudaSetDevice(device);
    if (err == cudaSuccess) previous_ = current;
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("CUDA error: " + std::string(cudaGetErrorString(err)) + " making cuda:" +
                             std::to_string(device) + " current");
  }
#endif
}

device_guard::~device_guard() {
#if MXMOE_C_API_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}

}  // namespace mxmoe::c_api
