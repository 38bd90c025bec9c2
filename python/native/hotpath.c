/* mxmoe._hotpath: the per-call path of the Python package, in C.
 *
 * Why it exists: through ctypes alone a forward spent ~8 us in Python on an H200 host (reading
 * five tensors' pointer, dtype, device, shape and strides from Python, packing them, the ctypes
 * call), against a target of <= 5 us added per forward (docs/performance.md). This module reads
 * torch tensors in one call each (torch.utils.dlpack.to_dlpack: one capsule with every field,
 * about half the cost of reading the attributes one by one, measured in docs/performance.md),
 * fills the C ABI's mxmoe_tensor structs, queries torch's current stream, allocates the output
 * through torch and takes the workspace the prepared layer keeps for that stream (allocating
 * one only on the first call, a larger forward or under CUDA-graph capture), and calls
 * mxmoe_moe_forward with the GIL released.
 *
 * It calls the C ABI (include/mxmoe/c_api.h) through the function pointers of the library the
 * package already loaded with ctypes (bind()): one copy of the library in the process, whatever
 * path MXMOE_LIBRARY names, and no link-time dependency between this module and libmxmoe_c.so.
 * Built against the stable ABI (Py_LIMITED_API 3.11, set by python/native/CMakeLists.txt): the
 * one _hotpath.abi3.so imports on every CPython from 3.11.
 *
 * What stays in Python (python/mxmoe): arrays other than torch tensors (numpy, DLPack producers)
 * are described by mxmoe._tensor.view, and every error is worded there or by the library (the
 * message names the argument and the expected value); this module only decides that a call
 * failed and hands over to the Python function that raises.
 */
#if !defined(Py_LIMITED_API)
#error "build with Py_LIMITED_API (python/native/CMakeLists.txt sets it)"
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "mxmoe/c_api.h"

/* ---- DLPack (https://dmlc.github.io/dlpack/latest/c_api.html): what to_dlpack's capsule holds */
typedef struct {
  int32_t device_type, device_id;
} DLDevice;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor*);
} DLManagedTensor;
enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4 };

/* ---- what bind() / bind_torch() hand over ------------------------------------------------ */
static struct {
  __typeof__(mxmoe_moe_forward)* forward;
  __typeof__(mxmoe_moe_workspace_bytes)* workspace_bytes;
  __typeof__(mxmoe_moe_device)* device;
  __typeof__(mxmoe_stream_capturing)* stream_capturing;
} abi;

/* Python callables (mxmoe._lib, _tensor, _moe), each documented where it is defined. */
static PyObject* raise_last_error; /* (status) -> raises the thread's last error */
static PyObject* invalid;          /* (argument, expected, got) -> InvalidArgument */
static PyObject* other_view;       /* (obj, name, writable, stream) -> packed mxmoe_tensor bytes */
static PyObject* other_empty_like; /* (like, name) -> a new array like `like` */
static PyObject* torch_reject;     /* (tensor, name, error or None) -> raises why it cannot be read */
static PyObject* live_layer;       /* (layer id) -> raises for a closed or collected layer */
static PyObject* live_layers;      /* dict: layer id -> weakref to the PreparedMoE */
static PyObject* new_workspace;    /* (layer, stream, bytes, capturing) -> (tensor, pointer, bytes) */

static struct {
  PyObject* tensor_type; /* torch.Tensor */
  PyObject* to_dlpack;   /* torch.utils.dlpack.to_dlpack */
  PyObject* empty_like;  /* torch.empty_like */
  PyObject* raw_stream;  /* device index -> the current cudaStream_t of that device, as an int */
  PyObject* contiguous;  /* {"memory_format": torch.contiguous_format} */
} torch;

static PyObject *s_handle, *s_live_handle, *s_data_ptr, *s_workspaces;

static const int64_t kItemSize[] = {2, 2, 4, 1, 4, 8}; /* by MXMOE_BF16 ... MXMOE_I64 */

/* A tensor argument: the C struct, and (for an array other than a torch tensor) the Python
 * bytes it was read from, which may hold a DLPack capsule keeping the data alive. */
typedef struct {
  mxmoe_tensor t;
  int given;       /* 0: None (a NULL pointer for the C ABI) */
  int torch;       /* a torch tensor */
  PyObject* keep;  /* owned reference or NULL */
} arg_view;

