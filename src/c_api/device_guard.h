// Makes a CUDA device current for the length of one C ABI call and restores the caller's after,
// so that a call on cuda:1 tensors runs on cuda:1 whatever the caller's current device is (the
// PyTorch convention). The first use of each device checks cuda::available() once: a device
// this build cannot run on (no GPU, not sm_90, CPU-only build) throws mxmoe::unsupported saying
// why, instead of failing later in a kernel launch.
#pragma once

#include <optional>

namespace mxmoe::c_api {

class device_guard {
 public:
  explicit device_guard(int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// A device_guard only for a CUDA call; nothing for a CPU one.
class optional_device_guard {
 public:
  optional_device_guard(bool cuda, int device) {
    if (cuda) guard_.emplace(device);
  }

 private:
  std::optional<device_guard> guard_;
};

}  // namespace mxmoe::c_api
