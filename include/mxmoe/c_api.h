/* mxmoe/c_api.h — the stable C ABI over mxmoe's public C++ API (libmxmoe_c.so).
 *
 * What it is for: calling mxmoe from any language without C++ (the Python package `mxmoe` calls
 * it through ctypes; one library serves every Python version because nothing here depends on
 * Python). Every function:
 *   - validates every argument before it writes anything (the C++ API's checks),
 *   - never lets a C++ exception cross the boundary: it returns an mxmoe_status, and on failure
 *     mxmoe_last_error() / mxmoe_last_error_argument() (thread-local, valid until the next call
 *     on the same thread) say what went wrong and which argument,
 *   - runs CUDA work on the given stream (a cudaStream_t; NULL = the legacy default stream) with
 *     the tensors' device made current for the call (and restored after).
 *
 * Tensors are passed as mxmoe_tensor: a non-owning (pointer, dtype, device, shape, strides in
 * elements). An optional tensor is a NULL pointer. The library keeps no pointer to a caller's
 * tensor after a call returns (mxmoe_moe_prepare copies or uploads what it needs).
 *
 * ABI rules: enums are int32_t with fixed values; structs only grow at the end, and only with a
 * new MXMOE_C_ABI_VERSION; callers check mxmoe_abi_version() against the header they built with.
 */
#ifndef MXMOE_C_API_H_
#define MXMOE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MXMOE_C_EXPORT __declspec(dllexport)
#else
#define MXMOE_C_EXPORT __attribute__((visibility("default")))
#endif

#define MXMOE_C_ABI_VERSION 1
#define MXMOE_MAX_RANK 8

typedef int32_t mxmoe_status;
enum {
  MXMOE_OK = 0,
  MXMOE_ERR_INVALID_ARGUMENT = 1, /* mxmoe::invalid_argument: mxmoe_last_error_argument() names it */
  MXMOE_ERR_UNSUPPORTED = 2,      /* mxmoe::unsupported: no GPU, CPU-only build, path not built */
  MXMOE_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
  MXMOE_ERR_RUNTIME = 4,          /* a CUDA or other runtime error (std::runtime_error) */
  MXMOE_ERR_INTERNAL = 5,         /* anything else: a bug in mxmoe */
};

/* Element types: the values of mxmoe::dtype. */
enum { MXMOE_BF16 = 0, MXMOE_F16 = 1, MXMOE_F32 = 2, MXMOE_U8 = 3, MXMOE_I32 = 4, MXMOE_I64 = 5 };
enum { MXMOE_DEVICE_CPU = 0, MXMOE_DEVICE_CUDA = 1 };
/* mx::scale_rule, mxmoe::scale_layout */
enum { MXMOE_RULE_FLOOR = 0, MXMOE_RULE_EVEN = 1, MXMOE_RULE_RCEIL = 2, MXMOE_RULE_MSE = 3 };
enum { MXMOE_SCALES_LINEAR = 0, MXMOE_SCALES_TILED_128X4 = 1 };
/* mxmoe::routing_kind, activation_kind, layout::gate_up_order, weight_format */
enum { MXMOE_ROUTING_SOFTMAX_TOPK = 0, MXMOE_ROUTING_TOPK_SOFTMAX = 1, MXMOE_ROUTING_SIGMOID_GROUPED_TOPK = 2 };
enum { MXMOE_ACT_SILU_MUL = 0, MXMOE_ACT_SWIGLU_CLAMPED = 1 };
enum { MXMOE_GATE_UP_CONCATENATED = 0, MXMOE_GATE_UP_INTERLEAVED = 1 };
enum { MXMOE_WEIGHTS_MXFP4 = 0, MXMOE_WEIGHTS_BF16 = 1 };

typedef struct mxmoe_tensor {
  void* data;
  int32_t dtype;       /* MXMOE_BF16 ... */
  int32_t device_type; /* MXMOE_DEVICE_CPU | MXMOE_DEVICE_CUDA */
  int32_t device_id;   /* CUDA ordinal; 0 for the CPU */
  int32_t ndim;        /* 0 .. MXMOE_MAX_RANK */
  int64_t shape[MXMOE_MAX_RANK];
  int64_t strides[MXMOE_MAX_RANK]; /* in elements */
} mxmoe_tensor;

/* The same fields, in the same order, as mxmoe::quant_stats (device statistics are written in
 * this layout). */
typedef struct mxmoe_quant_stats {
  int64_t elements, blocks, saturated_blocks, clamped_elements, flushed_elements, nonfinite_blocks;
  double signal_sq, error_sq;
} mxmoe_quant_stats;

/* ---- library, errors, devices ---------------------------------------------------------- */

MXMOE_C_EXPORT int32_t mxmoe_abi_version(void);
MXMOE_C_EXPORT const char* mxmoe_version(void);     /* "0.1.0" */
MXMOE_C_EXPORT int32_t mxmoe_built_with_cuda(void); /* 1 when the sm_90a backend is compiled in */
/* The last failure on this thread: the full message, and the argument it names ("" if none). */
MXMOE_C_EXPORT const char* mxmoe_last_error(void);
MXMOE_C_EXPORT const char* mxmoe_last_error_argument(void);

/* *available = 1 when device `device` is a usable sm_90 GPU; otherwise 0 and `why` (NUL-
 * terminated, truncated to why_size) says why. */
MXMOE_C_EXPORT mxmoe_status mxmoe_cuda_available(int32_t device, int32_t* available, char* why, size_t why_size);
MXMOE_C_EXPORT mxmoe_status mxmoe_cuda_device_name(int32_t device, char* name, size_t name_size);

