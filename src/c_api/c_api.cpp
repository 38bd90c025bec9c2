// The C ABI (include/mxmoe/c_api.h): library information, errors, devices, quantize and
// dequantize, and the pieces every part shares (bridge.h). The MoE layer is in moe.cpp,
// verification in verify.cpp, synthetic layers and presets in synthetic.cpp, checkpoints in
// checkpoint.cpp.
#include "mxmoe/c_api.h"

#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <system_error>

#include "bridge.h"
#include "device_guard.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/validate.h"
#include "mxmoe/quantize.h"
#include "mxmoe/safetensors.h"

#if MXMOE_C_API_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mxmoe::c_api {
namespace {

thread_local std::string g_error;
thread_local std::string g_error_arg;
thread_local int32_t g_error_code = 0;

// The Python package packs mxmoe_tensor with struct.pack (python/mxmoe/_lib.py, TENSOR_FORMATS).
static_assert(sizeof(mxmoe_tensor) == 152 && offsetof(mxmoe_tensor, shape) == 24 &&
              offsetof(mxmoe_tensor, strides) == 88);
// mxmoe_quant_stats is quant_stats seen from C: device statistics are written by the kernels in
// the C++ layout and read by the caller in the C one.
static_assert(sizeof(mxmoe_quant_stats) == sizeof(quant_stats));
static_assert(offsetof(mxmoe_quant_stats, nonfinite_blocks) == offsetof(quant_stats, nonfinite_blocks));
static_assert(offsetof(mxmoe_quant_stats, error_sq) == offsetof(quant_stats, error_sq));
static_assert(MXMOE_BF16 == static_cast<int>(dtype::bf16) && MXMOE_I64 == static_cast<int>(dtype::i64));
static_assert(MXMOE_RULE_FLOOR == static_cast<int>(mx::scale_rule::floor) &&
              MXMOE_RULE_EVEN == static_cast<int>(mx::scale_rule::even) &&
              MXMOE_RULE_RCEIL == static_cast<int>(mx::scale_rule::rceil) &&
              MXMOE_RULE_MSE == static_cast<int>(mx::scale_rule::mse));
static_assert(MXMOE_SCALES_TILED_128X4 == static_cast<int>(scale_layout::tiled_128x4));

const char* const kDtypeNames = "0 (bf16), 1 (f16), 2 (f32), 3 (u8), 4 (i32) or 5 (i64)";

bool multiply_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }

void copy_out(const std::string& s, char* buf, size_t size) {
  if (!buf || size == 0) return;
  const size_t n = s.size() < size - 1 ? s.size() : size - 1;
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

scale_layout to_layout(int32_t layout) {
  MXMOE_CHECK_ARG(layout == MXMOE_SCALES_LINEAR || layout == MXMOE_SCALES_TILED_128X4, "layout",
                  "0 (linear) or 1 (tiled_128x4)", std::to_string(layout));
  return static_cast<scale_layout>(layout);
}

void copy_stats(const quant_stats& s, mxmoe_quant_stats* out) {
  if (out) std::memcpy(out, &s, sizeof s);
}

}  // namespace

mx::scale_rule to_rule(int32_t rule) {
  MXMOE_CHECK_ARG(rule >= MXMOE_RULE_FLOOR && rule <= MXMOE_RULE_MSE, "rule",
                  "0 (floor), 1 (even), 2 (rceil) or 3 (mse)", std::to_string(rule));
  return static_cast<mx::scale_rule>(rule);
}

device_kind to_device_kind(int32_t device_type, const char* name) {
  MXMOE_CHECK_ARG(device_type == MXMOE_DEVICE_CPU || device_type == MXMOE_DEVICE_CUDA, name, "0 (cpu) or 1 (cuda)",
                  std::to_string(device_type));
  return device_type == MXMOE_DEVICE_CUDA ? device_kind::cuda : device_kind::cpu;
}

device_ref to_device(int32_t device_type, int32_t device_id, const char* name) {
  const device_kind kind = to_device_kind(device_type, name);
  return {kind, kind == device_kind::cuda ? device_id : 0};
}