static void release(arg_view* v) { Py_CLEAR(v->keep); }
static const mxmoe_tensor* ptr(const arg_view* v) { return v->given ? &v->t : NULL; }

static int is_torch(PyObject* obj) {
  return torch.tensor_type && PyObject_TypeCheck(obj, (PyTypeObject*)torch.tensor_type);
}

static int dtype_of(DLDataType t) {
  if (t.lanes != 1) return -1;
  switch (t.code) {
    case DL_BFLOAT: return t.bits == 16 ? MXMOE_BF16 : -1;
    case DL_FLOAT: return t.bits == 16 ? MXMOE_F16 : t.bits == 32 ? MXMOE_F32 : -1;
    case DL_UINT: return t.bits == 8 ? MXMOE_U8 : -1;
    case DL_INT: return t.bits == 32 ? MXMOE_I32 : t.bits == 64 ? MXMOE_I64 : -1;
    default: return -1;
  }
}

/* Hands the failure to Python, which raises InvalidArgument naming `name`; the pending error
 * (to_dlpack's, if any) goes along as the reason when Python finds no other. Returns -1. */
static int reject_torch(PyObject* t, const char* name) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* r = PyObject_CallFunction(torch_reject, "OsO", t, name, value ? value : Py_None);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_SystemError, "mxmoe._hotpath: torch_reject did not raise for %s", name);
  return -1;
}

/* A torch tensor's fields from one to_dlpack capsule (the capsule and its reference to the
 * tensor are released before returning: the caller's tensor keeps the storage alive). */
