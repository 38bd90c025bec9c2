// libmxmoe_torch.so: the kernels of torch.ops.mxmoe.moe_forward and moe_forward_out (the same
// forward into the caller's output) (CPU and CUDA) in C++, registered
// with torch's dispatcher through PyTorch's stable ABI (torch/csrc/stable: STABLE_TORCH_LIBRARY_IMPL,
// the aoti_torch_* C shim), so that a forward through the op touches no Python object.
//
// Why it exists: the kernel registered from Python (hotpath.c's torch_moe_forward, called by the
// dispatcher through Python) added +7.8 us per forward over the C++ call on the H200 host, against
// a target of <= 5 us: torch boxing the call into Python objects, the output allocated through
// torch.empty_like from C, the current stream asked from Python (docs/performance.md). Here the
// dispatcher calls C++ directly; the output is at::empty_strided through the shim, the stream is
// torch's current CUDA stream through the shim.
//
// What it keeps of the Python path (python/native/hotpath.c, docs/python.md "The workspace"):
// - the layer is named by PreparedMoE.id; mxmoe.torch registers every layer here
//   (mxmoe_torch_layer_add) and this library then owns its handle: it is freed (mxmoe_moe_free)
//   when the layer is released (close or collection) and no forward of it is running;
// - CUDA tensors run on torch's current stream of x's device; the C ABI makes that device current
//   for the call; CPU tensors on the CPU backend;
// - a CUDA forward's workspace: outside graph capture and up to the kept bound (1 MiB, the
//   package's CACHED_WORKSPACE_BYTES), one the layer keeps per stream, allocated by the library
//   (mxmoe_device_alloc) on the stream's first such forward and freed with the layer; under
//   capture or for a larger forward, torch memory (the caching allocator: the graph's own pool
//   while capturing) for the call. These are separate from the ones mxmoe.moe_forward keeps
//   (PreparedMoE._workspaces): a layer used through both on one stream holds two.
// - errors: the same checks and messages, in the same order (a tensor's dtype, device and rank
//   as mxmoe._tensor.torch_reject words them; the rest is the library's own message). They
//   leave as C++ exceptions whose message starts with "mxmoe.<exception class>: ", which torch
//   turns into ValueError (std::invalid_argument: InvalidArgument) or RuntimeError, and which
//   mxmoe.torch.moe_forward turns back into mxmoe's exception (mxmoe/_torchop.py).
//
// It calls the C ABI (include/mxmoe/c_api.h) through the function pointers of the library the
// package already loaded with ctypes (mxmoe_torch_bind), like hotpath.c: one copy of
// libmxmoe_c.so in the process, no link-time dependency on it. It links only libtorch_cpu.so
// (where torch keeps the stable C shim) and is loaded after `import torch`, which has loaded
// that library: no rpath. torch's current CUDA stream comes from libtorch_cuda.so, looked up at
// the first CUDA forward (dlopen RTLD_NOLOAD), so that the one build also loads with a CPU-only
// torch. No Python: the same file loads on every Python version, and (stable ABI, built for
// TORCH_TARGET_VERSION 2.10) on torch 2.10 and later.
//
// Limits: moe_forward and moe_forward_out only (quantize / dequantize stay registered from
// Python: their cost per call matters less); the caller must not close a layer while another
// thread captures a CUDA graph in global mode (freeing its kept workspace calls cudaFree, which
// CUDA refuses then).
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include "mxmoe/c_api.h"

#define MXMOE_TORCH_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using torch::stable::Tensor;

// The C ABI functions this library calls, in the order mxmoe_torch_bind receives them.
struct abi_functions {
  decltype(&mxmoe_moe_forward) forward;
  decltype(&mxmoe_moe_workspace_bytes) workspace_bytes;
  decltype(&mxmoe_stream_capturing) stream_capturing;
  decltype(&mxmoe_device_alloc) device_alloc;
  decltype(&mxmoe_device_free) device_free;
  decltype(&mxmoe_moe_free) moe_free;
  decltype(&mxmoe_last_error) last_error;
};
constexpr int32_t kAbiFunctions = sizeof(abi_functions) / sizeof(void*);
abi_functions abi;
std::atomic<bool> bound{false};