void check_output(const tensor_view& dst, const std::string& name, dtype type, const std::vector<int64_t>& shape) {
  MXMOE_CHECK_ARG(dst.device == device_kind::cpu, name, "a host tensor", "a cuda tensor");
  check_tensor(dst, name.c_str(), {type}, shape);
}

tensor_view optional_view(const mxmoe_tensor* t, const char* name) {
  if (!t) return {};
  const std::string n = name;
  MXMOE_CHECK_ARG(t->dtype >= MXMOE_BF16 && t->dtype <= MXMOE_I64, n + ".dtype", kDtypeNames,
                  std::to_string(t->dtype));
  MXMOE_CHECK_ARG(t->device_type == MXMOE_DEVICE_CPU || t->device_type == MXMOE_DEVICE_CUDA, n + ".device_type",
                  "0 (cpu) or 1 (cuda)", std::to_string(t->device_type));
  MXMOE_CHECK_ARG(t->device_id >= 0, n + ".device_id", "a device ordinal >= 0", std::to_string(t->device_id));
  MXMOE_CHECK_ARG(t->ndim >= 0 && t->ndim <= MXMOE_MAX_RANK, n + ".ndim",
                  "a rank in [0, " + std::to_string(MXMOE_MAX_RANK) + "]", std::to_string(t->ndim));
  tensor_view v;
  v.data = t->data;
  v.type = static_cast<dtype>(t->dtype);
  v.device = t->device_type == MXMOE_DEVICE_CUDA ? device_kind::cuda : device_kind::cpu;
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; ++i) {
    MXMOE_CHECK_ARG(t->shape[i] >= 0, n, "sizes >= 0", "size " + std::to_string(t->shape[i]) + " in dimension " + std::to_string(i));
    MXMOE_CHECK_ARG(t->strides[i] >= 0, n, "strides >= 0",
                    "stride " + std::to_string(t->strides[i]) + " in dimension " + std::to_string(i));
    MXMOE_CHECK_ARG(!multiply_overflows(numel, t->shape[i], &numel), n, "fewer than 2^63 elements", "more");
    v.shape.push_back(t->shape[i]);
    v.strides.push_back(t->strides[i]);
  }
  return v;
}

tensor_view required_view(const mxmoe_tensor* t, const char* name) {
  MXMOE_CHECK_ARG(t != nullptr, name, "a tensor", "NULL");
  return optional_view(t, name);
}

std::string to_string(device_ref d) {
  return d.kind == device_kind::cuda ? "cuda:" + std::to_string(d.id) : std::string("cpu");
}

device_ref device_of(const mxmoe_tensor& t) {
  if (t.device_type == MXMOE_DEVICE_CUDA) return {device_kind::cuda, t.device_id};
  return {device_kind::cpu, 0};
}

namespace {
bool same(device_ref a, device_ref b) { return a.kind == b.kind && a.id == b.id; }
}  // namespace

device_ref common_device(std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors) {
  const char* first = nullptr;
  device_ref d;
  for (const auto& [name, t] : tensors) {
    if (!t) continue;
    if (!first) {
      first = name;
      d = device_of(*t);
      continue;
    }
    MXMOE_CHECK_ARG(same(device_of(*t), d), name, "a tensor on " + to_string(d) + " like " + first,
                    "a tensor on " + to_string(device_of(*t)));
  }
  MXMOE_CHECK_ARG(first != nullptr, tensors.begin()->first, "a tensor", "NULL");
  return d;
}

void require_device(device_ref d, const char* where,
                    std::initializer_list<std::pair<const char*, const mxmoe_tensor*>> tensors) {
  for (const auto& [name, t] : tensors)
    if (t)
      MXMOE_CHECK_ARG(same(device_of(*t), d), name, "a tensor on " + to_string(d) + " (" + where + ")",
                      "a tensor on " + to_string(device_of(*t)));
}