static int read_torch(PyObject* t, const char* name, mxmoe_tensor* out) {
  PyObject* capsule = PyObject_CallFunctionObjArgs(torch.to_dlpack, t, NULL);
  if (!capsule) return reject_torch(t, name);
  DLManagedTensor* m = (DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
  if (!m) {
    Py_DECREF(capsule);
    return reject_torch(t, name);
  }
  const DLTensor* d = &m->dl_tensor;
  const int code = dtype_of(d->dtype);
  const int cuda = d->device.device_type == DL_CUDA;
  const int host = d->device.device_type == DL_CPU || d->device.device_type == DL_CUDA_HOST;
  int ok = code >= 0 && (cuda || host) && d->ndim >= 0 && d->ndim <= MXMOE_MAX_RANK;
  if (ok) {
    out->data = (char*)d->data + d->byte_offset;
    out->dtype = code;
    out->device_type = cuda ? MXMOE_DEVICE_CUDA : MXMOE_DEVICE_CPU;
    out->device_id = cuda ? d->device.device_id : 0;
    out->ndim = d->ndim;
    int64_t stride = 1;
    for (int i = d->ndim - 1; i >= 0; --i) {
      out->shape[i] = d->shape[i];
      out->strides[i] = d->strides ? d->strides[i] : stride;
      stride *= d->shape[i];
    }
  }
  Py_DECREF(capsule);
  return ok ? 0 : reject_torch(t, name);
}

/* Any array argument (None: not given). Non-torch arrays go through mxmoe._tensor.view. */
static int view_of(PyObject* obj, const char* name, int writable, PyObject* stream, arg_view* v) {
  memset(v, 0, sizeof *v);
  if (obj == Py_None) return 0;
  v->given = 1;
  if (is_torch(obj)) {
    v->torch = 1;
    return read_torch(obj, name, &v->t);
  }
  PyObject* packed = PyObject_CallFunction(other_view, "OsOO", obj, name, writable ? Py_True : Py_False, stream);
  if (!packed) return -1;
  char* bytes;
  Py_ssize_t size;
  if (PyBytes_AsStringAndSize(packed, &bytes, &size) < 0 || size != (Py_ssize_t)sizeof(mxmoe_tensor)) {
    Py_DECREF(packed);
    if (!PyErr_Occurred()) PyErr_Format(PyExc_SystemError, "mxmoe._hotpath: a view of %s is not an mxmoe_tensor", name);
    return -1;
  }
  memcpy(&v->t, bytes, sizeof v->t);
  v->keep = packed;
  return 0;
}

static int raise_invalid(const char* argument, PyObject* expected, PyObject* got) {
  if (expected && got) {
    PyObject* e = PyObject_CallFunction(invalid, "sOO", argument, expected, got);
    if (e) {
      PyErr_SetObject((PyObject*)Py_TYPE(e), e);
      Py_DECREF(e);
    }
  }
  Py_XDECREF(expected);
  Py_XDECREF(got);
  return -1;
}

/* "memory on cuda:1" / "memory on cpu" */
static PyObject* memory_on(int32_t type, int32_t id, const char* suffix) {
  return type == MXMOE_DEVICE_CUDA ? PyUnicode_FromFormat("memory on cuda:%d%s", (int)id, suffix)
                                   : PyUnicode_FromFormat("memory on cpu%s", suffix);
}

/* "shape [2, 3] with strides [1, 2]" */
static PyObject* shape_text(const mxmoe_tensor* t) {
  PyObject *shape = PyList_New(t->ndim), *strides = PyList_New(t->ndim), *text = NULL;
  for (int i = 0; shape && strides && i < t->ndim; ++i) {
    PyList_SetItem(shape, i, PyLong_FromLongLong(t->shape[i]));
    PyList_SetItem(strides, i, PyLong_FromLongLong(t->strides[i]));
  }
  if (shape && strides && !PyErr_Occurred()) text = PyUnicode_FromFormat("shape %R with strides %R", shape, strides);
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  return text;
}

/* Raw memory (a workspace): a contiguous array's pointer and size in bytes. */
/* Whether t's strides are the compact row-major ones of its shape (what torch calls
 * contiguous: dimensions of size 1 may have any stride). */
static int compact(const mxmoe_tensor* t) {
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

static int contiguous_bytes(const mxmoe_tensor* t, const char* name, int64_t* nbytes) {
  if (!compact(t)) return raise_invalid(name, PyUnicode_FromString("a contiguous array"), shape_text(t));
  if (t->dtype < 0 || t->dtype > MXMOE_I64) return raise_invalid(name, PyUnicode_FromString("a known dtype"),
                                                                 PyUnicode_FromFormat("%d", (int)t->dtype));
  int64_t elements = 1;
  for (int i = 0; i < t->ndim; ++i) elements *= t->shape[i];
  *nbytes = elements * kItemSize[t->dtype];
  return 0;
}

/* buffer(obj, name) -> (pointer, bytes, (device type, device id)) of a contiguous array. */
static PyObject* py_buffer(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "buffer(obj, name)");
    return NULL;
  }
  const char* name = PyUnicode_AsUTF8AndSize(args[1], NULL);
  if (!name) return NULL;
  arg_view v;
  int64_t nbytes = 0;
  PyObject* r = NULL;
  if (view_of(args[0], name, 1, Py_None, &v) == 0 && contiguous_bytes(&v.t, name, &nbytes) == 0)
    r = Py_BuildValue("NL(ii)", PyLong_FromVoidPtr(v.t.data), (long long)nbytes, (int)v.t.device_type,
                      (int)v.t.device_id);
  release(&v);
  return r;
}

/* torch_view(tensor, name) -> the packed mxmoe_tensor of a torch tensor (what _tensor.view
 * returns for one). */
static PyObject* py_torch_view(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 || !PyUnicode_Check(args[1]) || !torch.to_dlpack) {
    PyErr_SetString(PyExc_TypeError, "torch_view(tensor, name), after bind_torch()");
    return NULL;
  }
  const char* name = PyUnicode_AsUTF8AndSize(args[1], NULL);
  mxmoe_tensor t;
  memset(&t, 0, sizeof t);
  if (!name || read_torch(args[0], name, &t) < 0) return NULL;
  return PyBytes_FromStringAndSize((const char*)&t, sizeof t);
}

/* The stream a call on x runs on: `stream` if given, else torch's current stream on a CUDA
 * tensor's device, else NULL (the legacy default stream). */
static int stream_of(PyObject* stream, const arg_view* x, void** out) {
  *out = NULL;
  if (stream != Py_None) {
    *out = PyLong_AsVoidPtr(stream);
    return PyErr_Occurred() ? -1 : 0;
  }
  if (!x->torch || x->t.device_type != MXMOE_DEVICE_CUDA) return 0;
  PyObject* s = PyObject_CallFunction(torch.raw_stream, "i", (int)x->t.device_id);
  if (!s) return -1;
  *out = PyLong_AsVoidPtr(s);
  Py_DECREF(s);
  return PyErr_Occurred() ? -1 : 0;
}

