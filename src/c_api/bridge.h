// What the C ABI's translation units share: mxmoe_tensor -> tensor_view with the checks a C
// caller needs (enum ranges, ranks, negative sizes), the device every tensor of a call is on,
// and running a call with every exception turned into an mxmoe_status plus the thread-local
// last error (mxmoe_last_error / mxmoe_last_error_argument).
#pragma once

#include <initializer_list>
#include <utility>

#include "mxmoe/c_api.h"
#include "mxmoe/dtype.h"

namespace mxmoe::c_api {

// Absent (default-constructed) view for a NULL pointer.
tensor_view optional_view(const mxmoe_tensor* t, const char* name);
// Throws invalid_argument naming `name` for a NULL pointer.
tensor_view required_view(const mxmoe_tensor* t, const char* name);

struct device_ref {
  device_kind kind = device_kind::cpu;
  int id = 0;
};
std::string to_string(device_ref d);
device_ref device_of(const mxmoe_tensor& t);

// The device all given (non-NULL) tensors are on; throws invalid_argument naming the first one
// that differs from the first given. At least one must be given.
device_ref common_device(std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors);
// Every given (non-NULL) tensor must be on `d`; `where` says why ("the layer's device").
void require_device(device_ref d, const char* where,
                    std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors);

// Records the exception being handled as the thread's last error and returns its status.
mxmoe_status status_from_current_exception() noexcept;

template <class F>
mxmoe_status guarded(F&& f) noexcept {
  try {
    f();
    return MXMOE_OK;
  } catch (...) {
    return status_from_current_exception();
  }
}

}  // namespace mxmoe::c_api