mxmoe_status status_from_current_exception() noexcept {
  try {
    g_error_code = 0;
    try {
      throw;
    } catch (const mxmoe::invalid_argument& e) {
      g_error = e.what();
      g_error_arg = e.arg();
      return MXMOE_ERR_INVALID_ARGUMENT;
    } catch (const mxmoe::unsupported& e) {
      g_error = e.what();
      g_error_arg.clear();
      return MXMOE_ERR_UNSUPPORTED;
    } catch (const std::bad_alloc&) {
      g_error = "out of host memory";
      g_error_arg.clear();
      return MXMOE_ERR_OUT_OF_MEMORY;
    } catch (const std::invalid_argument& e) {
      g_error = e.what();
      g_error_arg.clear();
      return MXMOE_ERR_INVALID_ARGUMENT;
    } catch (const format_error& e) {
      g_error = e.what();
      g_error_arg.clear();
      return MXMOE_ERR_FORMAT;
    } catch (const std::system_error& e) {
      g_error = e.what();
      g_error_arg.clear();
      g_error_code = e.code().value();
      return MXMOE_ERR_IO;
    } catch (const cancelled& e) {
      g_error = e.what();
      g_error_arg.clear();
      return MXMOE_ERR_CANCELLED;
    } catch (const std::runtime_error& e) {
      g_error = e.what();
      g_error_arg.clear();
      // The CUDA backend reports a failed cudaMalloc as a runtime_error with CUDA's text.
      return g_error.find("out of memory") != std::string::npos ? MXMOE_ERR_OUT_OF_MEMORY : MXMOE_ERR_RUNTIME;
    } catch (const std::exception& e) {
      g_error = std::string("internal error: ") + e.what();
      g_error_arg.clear();
      return MXMOE_ERR_INTERNAL;
    } catch (...) {
      g_error = "internal error: unknown exception";
      g_error_arg.clear();
      return MXMOE_ERR_INTERNAL;
    }
  } catch (...) {  // assigning the message itself failed
    return MXMOE_ERR_OUT_OF_MEMORY;
  }
}

}  // namespace mxmoe::c_api

using namespace mxmoe;
using namespace mxmoe::c_api;

extern "C" {

int32_t mxmoe_abi_version(void) { return MXMOE_C_ABI_VERSION; }
const char* mxmoe_version(void) { return MXMOE_VERSION_STRING; }
int32_t mxmoe_built_with_cuda(void) {
#if MXMOE_C_API_CUDA
  return 1;
#else
  return 0;
#endif
}
const char* mxmoe_last_error(void) { return g_error.c_str(); }
const char* mxmoe_last_error_argument(void) { return g_error_arg.c_str(); }
int32_t mxmoe_last_error_code(void) { return g_error_code; }

mxmoe_status mxmoe_cuda_available(int32_t device, int32_t* available, char* why, size_t why_size) {
  return guarded([&] {
    MXMOE_CHECK_ARG(available != nullptr, "available", "a pointer to the result", "NULL");
    std::string reason;
    *available = cuda::available(&reason, device) ? 1 : 0;
    copy_out(reason, why, why_size);
  });
}

mxmoe_status mxmoe_cuda_device_name(int32_t device, char* name, size_t name_size) {
  return guarded([&] { copy_out(cuda::device_name(device), name, name_size); });
}

mxmoe_status mxmoe_stream_capturing(void* stream, int32_t* capturing) {
  return guarded([&] {
    MXMOE_CHECK_ARG(capturing != nullptr, "capturing", "a pointer to the result", "NULL");
#if MXMOE_C_API_CUDA
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so that the caller's next CUDA call does not see it
      throw std::runtime_error("CUDA error: " + std::string(cudaGetErrorString(err)) +
                               " asking whether a stream is capturing");
    }
    *capturing = status != cudaStreamCaptureStatusNone ? 1 : 0;  // active, or invalidated (still capturing)
#else
    (void)stream;
    throw unsupported("mxmoe_stream_capturing: this build has no CUDA (built with MXMOE_CUDA=OFF)");
#endif
  });
}