/* A tensor this module allocated (contiguous, of known dtype, shape and device): only its data
 * pointer is read, which costs a fraction of a to_dlpack capsule. */
static int read_allocated(PyObject* t, int32_t dtype, int32_t device_type, int32_t device_id, int ndim,
                          const int64_t* shape, arg_view* v) {
  memset(v, 0, sizeof *v);
  v->given = v->torch = 1;
  PyObject* p = PyObject_CallMethodObjArgs(t, s_data_ptr, NULL);
  if (!p) return -1;
  v->t.data = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  v->t.dtype = dtype;
  v->t.device_type = device_type;
  v->t.device_id = device_id;
  v->t.ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    v->t.shape[i] = shape[i];
    v->t.strides[i] = stride;
    stride *= shape[i];
  }
  return PyErr_Occurred() ? -1 : 0;
}

/* out: the caller's, or (out None) a new contiguous one like x for a torch x (what the torch op's
 * fake returns): torch.empty_like(x), whose preserved format is the contiguous one when x is
 * compact (0.3 us cheaper than passing memory_format, measured in docs/performance.md), else
 * torch.empty_like(x, memory_format=torch.contiguous_format); for other arrays
 * mxmoe._tensor.empty_like. Returns a new reference. */
static PyObject* output_of(PyObject* x, const arg_view* vx, PyObject* out, PyObject* stream, arg_view* vout) {
  if (out != Py_None) {
    if (view_of(out, "out", 1, stream, vout) < 0) return NULL;
    Py_INCREF(out);
    return out;
  }
  if (!vx->torch) {
    PyObject* made = PyObject_CallFunction(other_empty_like, "Os", x, "out");
    if (made && view_of(made, "out", 1, stream, vout) < 0) Py_CLEAR(made);
    return made;
  }
  PyObject* made;
  if (compact(&vx->t)) {
    made = PyObject_CallFunctionObjArgs(torch.empty_like, x, NULL);
  } else {
    PyObject* args = PyTuple_Pack(1, x);
    made = args ? PyObject_Call(torch.empty_like, args, torch.contiguous) : NULL;
    Py_XDECREF(args);
  }
  if (made && read_allocated(made, vx->t.dtype, vx->t.device_type, vx->t.device_id, vx->t.ndim, vx->t.shape, vout) < 0)
    Py_CLEAR(made);
  return made;
}

/* The workspace of a CUDA forward (docs/python.md, "The workspace"): the caller's (checked
 * contiguous, on the layer's device), or (workspace None, x a torch tensor on the layer's device)
 * one of at least layer.workspace_bytes(T) bytes:
 *   - outside CUDA-graph capture, for a forward that needs at most _moe.CACHED_WORKSPACE_BYTES,
 *     the one the layer keeps for this stream (PreparedMoE._workspaces[stream]: a dictionary
 *     look-up per call; _moe.new_workspace makes it on the stream's first such forward);
 *   - otherwise (a larger forward, or the stream capturing a graph) one from torch's caching
 *     allocator for this call (_moe.new_workspace): a capture's comes from the graph's own pool,
 *     which torch keeps for as long as the graph lives, so no graph shares memory with another
 *     or with eager forwards.
 * A stream runs its work in order, so the forwards sharing a stream's workspace never overlap,
 * and forwards on two streams never share one. Sets *owned to a reference that keeps the
 * workspace alive until the call is enqueued. */
/* The bytes of a workspace entry (owner, pointer, bytes); -1 for anything else. */
static int64_t workspace_entry_bytes(PyObject* entry) {
  if (!PyTuple_Check(entry) || PyTuple_Size(entry) != 3 || !PyLong_Check(PyTuple_GetItem(entry, 1))) return -1;
  const long long bytes = PyLong_AsLongLong(PyTuple_GetItem(entry, 2));
  if (bytes == -1 && PyErr_Occurred()) PyErr_Clear();
  return bytes;
}

