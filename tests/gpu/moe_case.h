// Shared pieces of the MoE layer GPU tests (test_gpu_moe.cpp, test_gpu_moe_prefill.cpp): the
// synthetic MXFP4 layer, the comparison with the CPU reference (cpu::moe_forward) under the
// documented tolerances (cuda::kForwardRelL2Tolerance, kForwardMaxErrTolerance; docs/moe_layer.md),
// a forward run twice on 0xFF-filled buffers (bitwise-equal outputs required), a captured graph
// replayed with new inputs, the kernels a forward launches, and the launch-path switch
// (MXMOE_MOE_PATH) set for the layers a test constructs.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "mxmoe/cuda.h"
#include "mxmoe/dtype.h"
#include "mxmoe/moe.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::test {

// Weights: the synthetic MXFP4 layer (include/mxmoe/synthetic.h): every code (6.0 included) and
// scales around 1/(2.93 sqrt(K)); biases when asked, a correction bias for grouped routing.
using host_moe = synthetic::mxfp4_layer;
inline host_moe make_moe(const moe_config& cfg, bool biases, std::mt19937& rng) {
  return synthetic::make_layer(
      cfg, {.biases = biases, .correction_bias = cfg.routing.kind == routing_kind::sigmoid_grouped_topk}, rng());
}

inline std::vector<uint16_t> random_bf16(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(nd(rng));
  return v;
}

template <class T>
cuda::device_buffer to_device(const std::vector<T>& v) {
  cuda::device_buffer b(std::max<size_t>(16, v.size() * sizeof(T)));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

struct error_stats {
  double rel_l2 = 0, max_err = 0, max_ref = 0;
  int64_t nonfinite = 0;
};

inline error_stats compare(const std::vector<uint16_t>& gpu, const std::vector<float>& ref) {
  error_stats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_to_float(gpu[i]), r = ref[i];
    if (!std::isfinite(g)) ++s.nonfinite;
    num += (g - r) * (g - r);
    den += r * r;
    s.max_err = std::max(s.max_err, std::fabs(g - r));
    s.max_ref = std::max(s.max_ref, std::fabs(r));
  }
  s.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

// rel_l2_bound: the documented layer tolerance, which assumes the output's norm is spread over many
// elements (each of the three bf16 roundings then contributes ~2^-9/sqrt(3)); see kDominantElementsRelL2
// in test_gpu_moe.cpp.
inline void expect_close(const std::vector<uint16_t>& gpu, const std::vector<float>& ref, const std::string& what,
                         double rel_l2_bound = cuda::kForwardRelL2Tolerance) {
  const error_stats s = compare(gpu, ref);
  EXPECT_EQ(s.nonfinite, 0) << what;
  EXPECT_LE(s.rel_l2, rel_l2_bound) << what << " max_err " << s.max_err << " max_ref " << s.max_ref;
  EXPECT_LE(s.max_err, cuda::kForwardMaxErrTolerance * s.max_ref) << what << " rel_l2 " << s.rel_l2;
  std::printf("  %-40s rel_l2 %.2e  max_err/max_ref %.2e\n", what.c_str(), s.rel_l2,
              s.max_ref > 0 ? s.max_err / s.max_ref : 0.0);
  EXPECT_GT(s.max_ref, 0.0) << what << ": the reference is all zeros, the test would prove nothing";
}

// The reference accumulates in f32 where f64 would be slow.
inline cpu::precision reference_precision(const moe_config& cfg, int64_t T) {
  return T * cfg.shape.hidden * cfg.shape.intermediate > (int64_t{1} << 28) ? cpu::precision::f32
                                                                             : cpu::precision::f64;
}

// The reference of a call routed by f32 logits [T, E], x bf16 [T, H].
inline std::vector<float> reference_by_logits(const std::vector<uint16_t>& x, const std::vector<float>& logits,
                                              const moe_weights& w, const moe_config& cfg, int64_t T,
                                              cpu::precision prec = cpu::precision::f64) {
  const int64_t H = cfg.shape.hidden, E = cfg.shape.experts;
  routing_input hr;
  hr.logits = tensor_view(logits.data(), dtype::f32, {T, E});
  std::vector<float> ref(static_cast<size_t>(T * H));
  cpu::moe_forward(tensor_view(x.data(), dtype::bf16, {T, H}), hr, w, cfg, tensor_view(ref.data(), dtype::f32, {T, H}),
                   prec);
  return ref;
}

enum class routing_mode { logits_f32, logits_bf16, precomputed };

struct run_result {
  std::vector<uint16_t> out;
  std::vector<float> ref;
};

// Runs the layer twice (bitwise-equal outputs required) with 0xFF-filled output and workspace,
// and the reference once.
inline run_result run_case(const host_moe& m, int64_t T, routing_mode mode, std::mt19937& rng,
                           cpu::precision prec = cpu::precision::f64, const std::vector<int32_t>* fixed_ids = nullptr) {
  const moe_config& c = m.cfg;
  const int64_t E = c.shape.experts, H = c.shape.hidden;
  const int k = c.routing.top_k;
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * H), 1.0f, rng);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(T * E));
  for (auto& l : logits) l = nd(rng);
  std::vector<uint16_t> logits_bf16(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    logits_bf16[i] = float_to_bf16(logits[i]);
    if (mode == routing_mode::logits_bf16) logits[i] = bf16_to_float(logits_bf16[i]);
  }
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(ids.size());
  if (mode == routing_mode::precomputed) {
    std::uniform_real_distribution<float> u(0.1f, 1.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        const size_t p = static_cast<size_t>(t * k + j);
        ids[p] = fixed_ids ? (*fixed_ids)[p] : static_cast<int32_t>((t * 7 + j * 13) % E);
        wts[p] = u(rng);
      }
  }

  const moe_weights w = m.weights();
  cuda::moe_layer layer(w, c);
  cuda::device_buffer dx = to_device(x), dlog = to_device(logits), dlog16 = to_device(logits_bf16), dids = to_device(ids),
                      dw = to_device(wts);
  cuda::device_buffer dout(static_cast<size_t>(std::max<int64_t>(1, T * H)) * 2);
  cuda::device_buffer ws(layer.workspace_bytes(T));
  routing_input ri;
  if (mode == routing_mode::logits_f32) ri.logits = dlog.view(dtype::f32, {T, E});
  if (mode == routing_mode::logits_bf16) ri.logits = dlog16.view(dtype::bf16, {T, E});
  if (mode == routing_mode::precomputed) {
    ri.ids = dids.view(dtype::i32, {T, k});
    ri.weights = dw.view(dtype::f32, {T, k});
  }
  run_result r;
  std::vector<uint16_t> second(static_cast<size_t>(T * H));
  for (int rep = 0; rep < 2; ++rep) {
    dout.fill(0xFF);
    ws.fill(0xFF);
    layer.forward(dx.view(dtype::bf16, {T, H}), ri, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size());
    cuda::synchronize();
    std::vector<uint16_t>& dst = rep == 0 ? r.out : second;
    dst.resize(static_cast<size_t>(T * H));
    if (T) dout.download(dst.data(), dst.size() * 2);
  }
  EXPECT_EQ(std::memcmp(r.out.data(), second.data(), r.out.size() * 2), 0) << "two identical calls differ";
  EXPECT_EQ(layer.read_error_flags(ws.data(), ws.size()), 0u);

  routing_input hr;
  if (mode == routing_mode::logits_f32) hr.logits = tensor_view(logits.data(), dtype::f32, {T, E});
  if (mode == routing_mode::logits_bf16) hr.logits = tensor_view(logits_bf16.data(), dtype::bf16, {T, E});
  if (mode == routing_mode::precomputed) {
    hr.ids = tensor_view(ids.data(), dtype::i32, {T, k});
    hr.weights = tensor_view(wts.data(), dtype::f32, {T, k});
  }
  r.ref.resize(static_cast<size_t>(T * H));
  cpu::moe_forward(tensor_view(x.data(), dtype::bf16, {T, H}), hr, w, c, tensor_view(r.ref.data(), dtype::f32, {T, H}),
                   prec);
  return r;
}

