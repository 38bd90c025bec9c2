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

#define MXMOE_C_ABI_VERSION 5 /* 3: prepare options (expert maps, tensor-parallel shards);
                                 4: mxmoe_quantize_options.allow_nonfinite;
                                 5: mxmoe_stream_capturing, mxmoe_device_alloc / free,
                                    mxmoe_checkpoint_prepare_layer_with_options */
#define MXMOE_MAX_RANK 8

typedef int32_t mxmoe_status;
enum {
  MXMOE_OK = 0,
  MXMOE_ERR_INVALID_ARGUMENT = 1, /* mxmoe::invalid_argument: mxmoe_last_error_argument() names it */
  MXMOE_ERR_UNSUPPORTED = 2,      /* mxmoe::unsupported: no GPU, CPU-only build, path not built */
  MXMOE_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
  MXMOE_ERR_RUNTIME = 4,          /* a CUDA or other runtime error (std::runtime_error) */
  MXMOE_ERR_INTERNAL = 5,         /* anything else: a bug in mxmoe */
  MXMOE_ERR_FORMAT = 6,           /* mxmoe::format_error: a malformed safetensors file (the message names it) */
  MXMOE_ERR_IO = 7,               /* std::system_error: a file could not be opened, read or written;
                                     mxmoe_last_error_code() is the errno */
  MXMOE_ERR_CANCELLED = 8,        /* a progress callback returned non-zero: the call stopped, wrote nothing */
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
/* The errno of the last MXMOE_ERR_IO on this thread (0 otherwise). */
MXMOE_C_EXPORT int32_t mxmoe_last_error_code(void);

/* *available = 1 when device `device` is a usable sm_90 GPU; otherwise 0 and `why` (NUL-
 * terminated, truncated to why_size) says why. */
MXMOE_C_EXPORT mxmoe_status mxmoe_cuda_available(int32_t device, int32_t* available, char* why, size_t why_size);
MXMOE_C_EXPORT mxmoe_status mxmoe_cuda_device_name(int32_t device, char* name, size_t name_size);
/* *capturing = 1 while `stream` (a cudaStream_t; NULL = the legacy default stream) is capturing a
 * CUDA graph (cudaStreamIsCapturing: work enqueued there now is recorded, not run), else 0. For a
 * caller that keeps scratch memory between calls: memory a captured graph uses must live as long
 * as the graph (the Python package allocates a forward's workspace per call under capture and
 * reuses one per stream otherwise). No synchronization. MXMOE_ERR_UNSUPPORTED in a build
 * without CUDA; MXMOE_ERR_RUNTIME when CUDA cannot answer (no device; the legacy stream queried
 * while another stream captures in global mode). */
MXMOE_C_EXPORT mxmoe_status mxmoe_stream_capturing(void* stream, int32_t* capturing);
/* Device memory for a caller's scratch that outlives one call (the Python package keeps a small
 * forward workspace per layer and stream in it: memory of its own, outside any allocator's pool
 * that a CUDA-graph tool may manage): cudaMalloc of `bytes` (> 0) on `device`, and cudaFree,
 * which waits for the device's work, so memory still used by enqueued work is never freed
 * under it. Not while any stream captures in global mode (CUDA refuses). NULL is a no-op. */
MXMOE_C_EXPORT mxmoe_status mxmoe_device_alloc(int32_t device, int64_t bytes, void** ptr);
MXMOE_C_EXPORT void mxmoe_device_free(int32_t device, void* ptr);

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

/* ---- the MoE layer (mxmoe/moe.h, mxmoe/forward.h) ---------------------------------------- */

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
  const mxmoe_tensor* gate_up_bias;   /* bf16 | f16 | f32 [E, 2I] */
  const mxmoe_tensor* down_bias;      /* bf16 | f16 | f32 [E, H] */
  const mxmoe_tensor* router_weight;  /* bf16 | f16 | f32 [E, H] */
  const mxmoe_tensor* router_bias;    /* bf16 | f16 | f32 [E] */
  const mxmoe_tensor* correction_bias; /* f32 [E] */
} mxmoe_moe_weights;

/* mxmoe::validate(moe_config): MXMOE_ERR_INVALID_ARGUMENT naming the field ("cfg.routing.top_k"). */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_config_validate(const mxmoe_moe_config* cfg);

