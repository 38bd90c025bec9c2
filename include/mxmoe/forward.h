// mxmoe/forward.h — the MoE layer on whichever backend: choose a backend, prepare the weights for
// it, run the layer where the tensors live. The public road's middle (checkpoint -> convert ->
// prepare -> forward -> verify, docs/architecture.md); `mxmoe run`, `mxmoe demo` and the
// benchmark call it.
//
//   backend_choice b = choose_backend(backend_request::automatic);   // cuda if usable, else cpu
//   prepared_moe layer = prepare(weights, cfg, b.device);           // owns what it needs
//   moe_forward(layer, x, routing, out, ws, layer.workspace_bytes(T), stream);
//
// Backends (one semantics: cpu::moe_forward in moe.h defines it):
//   cpu   cpu::moe_forward in float32 (multithreaded). MXFP4 or bf16 weights. x bf16 | f32 and
//         out f32 | bf16 in host memory; routing from logits, precomputed ids, or the router
//         weights. No workspace. Out-of-range expert ids are rejected before anything runs.
//   cuda  cuda::moe_layer (sm_90a, W4A16). MXFP4 weights only. x bf16 and out bf16 in device
//         memory; routing from device logits (f32 | bf16) or device ids + weights. A workspace of
//         workspace_bytes(T) device bytes; no host synchronization; capturable in a CUDA graph;
//         an out-of-range expert id drops its slot and sets bit 0 of read_error_flags().
// A request the backend cannot serve is an error, never a silent fallback: cuda in a CPU-only build
// or without an sm_90 GPU throws mxmoe::unsupported with the reason (cuda::available), and tensors
// on the wrong device throw mxmoe::invalid_argument naming the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"
#include "mxmoe/shard.h"

namespace mxmoe {

// ---- backend choice ----------------------------------------------------------------------

enum class backend_request : uint8_t {
  automatic,  // cuda when cuda::available(), else cpu (and say why)
  cpu,
  cuda,       // cuda or an error: mxmoe::unsupported when no sm_90 GPU is usable
};

struct backend_choice {
  device_kind device = device_kind::cpu;
  std::string name;    // "cpu" or "cuda (NVIDIA H200)"
  std::string reason;  // "cpu was requested", "auto: a usable sm_90 GPU was found", "auto: no usable GPU (...), ..."
};

// Throws mxmoe::unsupported ("cuda: no usable GPU: <why>") for backend_request::cuda without a
// usable GPU.
backend_choice choose_backend(backend_request request);

// ---- prepared layer ----------------------------------------------------------------------

// What part of the layer a prepared layer holds (expert and tensor parallelism, shard.h and
// docs/parallel.md). The defaults hold all of it.
struct prepare_options {
  // moe.h: empty, or the E-entry map of the experts the weights hold (their expert dimension is
  // E_held). A slot routed to an expert held elsewhere contributes 0 and is no error; on cuda the
  // map is applied where routing writes expert ids, and costs nothing when empty.
  std::vector<int32_t> expert_map;
  // ranks > 1: prepare cuts shard `tp` along I out of the given (host, MXFP4) weights first
  // (shard_weights); the layer's config() then has I = shard_intermediate(I, tp).
  tp_shard tp;
};

// The weights of one MoE layer prepared for one backend. It owns everything it needs: once
// prepare() returns, the caller's weight buffers may go away. Move-only; a moved-from layer is
// empty: every member and moe_forward throw mxmoe::invalid_argument ("layer") for it.
class prepared_moe {
 public:
  ~prepared_moe();
  prepared_moe(prepared_moe&&) noexcept;
  prepared_moe& operator=(prepared_moe&&) noexcept;
  prepared_moe(const prepared_moe&) = delete;
  prepared_moe& operator=(const prepared_moe&) = delete;

  device_kind device() const;       // where it runs and where moe_forward's tensors must live
  const moe_config& config() const;
  const std::vector<int32_t>& expert_map() const;  // prepare_options::expert_map (empty: all experts)
  // Bytes of the prepared weights (host memory for cpu, device memory for cuda).
  size_t weight_bytes() const;
  // Bytes of workspace moe_forward needs for up to `max_tokens` tokens (0 for cpu).
  size_t workspace_bytes(int64_t max_tokens) const;
  // cuda: the error flags a forward left in `workspace` (bit 0: an expert id out of range was
  // dropped); synchronizes. cpu: always 0 (bad ids are rejected up front).
  uint32_t read_error_flags(const void* workspace, size_t workspace_size) const;

  struct impl;  // src/forward.cpp

 private:
  explicit prepared_moe(std::unique_ptr<impl> p);
  const impl& state() const;  // throws for an empty layer
  std::unique_ptr<impl> impl_;
  friend prepared_moe prepare(const moe_weights&, const moe_config&, device_kind, const prepare_options&);
  friend void moe_forward(const prepared_moe&, const tensor_view&, const routing_input&, const tensor_view&, void*,
                          size_t, void*);
};

// Validates `cfg` and `weights` (moe.h: checkpoint layout) and prepares them for `target`:
//   cpu:  copies the weights and their biases and router tensors (host memory; MXFP4 or bf16).
//   cuda: cuda::moe_layer: MXFP4 expert matrices in host or device memory (biases and router
//         tensors in host memory), repacked into the kernel layout on the current device one
//         expert at a time.
// `options` (above): the experts and the shard of I the layer holds.
// Throws mxmoe::invalid_argument for bad weights or weights the target cannot read (device
// weights for a cpu target, bf16 weights for cuda), a bad expert map or shard, mxmoe::unsupported
// for cuda without a usable GPU (the reason from cuda::available).
prepared_moe prepare(const moe_weights& weights, const moe_config& cfg, device_kind target,
                     const prepare_options& options = {});

// ---- forward -----------------------------------------------------------------------------

// out = the MoE layer of `layer` applied to x [T, H] with `routing` (moe.h), on layer.device().
// Every tensor must live on layer.device(); T may be 0. `workspace`: at least
// layer.workspace_bytes(T) bytes on that device, 256-byte aligned (may be null when that is 0).
// `stream`: a cudaStream_t for a cuda layer (nullptr: the default stream); ignored by cpu.
// Validates everything before it writes anything.
void moe_forward(const prepared_moe& layer, const tensor_view& x, const routing_input& routing, const tensor_view& out,
                 void* workspace, size_t workspace_size, void* stream = nullptr);

// moe_forward for callers holding host tensors (tools, tests): x, routing and out in host memory
// whatever the layer's device. A cuda layer gets copies on its device (x must be bf16, as the cuda
// layer takes; out may be bf16 or f32, converted exactly from the layer's bf16), a workspace of its
// own, and the call synchronizes. A cpu layer runs moe_forward directly. Engines use moe_forward.
void moe_forward_host(const prepared_moe& layer, const tensor_view& x, const routing_input& routing,
                      const tensor_view& out);

}  // namespace mxmoe