static int workspace_of(PyObject* layer, mxmoe_moe* handle, int32_t layer_type, int32_t layer_id, const arg_view* vx,
                        PyObject* workspace, PyObject* stream, void* cuda_stream, arg_view* vws, int64_t* ws_bytes,
                        PyObject** owned) {
  if (workspace != Py_None) {
    if (view_of(workspace, "workspace", 1, stream, vws) < 0 || contiguous_bytes(&vws->t, "workspace", ws_bytes) < 0)
      return -1;
    if (vws->t.device_type == layer_type && vws->t.device_id == layer_id) return 0;
    return raise_invalid("workspace", memory_on(layer_type, layer_id, " (where the layer is)"),
                         memory_on(vws->t.device_type, vws->t.device_id, ""));
  }
  int64_t need = 0;
  const int64_t tokens = vx->given && vx->t.ndim ? vx->t.shape[0] : 0;
  mxmoe_status status = abi.workspace_bytes(handle, tokens < 0 ? 0 : tokens, &need);
  if (status) {
    Py_XDECREF(PyObject_CallFunction(raise_last_error, "i", (int)status));
    return -1;
  }
  if (!vx->torch)
    return raise_invalid("workspace", PyUnicode_FromFormat("device memory of %lld bytes", (long long)need),
                         PyUnicode_FromString("none"));
  if (vx->t.device_type != layer_type || vx->t.device_id != layer_id) /* the default workspace follows x */
    return raise_invalid("x", memory_on(layer_type, layer_id, " (where the layer is)"),
                         memory_on(vx->t.device_type, vx->t.device_id, ""));
  int32_t capturing = 0;
  status = abi.stream_capturing(cuda_stream, &capturing);
  if (status) {
    Py_XDECREF(PyObject_CallFunction(raise_last_error, "i", (int)status));
    return -1;
  }
  PyObject* key = PyLong_FromVoidPtr(cuda_stream);
  if (!key) return -1;
  PyObject* entry = NULL; /* (owner, pointer, bytes), what new_workspace returns */
  if (!capturing) {
    PyObject* cache = PyObject_GetAttr(layer, s_workspaces);
    if (!cache) {
      Py_DECREF(key);
      return -1;
    }
    entry = PyDict_GetItemWithError(cache, key); /* borrowed */
    Py_XINCREF(entry);
    Py_DECREF(cache);
    if (!entry && PyErr_Occurred()) {
      Py_DECREF(key);
      return -1;
    }
    if (entry && workspace_entry_bytes(entry) < need) Py_CLEAR(entry);
  }
  if (!entry) entry = PyObject_CallFunction(new_workspace, "OOLO", layer, key, (long long)need, capturing ? Py_True : Py_False);
  Py_DECREF(key);
  if (!entry) return -1;
  if (workspace_entry_bytes(entry) < need) {
    Py_DECREF(entry);
    PyErr_Format(PyExc_SystemError, "mxmoe._hotpath: new_workspace did not return (owner, pointer, bytes >= %lld)",
                 (long long)need);
    return -1;
  }
  *owned = entry;
  memset(vws, 0, sizeof *vws);
  vws->given = vws->torch = 1;
  vws->t.data = PyLong_AsVoidPtr(PyTuple_GetItem(entry, 1));
  *ws_bytes = PyLong_AsLongLong(PyTuple_GetItem(entry, 2));
  vws->t.dtype = MXMOE_U8;
  vws->t.device_type = layer_type;
  vws->t.device_id = layer_id;
  vws->t.ndim = 1;
  vws->t.shape[0] = *ws_bytes;
  vws->t.strides[0] = 1;
  return PyErr_Occurred() ? -1 : 0;
}

/* The forward behind mxmoe.moe_forward and torch.ops.mxmoe.moe_forward (see _moe.moe_forward for
 * the arguments). Returns out (a new reference). */