/* Prepared weights (mxmoe::prepared_moe): owns its memory (host for the CPU backend, device for
 * CUDA). */
typedef struct mxmoe_moe mxmoe_moe;

/* mxmoe::prepare: validates cfg and weights and prepares them for the backend of (device_type,
 * device_id): the CPU backend keeps a copy; CUDA uploads and repacks into the kernel layout on
 * that device (MXFP4 only; expert matrices in host memory or on that device, biases and router
 * tensors in host memory). */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_prepare(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                              int32_t device_type, int32_t device_id, mxmoe_moe** layer);
/* mxmoe::prepare_options (forward.h, shard.h, docs/parallel.md): what part of the layer a prepared
 * layer holds. All zero (or a NULL options pointer) holds all of it. */
typedef struct mxmoe_prepare_options {
  /* NULL, or E entries: expert_map[e] = global expert e's index in the weights' expert dimension
   * (the expert tensors and their biases then hold E_held experts, in that order), -1 for an
   * expert held elsewhere (a slot routed there contributes 0); router tensors keep all E. */
  const int32_t* expert_map;
  int64_t expert_map_size; /* entries of expert_map (0 with NULL) */
  /* Tensor parallelism along I: tp_ranks > 1 cuts shard tp_rank out of the given (host, MXFP4)
   * weights, holding the 32-blocks of I that layout::even_split puts there (the layer's config
   * then has I = I_r; the down bias lives on rank 0). tp_ranks 0 or 1: all of I. */
  int32_t tp_rank, tp_ranks;
} mxmoe_prepare_options;
/* mxmoe_moe_prepare with options (NULL: as mxmoe_moe_prepare). Errors name "expert_map",
 * "tp.rank", "tp.ranks" or the weight that does not fit them. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_prepare_with_options(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                                           const mxmoe_prepare_options* options, int32_t device_type,
                                                           int32_t device_id, mxmoe_moe** layer);
/* The prepared layer's configuration (a tensor-parallel shard's has I = I_r), and its expert map:
 * *size = its entries (0: every expert); written into map when capacity >= *size (map may be NULL
 * to ask the size). */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_config_of(const mxmoe_moe* layer, mxmoe_moe_config* cfg);
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_expert_map(const mxmoe_moe* layer, int32_t* map, int64_t capacity, int64_t* size);
/* shard.h: the first intermediate index and the size I_r of TP shard `rank` of `ranks` for a layer
 * of I = intermediate; the expert map (E entries) of `rank` under the contiguous placement of
 * `experts` experts over `ranks` ranks (expert_map_of(contiguous_owners(E, ranks), rank)). */
MXMOE_C_EXPORT mxmoe_status mxmoe_shard_intermediate(int64_t intermediate, int32_t rank, int32_t ranks, int64_t* begin,
                                                     int64_t* size);
MXMOE_C_EXPORT mxmoe_status mxmoe_contiguous_expert_map(int64_t experts, int32_t ranks, int32_t rank, int32_t* map);
MXMOE_C_EXPORT void mxmoe_moe_free(mxmoe_moe* layer); /* NULL is a no-op */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_device(const mxmoe_moe* layer, int32_t* device_type, int32_t* device_id);
/* Bytes of workspace forward needs for up to max_tokens tokens (0 for the CPU backend), and the
 * memory the prepared weights occupy. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_workspace_bytes(const mxmoe_moe* layer, int64_t max_tokens, int64_t* bytes);
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_weight_bytes(const mxmoe_moe* layer, int64_t* bytes);

/* mxmoe::moe_forward: x [T, H] -> out [T, H]. Routing from logits f32 | bf16 [T, E], or
 * precomputed ids i32 [T, k] and weights f32 [T, k], or (CPU only) from the router weights given
 * at prepare (all NULL). CPU: x bf16 | f32, out f32 | bf16. CUDA: x and out bf16, on the layer's
 * device; no host synchronization, capturable in a CUDA graph. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_forward(const mxmoe_moe* layer, const mxmoe_tensor* x, const mxmoe_tensor* logits,
                                              const mxmoe_tensor* ids, const mxmoe_tensor* weights,
                                              const mxmoe_tensor* out, void* workspace, int64_t workspace_bytes,
                                              void* stream);
/* CUDA: bit 0 set when a precomputed expert id was outside [0, E) (synchronizes). CPU: 0. */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_error_flags(const mxmoe_moe* layer, const void* workspace,
                                                  int64_t workspace_bytes, uint32_t* flags);