// ---- errors -------------------------------------------------------------------------------

// mxmoe's Python exception class of a C ABI status (mxmoe._lib.raise_last_error's mapping; I/O
// and cancellation cannot come from a forward).
const char* exception_class(mxmoe_status status) {
  switch (status) {
    case MXMOE_ERR_INVALID_ARGUMENT: return "InvalidArgument";
    case MXMOE_ERR_UNSUPPORTED: return "Unsupported";
    case MXMOE_ERR_OUT_OF_MEMORY: return "OutOfMemory";
    case MXMOE_ERR_RUNTIME: return "RuntimeFailure";
    case MXMOE_ERR_FORMAT: return "FormatError";
    default: return "Error";
  }
}

[[noreturn]] void raise(mxmoe_status status, const std::string& message) {
  std::string text = std::string("mxmoe.") + exception_class(status) + ": " + message;
  if (status == MXMOE_ERR_INVALID_ARGUMENT) throw std::invalid_argument(text);  // torch: ValueError
  throw std::runtime_error(text);                                                // torch: RuntimeError
}

// Worded like mxmoe::invalid_argument (and mxmoe._errors.invalid).
[[noreturn]] void invalid(const char* argument, const std::string& expected, const std::string& got) {
  raise(MXMOE_ERR_INVALID_ARGUMENT, std::string("argument '") + argument + "': expected " + expected + ", got " + got);
}

void check(mxmoe_status status) {
  if (status != MXMOE_OK) raise(status, abi.last_error());
}

// A shim call failed: torch logged its exception to stderr; the shim returns only a code.
void shim(AOTITorchError error, const char* call) {
  if (error != AOTI_TORCH_SUCCESS) raise(MXMOE_ERR_INTERNAL, std::string("torch's ") + call + " failed (torch printed why)");
}

// ---- torch tensors --------------------------------------------------------------------------

// torch's dtype and device codes, which the stable ABI hands out through functions (their values
// are not part of it); asked once.
struct torch_codes {
  int32_t dtype[MXMOE_I64 + 1];  // by MXMOE_BF16 ... MXMOE_I64
  int32_t cpu, cuda;
};
const torch_codes& codes() {
  static const torch_codes c = {{aoti_torch_dtype_bfloat16(), aoti_torch_dtype_float16(), aoti_torch_dtype_float32(),
                                 aoti_torch_dtype_uint8(), aoti_torch_dtype_int32(), aoti_torch_dtype_int64()},
                                aoti_torch_device_type_cpu(),
                                aoti_torch_device_type_cuda()};
  return c;
}

// str(torch dtype) without "torch.", for the dtypes the shim can name.
std::string dtype_name(int32_t code) {
  static const std::pair<int32_t (*)(), const char*> names[] = {
      {aoti_torch_dtype_float64, "float64"},       {aoti_torch_dtype_int8, "int8"},
      {aoti_torch_dtype_int16, "int16"},           {aoti_torch_dtype_uint16, "uint16"},
      {aoti_torch_dtype_uint32, "uint32"},         {aoti_torch_dtype_uint64, "uint64"},
      {aoti_torch_dtype_bool, "bool"},             {aoti_torch_dtype_complex32, "complex32"},
      {aoti_torch_dtype_complex64, "complex64"},   {aoti_torch_dtype_complex128, "complex128"},
      {aoti_torch_dtype_float8_e5m2, "float8_e5m2"}, {aoti_torch_dtype_float8_e4m3fn, "float8_e4m3fn"},
      {aoti_torch_dtype_float8_e5m2fnuz, "float8_e5m2fnuz"}, {aoti_torch_dtype_float8_e4m3fnuz, "float8_e4m3fnuz"}};
  for (const auto& [fn, name] : names)
    if (fn() == code) return name;
  return "torch dtype code " + std::to_string(code);
}