static PyObject* forward(PyObject* layer, PyObject* x, PyObject* logits, PyObject* ids, PyObject* weights, PyObject* out,
                         PyObject* workspace, PyObject* stream) {
  PyObject* h = PyObject_GetAttr(layer, s_handle);
  if (!h) return NULL;
  mxmoe_moe* handle = (mxmoe_moe*)PyLong_AsVoidPtr(h);
  Py_DECREF(h);
  if (!handle) { /* closed: _live_handle raises the error */
    if (!PyErr_Occurred()) Py_XDECREF(PyObject_CallMethodObjArgs(layer, s_live_handle, NULL));
    return NULL;
  }
  int32_t layer_type = 0, layer_id = 0;
  mxmoe_status status = abi.device(handle, &layer_type, &layer_id);
  if (status) return PyObject_CallFunction(raise_last_error, "i", (int)status);

  arg_view vx, vlogits, vids, vweights, vout, vws;
  memset(&vx, 0, sizeof vx);
  vlogits = vids = vweights = vout = vws = vx;
  PyObject* result = NULL;
  PyObject* ws_owned = NULL;
  int64_t ws_bytes = 0;
  void* cuda_stream = NULL;
  if (view_of(x, "x", 0, stream, &vx) < 0 || !(result = output_of(x, &vx, out, stream, &vout))) goto done;
  if (stream_of(stream, &vx, &cuda_stream) < 0) goto fail;
  if (layer_type == MXMOE_DEVICE_CUDA && workspace_of(layer, handle, layer_type, layer_id, &vx, workspace, stream,
                                                      cuda_stream, &vws, &ws_bytes, &ws_owned) < 0)
    goto fail;
  if (view_of(logits, "routing.logits", 0, stream, &vlogits) < 0 || view_of(ids, "routing.ids", 0, stream, &vids) < 0 ||
      view_of(weights, "routing.weights", 0, stream, &vweights) < 0)
    goto fail;
  /* Every pointer stays valid without the GIL: the caller's objects (and `result`, ws_owned)
   * hold the memory, and vx..vws hold what a DLPack producer handed over. */
  Py_BEGIN_ALLOW_THREADS
  status = abi.forward(handle, ptr(&vx), ptr(&vlogits), ptr(&vids), ptr(&vweights), ptr(&vout), vws.t.data, ws_bytes,
                       cuda_stream);
  Py_END_ALLOW_THREADS
  if (status == MXMOE_OK) goto done;
  Py_XDECREF(PyObject_CallFunction(raise_last_error, "i", (int)status));
fail:
  Py_CLEAR(result);
done:
  release(&vx);
  release(&vlogits);
  release(&vids);
  release(&vweights);
  release(&vout);
  release(&vws);
  Py_XDECREF(ws_owned);
  return result;
}

/* moe_forward(layer, x, logits, topk_ids, topk_weights, out, workspace, stream) -> out. */
static PyObject* py_moe_forward(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "moe_forward(layer, x, logits, topk_ids, topk_weights, out, workspace, stream)");
    return NULL;
  }
  return forward(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7]);
}

/* torch_moe_forward(x, logits, topk_ids, topk_weights, layer_id) -> out: the kernel of
 * torch.ops.mxmoe.moe_forward (CPU and CUDA), the layer found by PreparedMoE.id. */
static PyObject* py_torch_moe_forward(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 5 || !live_layers) {
    PyErr_SetString(PyExc_TypeError, "torch_moe_forward(x, logits, topk_ids, topk_weights, layer), after bind()");
    return NULL;
  }
  PyObject* ref = PyDict_GetItemWithError(live_layers, args[4]); /* borrowed */
  PyObject* layer = ref ? PyObject_CallNoArgs(ref) : NULL;
  if (!layer || layer == Py_None) {
    Py_XDECREF(layer);
    if (!PyErr_Occurred()) Py_XDECREF(PyObject_CallFunctionObjArgs(live_layer, args[4], NULL));
    return NULL;
  }
  PyObject* out = forward(layer, args[0], args[1], args[2], args[3], Py_None, Py_None, Py_None);
  Py_DECREF(layer);
  return out;
}

/* *slot = value (a new reference), dropping the old one (Py_XSETREF is not in the limited API). */
static int set_ref(PyObject** slot, PyObject* value) {
  PyObject* old = *slot;
  Py_INCREF(value);
  *slot = value;
  Py_XDECREF(old);
  return 0;
}

/* bind(**objects): the C ABI's function addresses (forward, workspace_bytes, device,
 * stream_capturing: ints from ctypes) and the Python callables above, by name; each module binds what it defines. */