/* Benchmarking: `iterations` calls of mxmoe::moe_forward with these arguments from a C++ loop
 * (no synchronization inside it), *seconds = the loop's wall time (steady clock). What a caller's
 * own timing of its calls into mxmoe_moe_forward is compared with (python/benchmarks/overhead.py). */
MXMOE_C_EXPORT mxmoe_status mxmoe_moe_forward_timed(const mxmoe_moe* layer, const mxmoe_tensor* x,
                                                    const mxmoe_tensor* logits, const mxmoe_tensor* ids,
                                                    const mxmoe_tensor* weights, const mxmoe_tensor* out,
                                                    void* workspace, int64_t workspace_bytes, void* stream,
                                                    int64_t iterations, double* seconds);

/* ---- verification (mxmoe/verify.h) ----------------------------------------------------------- */

/* mxmoe::verify_status, cpu::precision (MXMOE_REFERENCE_AUTO: mxmoe::auto_reference). */
enum { MXMOE_VERIFY_PASSED = 0, MXMOE_VERIFY_FAILED = 1, MXMOE_VERIFY_NONFINITE_OUTPUT = 2 };
enum { MXMOE_REFERENCE_F32 = 0, MXMOE_REFERENCE_F64 = 1, MXMOE_REFERENCE_AUTO = 2, MXMOE_REFERENCE_NONE = -1 };

typedef struct mxmoe_verify_result {
  int32_t status;    /* MXMOE_VERIFY_* */
  int32_t reference; /* the reference's precision; MXMOE_REFERENCE_NONE from mxmoe_compare */
  int64_t elements, nonfinite_out, nonfinite_ref;
  double rel_l2;   /* ||out - ref|| / ||ref|| (float64; +inf once a difference is not finite) */
  double max_abs;  /* max |out - ref| */
  double max_ref;  /* max |ref| over its finite elements */
  double tolerance_rel_l2, tolerance_max_err_rel; /* mxmoe::tolerance_for(backend); +inf: not checked */
  double reference_seconds;                       /* time the reference took (0 from mxmoe_compare) */
} mxmoe_verify_result;

/* mxmoe::tolerance_for: the bounds a backend's forward is held to against the float64 reference:
 * rel-L2 <= *rel_l2 and max |out - ref| <= *max_err_rel * max |ref| (+inf: not checked). */
MXMOE_C_EXPORT mxmoe_status mxmoe_forward_tolerance(int32_t device_type, double* rel_l2, double* max_err_rel);
/* mxmoe::compare and judge under tolerance_for(device_type): out and ref host f32 | bf16 tensors
 * of one shape, contiguous. */
MXMOE_C_EXPORT mxmoe_status mxmoe_compare(const mxmoe_tensor* out, const mxmoe_tensor* ref, int32_t device_type,
                                          mxmoe_verify_result* result);
/* mxmoe::verify_forward: runs the reference (cpu::moe_forward in `reference` precision) on cfg,
 * weights (host, checkpoint layout), x and the routing (host tensors, as for mxmoe_moe_forward)
 * and judges out (host f32 | bf16 [T, H], what the backend on device_type computed). */
MXMOE_C_EXPORT mxmoe_status mxmoe_verify(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                         const mxmoe_tensor* x, const mxmoe_tensor* logits, const mxmoe_tensor* ids,
                                         const mxmoe_tensor* routing_weights, const mxmoe_tensor* out,
                                         int32_t device_type, int32_t reference, mxmoe_verify_result* result);

/* ---- synthetic layers and model presets (mxmoe/synthetic.h, mxmoe/presets.h) ------------------- */

/* synthetic::make_layer(cfg, {biases, correction_bias}, seed) written into caller tensors (host,
 * contiguous, exactly these shapes): out->format MXMOE_WEIGHTS_MXFP4; gate_up_blocks u8
 * [E, 2I, H/32, 16], gate_up_scales u8 [E, 2I, H/32], down_blocks u8 [E, H, I/32, 16],
 * down_scales u8 [E, H, I/32]; with biases gate_up_bias bf16 [E, 2I] and down_bias bf16 [E, H];
 * with correction_bias correction_bias f32 [E]. Every other field NULL. */
