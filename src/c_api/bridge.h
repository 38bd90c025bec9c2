// What the C ABI's translation units share: mxmoe_tensor -> tensor_view with the checks a C
// caller needs (enum ranges, ranks, negative sizes), the C structs <-> the C++ ones, the device
// every tensor of a call is on, the prepared layer behind mxmoe_moe, and running a call with every
// exception turned into an mxmoe_status plus the thread-local last error (mxmoe_last_error /
// mxmoe_last_error_argument).
#pragma once

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mxmoe/c_api.h"
#include "mxmoe/dtype.h"
#include "mxmoe/forward.h"
#include "mxmoe/moe.h"
#include "mxmoe/mx.h"

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
// (device_type, device_id) of a call; invalid_argument naming `name` for an unknown type.
device_ref to_device(int32_t device_type, int32_t device_id, const char* name);
// MXMOE_DEVICE_CPU | MXMOE_DEVICE_CUDA; invalid_argument naming `name` otherwise.
device_kind to_device_kind(int32_t device_type, const char* name);

// The device all given (non-NULL) tensors are on; throws invalid_argument naming the first one
// that differs from the first given. At least one must be given.
device_ref common_device(std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors);
// Every given (non-NULL) tensor must be on `d`; `where` says why ("the layer's device").
void require_device(device_ref d, const char* where,
                    std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors);

mx::scale_rule to_rule(int32_t rule);

// mxmoe_moe_config <-> moe_config. to_config validates (invalid_argument naming the field).
moe_config to_config(const mxmoe_moe_config* c);
mxmoe_moe_config from_config(const moe_config& c);

// The tensors of mxmoe_moe_weights and moe_weights, slot by slot ("weights.gate_up_blocks", ...).
struct weight_slot {
  const char* field;  // "gate_up_blocks"
  const mxmoe_tensor* mxmoe_moe_weights::*src;
  tensor_view moe_weights::*dst;
};
std::span<const weight_slot> weight_slots();
// The views of `w` (NULL: invalid_argument "weights"); `prefix` names them ("weights", "out").
moe_weights to_weights(const mxmoe_moe_weights* w, const char* prefix = "weights");

// A caller's output tensor: host, contiguous, of `type` and exactly `shape` (invalid_argument
// naming `name` otherwise).
void check_output(const tensor_view& dst, const std::string& name, dtype type, const std::vector<int64_t>& shape);
// Copies the host tensors of `src` into the caller's `out` (prefix "out"): out->format must be
// src.format; a NULL tensor skips that one; a tensor given where src has none is an error. Every
// tensor is checked before anything is written.
void copy_weights_out(const moe_weights& src, const mxmoe_moe_weights* out);

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

// Thrown when a progress callback asks to stop (MXMOE_ERR_CANCELLED).
struct cancelled : std::runtime_error {
  cancelled() : std::runtime_error("cancelled by the progress callback") {}
};

}  // namespace mxmoe::c_api

// Behind the C handle: a layer prepared through forward.h, and the device (with its ordinal) it
// was prepared on.
struct mxmoe_moe {
  mxmoe::c_api::device_ref device;
  mxmoe::prepared_moe layer;
};

namespace mxmoe::c_api {
// mxmoe::prepare on `d` (with the CUDA device made current for the call).
std::unique_ptr<mxmoe_moe> prepare_on(const moe_weights& weights, const moe_config& cfg, device_ref d,
                                      const prepare_options& options = {});
// mxmoe_prepare_options -> prepare_options (NULL: the defaults).
prepare_options to_options(const mxmoe_prepare_options* o);
const mxmoe_moe& require_layer(const mxmoe_moe* layer);
}  // namespace mxmoe::c_api