inline moe_config make_cfg(int64_t E, int64_t H, int64_t I, int k, routing_kind rk, activation_kind act,
                           layout::gate_up_order order) {
  moe_config c;
  c.shape = {E, H, I};
  c.routing.kind = rk;
  c.routing.top_k = k;
  c.routing.renormalize = rk != routing_kind::topk_softmax;
  c.activation.kind = act;
  c.gate_up = order;
  return c;
}

// A layer shape and the token counts it is checked at.
struct shape_case {
  const char* name;
  int64_t E, H, I;
  int k;
  routing_kind routing;
  activation_kind act;
  layout::gate_up_order order;
  bool biases;
  std::vector<int64_t> tokens;
};

inline moe_config config_of(const shape_case& sc) {
  return make_cfg(sc.E, sc.H, sc.I, sc.k, sc.routing, sc.act, sc.order);
}

// One random layer of config cfg (sc's shape), checked at each of sc's token counts.
inline void expect_shape_matches(const shape_case& sc, const moe_config& cfg, std::mt19937& rng) {
  const host_moe m = make_moe(cfg, sc.biases, rng);
  for (int64_t T : sc.tokens) {
    const run_result r = run_case(m, T, routing_mode::logits_f32, rng, reference_precision(cfg, T));
    expect_close(r.out, r.ref, std::string(sc.name) + " T=" + std::to_string(T));
  }
}