MXMOE_C_EXPORT mxmoe_status mxmoe_synthetic_layer(const mxmoe_moe_config* cfg, int32_t biases, int32_t correction_bias,
                                                  uint64_t seed, const mxmoe_moe_weights* out);
/* synthetic::make_inputs: x bf16 [T, H] and logits f32 [T, E] (host); the logits from weights'
 * router tensors when it has them (weights may be NULL). */
MXMOE_C_EXPORT mxmoe_status mxmoe_synthetic_inputs(const mxmoe_moe_config* cfg, const mxmoe_moe_weights* weights,
                                                   int64_t tokens, uint64_t seed, const mxmoe_tensor* x,
                                                   const mxmoe_tensor* logits);
/* The model presets (docs/models.md): count, then each by index in [0, count). *name is static. */
MXMOE_C_EXPORT mxmoe_status mxmoe_preset_count(int32_t* count);
MXMOE_C_EXPORT mxmoe_status mxmoe_preset(int32_t index, const char** name, mxmoe_moe_config* cfg, int32_t* has_biases);

/* ---- checkpoints (mxmoe/checkpoint.h, mxmoe/convert.h) ---------------------------------------- */

/* A safetensors file, memory-mapped read-only, its header validated (mxmoe::safetensors_reader). */
typedef struct mxmoe_checkpoint mxmoe_checkpoint;
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_open(const char* path, mxmoe_checkpoint** file);
MXMOE_C_EXPORT void mxmoe_checkpoint_close(mxmoe_checkpoint* file); /* NULL is a no-op */

/* checkpoint::moe_layout */
enum { MXMOE_LAYOUT_MXFP4_GPT_OSS = 0, MXMOE_LAYOUT_BF16_GPT_OSS = 1, MXMOE_LAYOUT_BF16_PER_EXPERT = 2 };
#define MXMOE_ABSENT (-1)

typedef struct mxmoe_layer_info {
  int64_t layer;        /* the decoder layer index L of "...layers.L.mlp." */
  int32_t layout;       /* MXMOE_LAYOUT_* */
  int32_t weight_dtype; /* the expert weights' element type in the file */
  int32_t format;       /* what mxmoe_checkpoint_read_layer gives: MXMOE_WEIGHTS_MXFP4 for the MXFP4
                           layout, MXMOE_WEIGHTS_BF16 (bf16 [E, 2I, H], [E, H, I]) for the others */
  /* The optional tensors' element types, MXMOE_ABSENT where the layer has none. */
  int32_t gate_up_bias_dtype, down_bias_dtype, router_weight_dtype, router_bias_dtype, correction_bias_dtype;
  mxmoe_moe_config config; /* checkpoint::layer_config: the file's mxmoe.moe_config, else the family's */
} mxmoe_layer_info;

/* The MoE layers of the file (checkpoint::find_moe_layers), in layer order: how many, and the
 * index-th one (0 <= index < count; not the decoder layer index). */
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_layer_count(const mxmoe_checkpoint* file, int64_t* count);
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_layer_info(const mxmoe_checkpoint* file, int64_t index,
                                                        mxmoe_layer_info* info);
/* Copies the weights of decoder layer `layer` into caller tensors (host, contiguous, the dtypes and
 * shapes of its mxmoe_layer_info; out->format = info.format). NULL skips a tensor; a tensor given
 * for one the layer does not have is an error. BF16 layers are converted to bf16 [E, 2I, H]
 * (gate/up interleaved) and [E, H, I]. */
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_read_layer(const mxmoe_checkpoint* file, int64_t layer,
                                                        const mxmoe_moe_weights* out);
/* mxmoe_moe_prepare straight from the file (no copy of the weights beyond the prepared layer's
 * own): decoder layer `layer` with cfg (NULL: the file's, as in mxmoe_layer_info). A BF16 layer
 * prepares for the CPU only. The layer does not keep the file open. */
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_prepare_layer(const mxmoe_checkpoint* file, int64_t layer,
                                                           const mxmoe_moe_config* cfg, int32_t device_type,
                                                           int32_t device_id, mxmoe_moe** out);