std::string device_name(int32_t type, int32_t index) {
  static const std::pair<int32_t (*)(), const char*> names[] = {{aoti_torch_device_type_meta, "meta"},
                                                                {aoti_torch_device_type_xpu, "xpu"},
                                                                {aoti_torch_device_type_mps, "mps"}};
  std::string name = "device type " + std::to_string(type);
  for (const auto& [fn, n] : names)
    if (fn() == type) name = n;
  return index >= 0 ? name + ":" + std::to_string(index) : name;
}

// "cuda:1" / "cpu" of a C ABI device.
std::string device_text(int32_t type, int32_t id) {
  return type == MXMOE_DEVICE_CUDA ? "cuda:" + std::to_string(id) : std::string("cpu");
}

// "memory on cuda:1" / "memory on cpu", as hotpath.c's memory_on.
std::string memory_on(int32_t type, int32_t id) { return "memory on " + device_text(type, id); }

// A torch tensor as the C ABI's mxmoe_tensor, and torch's codes for it (to allocate one like it).
struct arg {
  mxmoe_tensor t{};
  int32_t torch_dtype = 0, torch_device = 0, torch_index = 0;
};

// The checks of mxmoe._tensor.torch_reject, in its order; the library checks the rest.
arg read(const Tensor& tensor, const char* name) {
  const AtenTensorHandle h = tensor.get();
  arg a;
  shim(aoti_torch_get_dtype(h, &a.torch_dtype), "aoti_torch_get_dtype");
  a.t.dtype = -1;
  for (int32_t code = MXMOE_BF16; code <= MXMOE_I64; ++code)
    if (codes().dtype[code] == a.torch_dtype) a.t.dtype = code;
  if (a.t.dtype < 0) invalid(name, "dtype bf16 | f16 | f32 | u8 | i32 | i64", dtype_name(a.torch_dtype));
  shim(aoti_torch_get_device_type(h, &a.torch_device), "aoti_torch_get_device_type");
  shim(aoti_torch_get_device_index(h, &a.torch_index), "aoti_torch_get_device_index");
  const bool cuda = a.torch_device == codes().cuda;
  if (!cuda && a.torch_device != codes().cpu)
    invalid(name, "a cpu or cuda tensor", "a tensor on " + device_name(a.torch_device, a.torch_index));
  int64_t ndim = 0;
  shim(aoti_torch_get_dim(h, &ndim), "aoti_torch_get_dim");
  if (ndim > MXMOE_MAX_RANK)
    invalid(name, "a tensor of rank <= " + std::to_string(MXMOE_MAX_RANK), "rank " + std::to_string(ndim));
  int64_t *sizes = nullptr, *strides = nullptr;
  shim(aoti_torch_get_sizes(h, &sizes), "aoti_torch_get_sizes");
  shim(aoti_torch_get_strides(h, &strides), "aoti_torch_get_strides");
  shim(aoti_torch_get_data_ptr(h, &a.t.data), "aoti_torch_get_data_ptr");  // storage offset included
  a.t.device_type = cuda ? MXMOE_DEVICE_CUDA : MXMOE_DEVICE_CPU;
  a.t.device_id = cuda ? a.torch_index : 0;
  a.t.ndim = static_cast<int32_t>(ndim);
  for (int64_t i = 0; i < ndim; ++i) {
    a.t.shape[i] = sizes[i];
    a.t.strides[i] = strides[i];
  }
  return a;
}

std::optional<arg> read(const std::optional<Tensor>& tensor, const char* name) {
  if (!tensor) return std::nullopt;
  return read(*tensor, name);
}

// A new contiguous tensor like `like` (what the op's fake returns: torch.empty_like(x,
// memory_format=torch.contiguous_format)), and its view.
Tensor empty_contiguous(const arg& like, mxmoe_tensor* view) {
  *view = like.t;
  int64_t stride = 1;
  for (int i = like.t.ndim - 1; i >= 0; --i) {
    view->strides[i] = stride;
    stride *= like.t.shape[i];
  }
  AtenTensorHandle h = nullptr;
  if (aoti_torch_empty_strided(like.t.ndim, like.t.shape, view->strides, like.torch_dtype, like.torch_device,
                               like.torch_index, &h) != AOTI_TORCH_SUCCESS)
    raise(MXMOE_ERR_OUT_OF_MEMORY, "torch could not allocate the output, " + std::to_string(stride) +
                                       " elements on " + device_text(like.t.device_type, like.t.device_id) +
                                       " (torch printed why)");
  Tensor out(h);
  shim(aoti_torch_get_data_ptr(h, &view->data), "aoti_torch_get_data_ptr");
  return out;
}