// The kernels of a captured graph, by name (cudaFuncGetName: mangled for C++ kernels), in the
// graph's node order; memset and other nodes are left out.
inline void graph_kernel_names(cudaGraph_t graph, std::vector<std::string>* names) {
  size_t n = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &n));
  names->clear();
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    CUDA_OK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams p{};
    CUDA_OK(cudaGraphKernelNodeGetParams(node, &p));
    const char* name = nullptr;
    CUDA_OK(cudaFuncGetName(&name, p.func));
    names->emplace_back(name);
  }
}

// One forward of `layer` for T tokens routed by f32 logits, captured in a CUDA graph (nothing
// runs at capture); its buffers are what a replay reads and writes (the workspace 0xFF-filled).
struct captured_forward {
  cuda::device_buffer x, logits, out, ws;
  cudaGraph_t graph = nullptr;
  captured_forward() = default;
  captured_forward(const captured_forward&) = delete;
  captured_forward& operator=(const captured_forward&) = delete;
  ~captured_forward() {
    if (graph) cudaGraphDestroy(graph);
  }
};

inline void capture_forward(const cuda::moe_layer& layer, int64_t T, cudaStream_t stream, captured_forward* c) {
  const moe_config& cfg = layer.config();
  const int64_t H = cfg.shape.hidden, E = cfg.shape.experts;
  c->x = cuda::device_buffer(T * H * 2);
  c->logits = cuda::device_buffer(T * E * 4);
  c->out = cuda::device_buffer(T * H * 2);
  c->ws = cuda::device_buffer(layer.workspace_bytes(T));
  c->ws.fill(0xFF);
  routing_input ri;
  ri.logits = c->logits.view(dtype::f32, {T, E});
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer.forward(c->x.view(dtype::bf16, {T, H}), ri, c->out.view(dtype::bf16, {T, H}), c->ws.data(), c->ws.size(),
                stream);
  CUDA_OK(cudaStreamEndCapture(stream, &c->graph));
}

// The names of the kernels one forward of `layer` launches for T tokens routed by logits.
inline void forward_kernel_names(const cuda::moe_layer& layer, int64_t T, std::vector<std::string>* names) {
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  {
    captured_forward c;
    capture_forward(layer, T, stream, &c);
    if (c.graph) graph_kernel_names(c.graph, names);
  }
  cudaStreamDestroy(stream);
}

// How many of `names` contain `part`.
inline int count_containing(const std::vector<std::string>& names, const std::string& part) {
  return static_cast<int>(std::count_if(names.begin(), names.end(),
                                        [&](const std::string& n) { return n.find(part) != std::string::npos; }));
}

// For each T: one forward of `layer` captured in a CUDA graph and replayed three times with new
// inputs copied into the captured buffers, each compared with the reference. `kernels`, when
// given, receives the names of the kernels of the last T's graph.
inline void expect_graph_replays(const cuda::moe_layer& layer, const moe_weights& w, const std::vector<int64_t>& tokens,
                                 std::mt19937& rng, std::vector<std::string>* kernels = nullptr) {
  const moe_config& cfg = layer.config();
  const int64_t H = cfg.shape.hidden, E = cfg.shape.experts;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (const int64_t T : tokens) {
    captured_forward c;
    capture_forward(layer, T, stream, &c);
    if (c.graph == nullptr) break;  // capture_forward reported the failure
    if (kernels) graph_kernel_names(c.graph, kernels);
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, c.graph, 0));
    for (int rep = 0; rep < 3; ++rep) {  // new inputs each replay, copied into the captured buffers
      const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(T * H), 1.0f, rng);
      std::vector<float> logits(static_cast<size_t>(T * E));
      std::normal_distribution<float> nd(0.0f, 2.0f);
      for (auto& l : logits) l = nd(rng);
      c.x.upload(x.data(), x.size() * 2);
      c.logits.upload(logits.data(), logits.size() * 4);
      c.out.fill(0xFF);
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> out(static_cast<size_t>(T * H));
      c.out.download(out.data(), out.size() * 2);
      expect_close(out, reference_by_logits(x, logits, w, cfg, T, reference_precision(cfg, T)),
                   "graph replay T=" + std::to_string(T) + " " + std::to_string(rep));
    }
    cudaGraphExecDestroy(exec);
  }
  cudaStreamDestroy(stream);
}

// MXMOE_MOE_PATH set to `value` (nullptr: unset) for the layers constructed while this lives
// (the layer reads it in its constructor); the previous value is restored afterwards.
class scoped_moe_path {
 public:
  explicit scoped_moe_path(const char* value) {
    if (const char* old = std::getenv(kName)) previous_ = old;
    set(value);
  }
  ~scoped_moe_path() { set(previous_ ? previous_->c_str() : nullptr); }
  scoped_moe_path(const scoped_moe_path&) = delete;
  scoped_moe_path& operator=(const scoped_moe_path&) = delete;

 private:
  static constexpr const char* kName = "MXMOE_MOE_PATH";
  static void set(const char* value) {
    if (value)
      setenv(kName, value, 1);
    else
      unsetenv(kName);
  }
  std::optional<std::string> previous_;
};

}  // namespace mxmoe::test
