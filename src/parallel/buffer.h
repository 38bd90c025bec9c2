// A buffer of the parallel layers on the host or the current GPU (cuda::device_buffer), so that
// ep_layer and tp_layer run the same sequence of steps on either.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"

namespace mxmoe::parallel {

class buffer {
 public:
  buffer() = default;
  // At least 16 bytes, so that no view of it has a null pointer; zero-filled.
  buffer(device_kind where, size_t bytes) : where_(where) {
    bytes = std::max<size_t>(bytes, 16);
    if (where == device_kind::cuda) {
      device_ = cuda::device_buffer(bytes);
      device_.fill(0);
    } else {
      host_.assign(bytes, 0);
    }
  }
  void* data() { return where_ == device_kind::cuda ? device_.data() : host_.data(); }
  const void* data() const { return where_ == device_kind::cuda ? device_.data() : host_.data(); }
  void upload(const void* src, size_t bytes) {
    if (where_ == device_kind::cuda) device_.upload(src, bytes);
    else if (bytes) std::memcpy(host_.data(), src, bytes);
  }
  template <class T>
  T* as() {
    return static_cast<T*>(data());
  }
  tensor_view view(dtype t, std::vector<int64_t> shape) {
    return tensor_view(data(), t, std::move(shape), where_);
  }

 private:
  device_kind where_ = device_kind::cpu;
  std::vector<uint8_t> host_;
  cuda::device_buffer device_;
};

}  // namespace mxmoe::parallel