// torch's current cudaStream_t on `device`. The shim that gives it lives in libtorch_cuda.so,
// which this library does not link (it would not load with a CPU-only torch): a CUDA tensor
// means torch has loaded it.
void* current_cuda_stream(int32_t device) {
  using stream_fn = AOTITorchError (*)(int32_t, void**);
  static const stream_fn fn = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<stream_fn>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  if (!fn) raise(MXMOE_ERR_UNSUPPORTED, "torch's CUDA library (libtorch_cuda.so) is not loaded: no current CUDA stream");
  void* stream = nullptr;
  shim(fn(device, &stream), "aoti_torch_get_current_cuda_stream");
  return stream;
}

// ---- layers -----------------------------------------------------------------------------------

std::atomic<int64_t> kept_workspace_bytes{1 << 20};  // mxmoe._moe.CACHED_WORKSPACE_BYTES, set at bind

struct layer {
  mxmoe_moe* handle;
  int32_t device_type, device_id;
  struct kept {
    void* stream;
    void* ptr;
    int64_t bytes;
  };
  std::mutex mutex;  // guards the two lists: forwards on several threads share the layer
  std::vector<kept> workspaces;  // one per stream
  std::vector<void*> outgrown;   // kept ones replaced after the bound was raised: work may still use them

  layer(mxmoe_moe* h, int32_t type, int32_t id) : handle(h), device_type(type), device_id(id) {}
  layer(const layer&) = delete;
  layer& operator=(const layer&) = delete;
  ~layer() {
    for (const kept& k : workspaces) abi.device_free(device_id, k.ptr);  // cudaFree waits for the device
    for (void* p : outgrown) abi.device_free(device_id, p);
    abi.moe_free(handle);
  }
};

// id -> layer. A forward holds its own reference, so a layer released meanwhile (closed or
// collected on another thread) is freed when that forward returns, not under it. Never destroyed:
// at process exit the CUDA runtime may already be gone, and the process frees everything anyway.
struct registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<layer>> layers;
};
registry& layers() {
  static registry* r = new registry;
  return *r;
}

std::shared_ptr<layer> find_layer(int64_t id) {
  registry& r = layers();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.layers.find(id);
  return it == r.layers.end() ? nullptr : it->second;
}

// A CUDA forward's workspace (docs/python.md, "The workspace"; hotpath.c's workspace_of):
// `owner` keeps torch memory for the call alive until the forward is enqueued.
struct workspace {
  void* ptr = nullptr;
  int64_t bytes = 0;
  std::optional<Tensor> owner;
};

