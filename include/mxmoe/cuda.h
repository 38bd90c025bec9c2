// mxmoe/cuda.h — the sm_90a backend (NVIDIA Hopper: H100, H200). Compiles into every build; in a
// build without CUDA, or on a machine without an sm_90 GPU, `available()` says why and every
// other entry point throws mxmoe::unsupported — it never falls back silently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/moe.h"
#include "mxmoe/quantize.h"

namespace mxmoe::cuda {

// True when this build has the CUDA backend and device `device` is an sm_90 GPU.
bool available(std::string* why = nullptr, int device = 0);
std::string device_name(int device = 0);

// Owning device allocation (cudaMalloc; never managed memory).
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);
  ~device_buffer();
  device_buffer(device_buffer&& o) noexcept;
  device_buffer& operator=(device_buffer&& o) noexcept;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill(uint8_t byte);
  tensor_view view(dtype t, std::vector<int64_t> shape) const {
    return tensor_view(ptr_, t, std::move(shape), device_kind::cuda);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

void synchronize();

// Quantize / dequantize device tensors (same contract as mxmoe/quantize.h, bit-exact with the
// CPU implementation). `stream` is a cudaStream_t (nullptr: the default stream). quantize()
// synchronizes the stream to return the statistics.
quant_stats quantize(const tensor_view& x, mx::scale_rule rule, scale_layout layout,
                     const tensor_view& packed, const tensor_view& scales, void* stream = nullptr);
void dequantize(const tensor_view& packed, const tensor_view& scales, scale_layout layout,
                const tensor_view& out, void* stream = nullptr);
// quantize() without the host synchronization (for pipelines, CUDA graphs and benchmarks): the
// statistics are written to `device_stats` (device memory for one quant_stats) when the stream gets
// there. nullptr: no statistics at all, which runs a cheaper kernel (no counts or sums; ~20% faster
// where the kernel is compute-bound) and nothing after it; the bytes are the same. Validates like
// quantize() before enqueueing anything.
void quantize_async(const tensor_view& x, mx::scale_rule rule, scale_layout layout, const tensor_view& packed,
                    const tensor_view& scales, quant_stats* device_stats, void* stream = nullptr);

// The GPU stage of checkpoint conversion (quantize_checkpoint on cuda, src/cuda/convert_pipeline.cu):
// `slots` expert matrices in flight, each slot with its own stream, pinned host buffers and device
// buffers. The caller fills input(slot) with a matrix as the file stores it (layout::matrix_source,
// its pieces back to back, in its own element type); submit() enqueues the upload, the reordering
// to row-major [N, K] (transposition of the x·W form, gate/up interleaving) and quantize_async
// with linear scales, then the download of codes, scales and statistics; wait() blocks until they
// are in packed(slot), scales(slot). Slots are independent: one is filled while others upload,
// compute or download. submit() and wait() may run on different host threads (each makes the
// pipeline's device current).
class matrix_pipeline {
 public:
  // Device = the current one. max_input_bytes: the largest matrix in bytes; max_elements: in elements.
  matrix_pipeline(int slots, size_t max_input_bytes, int64_t max_elements);
  ~matrix_pipeline();
  matrix_pipeline(const matrix_pipeline&) = delete;
  matrix_pipeline& operator=(const matrix_pipeline&) = delete;
  int slots() const;
  uint8_t* input(int slot);
  void submit(int slot, dtype type, const layout::matrix_source& source, mx::scale_rule rule);
  quant_stats wait(int slot);
  const uint8_t* packed(int slot) const;  // [N, K/2]
  const uint8_t* scales(int slot) const;  // [N, K/32]

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// How close forward() is to the float64 reference (cpu::moe_forward) on the same MXFP4 weights.
// The layer rounds three things to bf16 that the reference keeps exact: the activation between
// the GEMMs, each routing-weighted expert output and the final output (2^-9 relative each;
// about 2e-3 relative L2 together on random data). docs/moe_layer.md has the derivation.
inline constexpr double kForwardRelL2Tolerance = 4e-3;    // ||out - ref|| / ||ref||
inline constexpr double kForwardMaxErrTolerance = 1.5e-2;  // max |out - ref| / max |ref|

// Routing on the device by the layer's own routing kernel (the routing cpu::route defines): logits
// f32 | bf16 [T, E] (device) -> ids_out i32 [T, k], weights_out f32 [T, k] (device).
// correction_bias: optional f32 [E] in device memory (sigmoid_grouped_topk only). No host
// synchronization; capturable.
void route(const tensor_view& logits, const tensor_view& correction_bias, const routing_config& cfg,
           const tensor_view& ids_out, const tensor_view& weights_out, void* stream = nullptr);

// The MoE layer, W4A16: bf16 activations, MXFP4 expert weights.
class moe_layer {
 public:
  // Validates `cfg` and the checkpoint-layout weights (expert matrices in host or device
  // memory; biases and router tensors in host memory), then prepares them into the kernel layout
  // on the device, one expert at a time (temporary device memory: one expert's weights).
  // expert_map (moe.h; empty: all experts): the experts the weights hold; routing maps each
  // slot's expert through it, and a slot held elsewhere is dropped without an error.
  moe_layer(const moe_weights& weights, const moe_config& cfg, const std::vector<int32_t>& expert_map = {});
  ~moe_layer();
  moe_layer(moe_layer&&) noexcept;
  moe_layer& operator=(moe_layer&&) noexcept;

  const moe_config& config() const;
  // Bytes of device workspace forward() needs for up to `max_tokens` tokens.
  size_t workspace_bytes(int64_t max_tokens) const;
  // Device memory the prepared weights occupy.
  size_t weight_bytes() const;

  // x: bf16 [T, H] (device); routing: logits f32 | bf16 [T, E], or ids i32 + weights f32
  // [T, k] (device); out: bf16 [T, H] (device). T may be 0. No host synchronization;
  // capturable in a CUDA graph; deterministic (identical calls give identical bits).
  // Where most experts are touched, forward forks a stream of the layer's own from `stream` (an
  // L2 prefetch of weights) and joins it before it returns: call one layer's forward from one
  // host thread at a time, and not eagerly while another of its forwards is being captured.
  // An expert id outside [0, E) in precomputed routing drops that slot (it contributes 0) and
  // is recorded in the workspace: bit 0 of read_error_flags() (which synchronizes).
  void forward(const tensor_view& x, const routing_input& routing, const tensor_view& out,
               void* workspace, size_t workspace_size, void* stream = nullptr) const;
  uint32_t read_error_flags(const void* workspace, size_t workspace_size) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace mxmoe::cuda