mxmoe_status mxmoe_device_alloc(int32_t device, int64_t bytes, void** ptr) {
  return guarded([&] {
    MXMOE_CHECK_ARG(ptr != nullptr, "ptr", "a pointer to the result", "NULL");
    MXMOE_CHECK_ARG(bytes > 0, "bytes", "a size > 0", std::to_string(bytes));
    *ptr = nullptr;
#if MXMOE_C_API_CUDA
    const device_guard guard(device);
    const cudaError_t err = cudaMalloc(ptr, static_cast<size_t>(bytes));
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw std::bad_alloc();
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("CUDA error: " + std::string(cudaGetErrorString(err)) + " allocating " +
                               std::to_string(bytes) + " bytes on cuda:" + std::to_string(device));
    }
#else
    (void)device;
    throw unsupported("mxmoe_device_alloc: this build has no CUDA (built with MXMOE_CUDA=OFF)");
#endif
  });
}

void mxmoe_device_free(int32_t device, void* ptr) {
#if MXMOE_C_API_CUDA
  if (!ptr) return;
  try {
    const device_guard guard(device);
    if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();  // a free has no one to report to
  } catch (...) {  // the device cannot be made current: nothing left to free on it
  }
#else
  (void)device;
  (void)ptr;
#endif
}

mxmoe_status mxmoe_scale_bytes(int64_t rows, int64_t k, int32_t layout, int64_t* bytes) {
  return guarded([&] {
    const scale_layout l = to_layout(layout);
    MXMOE_CHECK_ARG(rows >= 0, "rows", "rows >= 0", std::to_string(rows));
    MXMOE_CHECK_ARG(k > 0 && k % mx::kBlockSize == 0, "k", "K > 0, a multiple of 32", std::to_string(k));
    MXMOE_CHECK_ARG(bytes != nullptr, "bytes", "a pointer to the result", "NULL");
    const int64_t cols = k / mx::kBlockSize;
    *bytes = l == scale_layout::linear ? layout::scale_linear{rows, cols}.size()
                                       : layout::scale_tiled_128x4{rows, cols}.size();
  });
}

mxmoe_status mxmoe_quantize(const mxmoe_tensor* x, int32_t rule, int32_t layout, const mxmoe_tensor* packed,
                            const mxmoe_tensor* scales, mxmoe_quant_stats* host_stats, void* device_stats,
                            void* stream) {
  return guarded([&] {
    const tensor_view xv = required_view(x, "x"), pv = required_view(packed, "packed"),
                      sv = required_view(scales, "scales");
    const mx::scale_rule r = to_rule(rule);
    const scale_layout l = to_layout(layout);
    MXMOE_CHECK_ARG(!(host_stats && device_stats), "device_stats", "NULL when host_stats is given", "both");
    const device_ref d = common_device({{"x", x}, {"packed", packed}, {"scales", scales}});
    if (d.kind == device_kind::cpu) {
      MXMOE_CHECK_ARG(device_stats == nullptr, "device_stats", "NULL for cpu tensors (host_stats gives the statistics)",
                      "a pointer");
      copy_stats(mxmoe::quantize(xv, r, l, pv, sv), host_stats);
      return;
    }
    device_guard guard(d.id);
    if (host_stats) copy_stats(cuda::quantize(xv, r, l, pv, sv, stream), host_stats);
    else cuda::quantize_async(xv, r, l, pv, sv, static_cast<quant_stats*>(device_stats), stream);
  });
}

mxmoe_status mxmoe_dequantize(const mxmoe_tensor* packed, const mxmoe_tensor* scales, int32_t layout,
                              const mxmoe_tensor* out, void* stream) {
  return guarded([&] {
    const tensor_view pv = required_view(packed, "packed"), sv = required_view(scales, "scales"),
                      ov = required_view(out, "out");
    const scale_layout l = to_layout(layout);
    const device_ref d = common_device({{"packed", packed}, {"scales", scales}, {"out", out}});
    if (d.kind == device_kind::cpu) return mxmoe::dequantize(pv, sv, l, ov);
    device_guard guard(d.id);
    cuda::dequantize(pv, sv, l, ov, stream);
  });
}

}  // extern "C"