workspace workspace_for(layer& l, const arg& x, void* stream) {
  const int64_t tokens = x.t.ndim ? x.t.shape[0] : 0;
  int64_t need = 0;
  check(abi.workspace_bytes(l.handle, tokens < 0 ? 0 : tokens, &need));
  if (x.t.device_type != l.device_type || x.t.device_id != l.device_id)  // the workspace follows x
    invalid("x", memory_on(l.device_type, l.device_id) + " (where the layer is)",
            memory_on(x.t.device_type, x.t.device_id));
  int32_t capturing = 0;
  check(abi.stream_capturing(stream, &capturing));
  const int64_t bound = kept_workspace_bytes.load(std::memory_order_relaxed);
  workspace ws;
  if (!capturing && need <= bound) {
    std::lock_guard<std::mutex> lock(l.mutex);
    for (layer::kept& k : l.workspaces) {
      if (k.stream != stream) continue;
      if (k.bytes < need) {  // kept before the bound was raised
        void* p = nullptr;
        check(abi.device_alloc(l.device_id, bound, &p));
        l.outgrown.push_back(k.ptr);
        k.ptr = p;
        k.bytes = bound;
      }
      ws.ptr = k.ptr;
      ws.bytes = k.bytes;
      return ws;
    }
    check(abi.device_alloc(l.device_id, bound, &ws.ptr));
    l.workspaces.push_back({stream, ws.ptr, bound});
    ws.bytes = bound;
    return ws;
  }
  AtenTensorHandle h = nullptr;
  const int64_t one = 1;
  if (aoti_torch_empty_strided(1, &need, &one, codes().dtype[MXMOE_U8], codes().cuda, l.device_id, &h) !=
      AOTI_TORCH_SUCCESS)
    raise(MXMOE_ERR_OUT_OF_MEMORY, "torch could not allocate the forward's workspace, " + std::to_string(need) +
                                       " bytes on cuda:" + std::to_string(l.device_id) + " (torch printed why)");
  ws.owner.emplace(h);
  shim(aoti_torch_get_data_ptr(h, &ws.ptr), "aoti_torch_get_data_ptr");
  ws.bytes = need;
  return ws;
}

// ---- the kernel -------------------------------------------------------------------------------

const mxmoe_tensor* ptr(const std::optional<arg>& a) { return a ? &a->t : nullptr; }

// The layer an op names by id, bound to the C ABI.
std::shared_ptr<layer> live_layer(int64_t layer_id) {
  if (!bound.load(std::memory_order_acquire))
    raise(MXMOE_ERR_INTERNAL, "libmxmoe_torch.so is loaded but not bound to the C ABI: import mxmoe.torch");
  std::shared_ptr<layer> l = find_layer(layer_id);
  if (!l) invalid("layer", "a live PreparedMoE", "id " + std::to_string(layer_id) + ", which was closed or collected");
  return l;
}

// One forward into `vout`, after x and out were read: the stream, the workspace, the routing
// tensors, the call.
void forward_into(layer& l, const arg& vx, mxmoe_tensor* vout, const std::optional<Tensor>& logits,
                  const std::optional<Tensor>& topk_ids, const std::optional<Tensor>& topk_weights) {
  void* stream = vx.t.device_type == MXMOE_DEVICE_CUDA ? current_cuda_stream(vx.t.device_id) : nullptr;
  workspace ws;
  if (l.device_type == MXMOE_DEVICE_CUDA) ws = workspace_for(l, vx, stream);
  const std::optional<arg> vlogits = read(logits, "routing.logits");
  const std::optional<arg> vids = read(topk_ids, "routing.ids");
  const std::optional<arg> vweights = read(topk_weights, "routing.weights");
  check(abi.forward(l.handle, &vx.t, ptr(vlogits), ptr(vids), ptr(vweights), vout, ws.ptr, ws.bytes, stream));
}

// moe_forward(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer) -> Tensor,
// in the order of hotpath.c's forward (so the first bad argument is the one named).
Tensor moe_forward(const Tensor& x, const std::optional<Tensor>& logits, const std::optional<Tensor>& topk_ids,
                   const std::optional<Tensor>& topk_weights, int64_t layer_id) {
  const std::shared_ptr<layer> l = live_layer(layer_id);
  const arg vx = read(x, "x");
  mxmoe_tensor vout;
  Tensor out = empty_contiguous(vx, &vout);
  forward_into(*l, vx, &vout, logits, topk_ids, topk_weights);
  return out;
}