static PyObject* py_bind(PyObject* self, PyObject* args, PyObject* kwargs) {
  (void)self;
  if (PyTuple_Size(args) != 0 || !kwargs) {
    PyErr_SetString(PyExc_TypeError, "bind(name=object, ...)");
    return NULL;
  }
  static const struct {
    const char* name;
    PyObject** slot;
  } objects[] = {{"raise_last_error", &raise_last_error}, {"invalid", &invalid},
                 {"other_view", &other_view},             {"other_empty_like", &other_empty_like},
                 {"torch_reject", &torch_reject},         {"live_layer", &live_layer},
                 {"live_layers", &live_layers},           {"new_workspace", &new_workspace}};
  static const struct {
    const char* name;
    void** slot;
  } functions[] = {{"forward", (void**)&abi.forward},
                   {"workspace_bytes", (void**)&abi.workspace_bytes},
                   {"device", (void**)&abi.device},
                   {"stream_capturing", (void**)&abi.stream_capturing}};
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(kwargs, &pos, &key, &value)) {
    const char* name = PyUnicode_AsUTF8AndSize(key, NULL);
    if (!name) return NULL;
    int found = 0;
    for (size_t i = 0; !found && i < sizeof objects / sizeof objects[0]; ++i)
      if (strcmp(name, objects[i].name) == 0) found = 1 + set_ref(objects[i].slot, value);
    for (size_t i = 0; !found && i < sizeof functions / sizeof functions[0]; ++i)
      if (strcmp(name, functions[i].name) == 0) {
        *functions[i].slot = PyLong_AsVoidPtr(value);
        if (PyErr_Occurred()) return NULL;
        found = 1;
      }
    if (!found) return PyErr_Format(PyExc_TypeError, "bind: unknown name %s", name);
  }
  Py_RETURN_NONE;
}

/* bind_torch(tensor_type, to_dlpack, empty_like, raw_stream, contiguous_format): torch, once it
 * is in use. */
static PyObject* py_bind_torch(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *tensor_type, *to_dlpack, *empty_like, *raw_stream, *contiguous_format;
  if (!PyArg_ParseTuple(args, "O!OOOO:bind_torch", &PyType_Type, &tensor_type, &to_dlpack, &empty_like, &raw_stream,
                        &contiguous_format))
    return NULL;
  PyObject* contiguous = Py_BuildValue("{sO}", "memory_format", contiguous_format);
  if (!contiguous) return NULL;
  set_ref(&torch.contiguous, contiguous);
  Py_DECREF(contiguous);
  set_ref(&torch.to_dlpack, to_dlpack);
  set_ref(&torch.empty_like, empty_like);
  set_ref(&torch.raw_stream, raw_stream);
  set_ref(&torch.tensor_type, tensor_type); /* last: is_torch() is true from here on */
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"moe_forward", (PyCFunction)(void (*)(void))py_moe_forward, METH_FASTCALL,
     "moe_forward(layer, x, logits, topk_ids, topk_weights, out, workspace, stream) -> out"},
    {"torch_moe_forward", (PyCFunction)(void (*)(void))py_torch_moe_forward, METH_FASTCALL,
     "torch_moe_forward(x, logits, topk_ids, topk_weights, layer_id) -> out"},
    {"torch_view", (PyCFunction)(void (*)(void))py_torch_view, METH_FASTCALL,
     "torch_view(tensor, name) -> bytes of the tensor's mxmoe_tensor"},
    {"buffer", (PyCFunction)(void (*)(void))py_buffer, METH_FASTCALL,
     "buffer(obj, name) -> (pointer, bytes, (device type, device id)) of a contiguous array"},
    {"bind", (PyCFunction)(void (*)(void))py_bind, METH_VARARGS | METH_KEYWORDS,
     "bind(name=object, ...): the C ABI's function addresses and the package's Python helpers"},
    {"bind_torch", py_bind_torch, METH_VARARGS,
     "bind_torch(tensor_type, to_dlpack, empty_like, raw_stream, contiguous_format)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath", "mxmoe's per-call path in C (hotpath.c)", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__hotpath(void) {
  s_handle = PyUnicode_InternFromString("_handle");
  s_live_handle = PyUnicode_InternFromString("_live_handle");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_workspaces = PyUnicode_InternFromString("_workspaces");
  if (!s_handle || !s_live_handle || !s_data_ptr || !s_workspaces) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m && PyModule_AddIntConstant(m, "ABI_VERSION", MXMOE_C_ABI_VERSION) < 0) Py_CLEAR(m);
  return m;
}