/* ---- quantize / dequantize (mxmoe/quantize.h) ------------------------------------------ */

/* Bytes of the scales of one [rows, K] matrix in `layout` (K a multiple of 32). */
MXMOE_C_EXPORT mxmoe_status mxmoe_scale_bytes(int64_t rows, int64_t k, int32_t layout, int64_t* bytes);

/* x bf16 | f16 | f32 [..., rows, K] -> packed u8 [..., rows, K/2], scales u8 (see quantize.h).
 * Statistics: host_stats (CPU tensors, or CUDA tensors with the stream synchronized), or
 * device_stats (CUDA only: device memory for one mxmoe_quant_stats, written when the stream gets
 * there; capturable), or neither (CUDA: the cheaper kernel without statistics). Not both. */
MXMOE_C_EXPORT mxmoe_status mxmoe_quantize(const mxmoe_tensor* x, int32_t rule, int32_t layout,
                                           const mxmoe_tensor* packed, const mxmoe_tensor* scales,
                                           mxmoe_quant_stats* host_stats, void* device_stats, void* stream);

/* packed u8 [..., rows, K/2], scales u8 -> out bf16 | f32 [..., rows, K]. */
MXMOE_C_EXPORT mxmoe_status mxmoe_dequantize(const mxmoe_tensor* packed, const mxmoe_tensor* scales, int32_t layout,
                                             const mxmoe_tensor* out, void* stream);

/* ---- the MoE layer (mxmoe/moe.h, mxmoe/cuda.h) ------------------------------------------- */

typedef struct mxmoe_moe_config {
  int64_t experts, hidden, intermediate; /* E, H, I */
  int32_t routing_kind;
  int32_t top_k;
  int32_t renormalize; /* softmax_topk */
  int32_t n_group, topk_group;
  float routed_scaling_factor; /* sigmoid_grouped_topk */
  int32_t activation_kind;
  float alpha, limit; /* swiglu_clamped */
  int32_t gate_up_order;
} mxmoe_moe_config;

/* Checkpoint-layout weights (mxmoe::moe_weights); NULL = not given. */
typedef struct mxmoe_moe_weights {
  int32_t format; /* MXMOE_WEIGHTS_MXFP4 | MXMOE_WEIGHTS_BF16 */
  const mxmoe_tensor* gate_up_blocks; /* mxfp4: u8 [E, 2I, H/32, 16] */
  const mxmoe_tensor* gate_up_scales; /* mxfp4: u8 [E, 2I, H/32] */
  const mxmoe_tensor* down_blocks;    /* mxfp4: u8 [E, H, I/32, 16] */
  const mxmoe_tensor* down_scales;    /* mxfp4: u8 [E, H, I/32] */
  const mxmoe_tensor* gate_up;        /* bf16: [E, 2I, H] */
  const mxmoe_tensor* down;           /* bf16: [E, H, I] */
  const mxmoe_tensor* gate_up_bias;   /* bf16 | f32 [E, 2I] */
  const mxmoe_tensor* down_bias;      /* bf16 | f32 [E, H] */
  const mxmoe_tensor* router_weight;  /* bf16 | f32 [E, H] */
  const mxmoe_tensor* router_bias;    /* bf16 | f32 [E] */
  const mxmoe_tensor* correction_bias; /* f32 [E] */
} mxmoe_moe_weights;

/* Prepared weights: owns its memory (host for the CPU backend, device for CUDA). */
typedef struct mxmoe_moe mxmoe_moe;

/* Validates cfg and weights and prepares them for the backend of (device_type, device_id): the
 * CPU backend keeps a copy; CUDA uploads and repacks into the kernel layout (MXFP4 only). */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_prepare(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                              int32_t device_type, int32_t device_id, mxmoe_moe** layer);
MXMOE_C_EXPORT void mxmoe_moe_free(mxmoe_moe* layer); /* NULL is a no-op */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_device(const mxmoe_moe* layer, int32_t* device_type, int32_t* device_id);
/* Bytes of workspace forward needs for up to max_tokens tokens (0 for the CPU backend), and the
 * memory the prepared weights occupy. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_workspace_bytes(const mxmoe_moe* layer, int64_t max_tokens, int64_t* bytes);
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_weight_bytes(const mxmoe_moe* layer, int64_t* bytes);

/* x [T, H] -> out [T, H]. Routing from logits f32 | bf16 [T, E], or precomputed ids i32 [T, k]
 * and weights f32 [T, k], or (CPU only) from the router weights given at prepare (all NULL).
 * CPU: x bf16 | f32, out f32 | bf16. CUDA: x and out bf16, on the layer's device; no host
 * synchronization, capturable in a CUDA graph. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_forward(const mxmoe_moe* layer, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                                              const mxmoe_tensor* ids, const mxmoe_tensor* weights,
                                              const mxmoe_tensor* out, void* workspace, int64_t workspace_bytes,
                                              void* stream);
/* How close mxmoe_moe_forward on a backend is to the float64 reference (cpu::moe_forward in
 * precision::f64) on the same MXFP4 weights: the relative L2 error its tests hold it to. */
MXMOE_C_EXPORT mxmoe_status mxmoe_forward_rel_l2_tolerance(int32_t device_type, double* tolerance);
/* CUDA: bit 0 set when a precomputed expert id was outside [0, E) (synchronizes). CPU: 0. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_error_flags(const mxmoe_moe* layer, const void* workspace,
                                                  int64_t workspace_bytes, uint32_t* flags);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_C_API_H_ */