// moe_forward_out(Tensor x, Tensor? logits, Tensor? topk_ids, Tensor? topk_weights, int layer,
// Tensor(a!) out) -> (): the same forward into the caller's `out` ([T, H], contiguous, on x's
// device, a dtype the backend writes: the library checks), no allocation.
void moe_forward_out(const Tensor& x, const std::optional<Tensor>& logits, const std::optional<Tensor>& topk_ids,
                     const std::optional<Tensor>& topk_weights, int64_t layer_id, Tensor out) {
  const std::shared_ptr<layer> l = live_layer(layer_id);
  const arg vx = read(x, "x");
  arg vout = read(out, "out");
  forward_into(*l, vx, &vout.t, logits, topk_ids, topk_weights);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(mxmoe, CPU, m) {
  m.impl("moe_forward", TORCH_BOX(&moe_forward));
  m.impl("moe_forward_out", TORCH_BOX(&moe_forward_out));
}
STABLE_TORCH_LIBRARY_IMPL(mxmoe, CUDA, m) {
  m.impl("moe_forward", TORCH_BOX(&moe_forward));
  m.impl("moe_forward_out", TORCH_BOX(&moe_forward_out));
}

// ---- what the Python package calls (mxmoe/_torchop.py, through ctypes) ------------------------

// The MXMOE_C_ABI_VERSION this library was built against (the package refuses another).
MXMOE_TORCH_EXPORT int32_t mxmoe_torch_abi_version(void) { return MXMOE_C_ABI_VERSION; }

// The C ABI's functions (abi_functions' order; `count` of them) and the kept workspace's size.
// Returns 0, or -1 when count is not what this library expects.
MXMOE_TORCH_EXPORT int32_t mxmoe_torch_bind(void* const* functions, int32_t count, int64_t kept_bytes) {
  if (count != kAbiFunctions || !functions) return -1;
  void** slots = reinterpret_cast<void**>(&abi);
  for (int32_t i = 0; i < count; ++i) slots[i] = functions[i];
  kept_workspace_bytes.store(kept_bytes, std::memory_order_relaxed);
  bound.store(true, std::memory_order_release);
  return 0;
}

// The size of the workspaces kept from now on (tests: mxmoe._moe.CACHED_WORKSPACE_BYTES changed).
MXMOE_TORCH_EXPORT void mxmoe_torch_set_kept_workspace_bytes(int64_t bytes) {
  kept_workspace_bytes.store(bytes, std::memory_order_relaxed);
}

// Registers a prepared layer under `id` (PreparedMoE.id); this library owns `handle` from then on.
// Returns 0, or -1 (the handle not taken) before mxmoe_torch_bind, when the id is taken or when
// memory ran out.
MXMOE_TORCH_EXPORT int32_t mxmoe_torch_layer_add(int64_t id, mxmoe_moe* handle, int32_t device_type,
                                                 int32_t device_id) noexcept {
  if (!bound.load(std::memory_order_acquire)) return -1;  // ~layer calls the C ABI
  try {
    auto l = std::make_shared<layer>(handle, device_type, device_id);
    registry& r = layers();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.layers.emplace(id, l).second) {
      l->handle = nullptr;  // not ours
      return -1;
    }
    return 0;
  } catch (...) {
    return -1;
  }
}

// The layer is gone from Python: later forwards naming it raise; it is freed (handle, kept
// workspaces) once no running forward holds it.
MXMOE_TORCH_EXPORT void mxmoe_torch_layer_release(int64_t id) noexcept {
  std::shared_ptr<layer> last;  // freed after the registry's lock is dropped (cudaFree waits)
  registry& r = layers();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.layers.find(id);
  if (it == r.layers.end()) return;
  last = std::move(it->second);
  r.layers.erase(it);
}

// The workspaces a layer keeps: up to `capacity` (stream, pointer, bytes) written; returns how
// many it keeps (-1: no such layer). For tests and diagnostics.
MXMOE_TORCH_EXPORT int64_t mxmoe_torch_layer_workspaces(int64_t id, void** streams, void** pointers, int64_t* bytes,
                                                        int64_t capacity) noexcept {
  const std::shared_ptr<layer> l = find_layer(id);
  if (!l) return -1;
  std::lock_guard<std::mutex> lock(l->mutex);
  const int64_t n = static_cast<int64_t>(l->workspaces.size());
  for (int64_t i = 0; i < n && i < capacity; ++i) {
    streams[i] = l->workspaces[i].stream;
    pointers[i] = l->workspaces[i].ptr;
    bytes[i] = l->workspaces[i].bytes;
  }
  return n;
}