/* The same with prepare options (NULL: as mxmoe_checkpoint_prepare_layer): the file holds all E
 * experts, so an expert map takes the experts it holds out of the file (select_experts: only
 * theirs are copied, in local order) and a tensor-parallel shard is cut out of the mapped MXFP4
 * weights; errors name "expert_map", "tp.rank", "tp.ranks" as mxmoe_moe_prepare_with_options'. */
MXMOE_C_EXPORT mxmoe_status mxmoe_checkpoint_prepare_layer_with_options(const mxmoe_checkpoint* file, int64_t layer,
                                                                        const mxmoe_moe_config* cfg,
                                                                        const mxmoe_prepare_options* options,
                                                                        int32_t device_type, int32_t device_id,
                                                                        mxmoe_moe** out);

/* Conversion progress: `done` of `total` steps (one per copied tensor, one per converted expert),
 * `note` the tensor just copied or "layer L expert E" (valid during the call). Return 0 to go on,
 * non-zero to stop: the conversion then fails with MXMOE_ERR_CANCELLED and leaves no output. */
typedef int32_t (*mxmoe_progress_fn)(int64_t done, int64_t total, const char* note, void* user_data);

typedef struct mxmoe_quantize_options {
  int32_t rule;                 /* MXMOE_RULE_* */
  int32_t device_type;          /* where the quantizer runs: MXMOE_DEVICE_CPU | MXMOE_DEVICE_CUDA */
  int32_t device_id;            /* CUDA ordinal */
  int32_t overwrite;            /* non-zero: replace an existing output */
  mxmoe_progress_fn progress;   /* optional */
  void* progress_data;          /* passed to progress */
  int32_t allow_nonfinite;      /* non-zero: keep NaN / Inf weights as NaN blocks (scale 0xFF); zero: refuse
                                   them with MXMOE_ERR_INVALID_ARGUMENT, mxmoe_last_error_argument() the
                                   tensor as the file names it, the message its expert and first [row, col] */
} mxmoe_quantize_options;

/* What a quantize_checkpoint did (mxmoe::quantize_report). */
typedef struct mxmoe_quantize_report mxmoe_quantize_report;
typedef struct mxmoe_quantize_summary {
  mxmoe_quant_stats total;     /* every converted tensor merged */
  int64_t tensors;             /* converted tensors: mxmoe_quantize_report_tensor's range */
  int64_t copied_tensors;      /* tensors copied unchanged (router, biases, attention, ...) */
  uint64_t copied_bytes, input_bytes, output_bytes; /* tensor data, headers excluded */
  double seconds;              /* wall time of the whole conversion */
} mxmoe_quantize_summary;
typedef struct mxmoe_tensor_report {
  const char* name;            /* the MXFP4 blocks tensor written; valid while the report lives */
  int32_t ndim;
  int64_t shape[MXMOE_MAX_RANK]; /* [E, N, K/32, 16] */
  mxmoe_quant_stats stats;     /* over all its experts */
} mxmoe_tensor_report;

/* mxmoe::quantize_checkpoint: BF16 MoE checkpoint in_path -> MXFP4 checkpoint out_path (written to
 * a temporary file and renamed into place: a failure leaves no output). *report (when report is
 * not NULL) receives the report, freed with mxmoe_quantize_report_free. */
MXMOE_C_EXPORT mxmoe_status mxmoe_quantize_checkpoint(const char* in_path, const char* out_path,
                                                      const mxmoe_quantize_options* options,
                                                      mxmoe_quantize_report** report);
MXMOE_C_EXPORT mxmoe_status mxmoe_quantize_report_summary(const mxmoe_quantize_report* report,
                                                          mxmoe_quantize_summary* summary);
MXMOE_C_EXPORT mxmoe_status mxmoe_quantize_report_tensor(const mxmoe_quantize_report* report, int64_t index,
                                                         mxmoe_tensor_report* tensor);
MXMOE_C_EXPORT void mxmoe_quantize_report_free(mxmoe_quantize_report* report); /* NULL is a no-op */
/* mxmoe::dequantize_checkpoint: MXFP4 checkpoint -> BF16 checkpoint in the gpt-oss BF16 layout. */
MXMOE_C_EXPORT mxmoe_status mxmoe_dequantize_checkpoint(const char* in_path, const char* out_path, int32_t overwrite,
                                                        mxmoe_progress_fn progress, void* progress_data);

#ifdef __cplusplus
}
#endif

#endif /* MXMOE_C_API_H_ */
