// GPU tests of the public road (convert.h, forward.h, verify.h) on the cuda backend: checkpoint
// conversion gives the same file on cuda as on the CPU for every rule and input type, and a layer
// prepared for cuda runs through moe_forward (device tensors) and moe_forward_host and passes
// verify_forward, with wrong devices rejected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/forward.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace fs = std::filesystem;
using namespace mxmoe;

namespace {

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Two layers: gpt-oss fused bf16 (E=3, H=96, I=160) and per-expert `type` (E=4, H=224, I=32), values
// with outlier rows, zeros and a NaN so every path of the quantizer is taken.
std::string write_checkpoint(const fs::path& dir, dtype per_expert_type) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 0.1f);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::pair<std::string, tensor_view>> t;
  auto add = [&](const std::string& name, dtype type, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    storage.emplace_back(static_cast<size_t>(count * dtype_size(type)));
    uint8_t* p = storage.back().data();
    for (int64_t i = 0; i < count; ++i) {
      float v = n(rng) * (i % 97 == 0 ? 16.0f : 1.0f);
      if (i % 211 == 0) v = 0.0f;
      if (i == 5) v = std::nanf("");
      if (type == dtype::bf16 || type == dtype::f16) {
        const uint16_t h = type == dtype::bf16 ? float_to_bf16(v) : float_to_f16(v);
        std::memcpy(p + 2 * i, &h, 2);
      } else {
        std::memcpy(p + 4 * i, &v, 4);
      }
    }
    t.emplace_back(name, tensor_view(p, type, std::move(shape)));
  };
  const std::string p0 = checkpoint::gpt_oss_prefix(0);
  add(p0 + "experts.gate_up_proj", dtype::bf16, {3, 96, 320});
  add(p0 + "experts.down_proj", dtype::bf16, {3, 160, 96});
  for (int e = 0; e < 4; ++e) {
    const std::string ep = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    add(ep + "gate_proj.weight", per_expert_type, {32, 224});
    add(ep + "up_proj.weight", per_expert_type, {32, 224});
    add(ep + "down_proj.weight", per_expert_type, {224, 32});
  }
  const std::string path = (dir / ("in-" + std::string(to_string(per_expert_type)) + ".safetensors")).string();
  write_safetensors(path, t);
  return path;
}

class GpuApi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxmoe-test-gpu-api-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(GpuApi, ConversionOnCudaWritesTheSameFileAsOnTheCpu) {
  for (dtype type : {dtype::bf16, dtype::f16, dtype::f32}) {
    const std::string in = write_checkpoint(dir_, type);
    for (mx::scale_rule rule : mx::kAllScaleRules) {
      SCOPED_TRACE(std::string(to_string(type)) + " " + mx::to_string(rule));
      const std::string a = (dir_ / "cpu.safetensors").string(), b = (dir_ / "cuda.safetensors").string();
      // The NaN of every input takes the non-finite path of both quantizers: allowed here.
      const quantize_report ra = quantize_checkpoint(in, a, {rule, device_kind::cpu, true, {}, true});
      const quantize_report rb = quantize_checkpoint(in, b, {rule, device_kind::cuda, true, {}, true});
      EXPECT_EQ(file_bytes(a), file_bytes(b));
      ASSERT_EQ(ra.tensors.size(), rb.tensors.size());
      for (size_t i = 0; i < ra.tensors.size(); ++i) {
        const quant_stats &x = ra.tensors[i].stats, &y = rb.tensors[i].stats;
        EXPECT_EQ(x.blocks, y.blocks);
        EXPECT_EQ(x.saturated_blocks, y.saturated_blocks);
        EXPECT_EQ(x.flushed_elements, y.flushed_elements);
        EXPECT_EQ(x.nonfinite_blocks, y.nonfinite_blocks);
        EXPECT_GT(x.nonfinite_blocks, 0);  // element 5 of every input tensor is a NaN
        // The sums' order differs between the devices (as in test_gpu_quantize.cpp).
        EXPECT_NEAR(x.error_sq, y.error_sq, 1e-6 * x.error_sq);
        EXPECT_NEAR(x.signal_sq, y.signal_sq, 1e-6 * x.signal_sq);
      }
    }
  }
}

TEST_F(GpuApi, PreparedCudaLayerRunsWhereItsTensorsLiveAndVerifies) {
  moe_config cfg;
  cfg.shape = {16, 352, 224};
  cfg.routing.kind = routing_kind::topk_softmax;
  cfg.routing.top_k = 4;
  cfg.routing.renormalize = false;
  cfg.activation.kind = activation_kind::swiglu_clamped;
  cfg.gate_up = layout::gate_up_order::interleaved;
  const synthetic::mxfp4_layer src = synthetic::make_layer(cfg, {.biases = true}, 21);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, src.weights(), 37, 22);
  const prepared_moe layer = prepare(src.weights(), cfg, device_kind::cuda);
  EXPECT_EQ(layer.device(), device_kind::cuda);
  EXPECT_GT(layer.weight_bytes(), 0u);
  const int64_t T = in.tokens, H = cfg.shape.hidden, E = cfg.shape.experts;

  // Host tensors through moe_forward_host, judged by verify_forward.
  std::vector<float> host_out(static_cast<size_t>(T * H));
  const tensor_view host_view(host_out.data(), dtype::f32, {T, H});
  moe_forward_host(layer, in.x_view(), in.routing(), host_view);
  const verify_result v =
      verify_forward(src.weights(), cfg, in.x_view(), in.routing(), host_view, device_kind::cuda, cpu::precision::f64);
  EXPECT_EQ(v.status, verify_status::passed) << "rel-L2 " << v.error.rel_l2 << " max " << v.error.max_abs;
  EXPECT_EQ(v.tolerance.rel_l2, cuda::kForwardRelL2Tolerance);
  EXPECT_GT(v.error.rel_l2, 0.0);  // bf16 rounding: not the CPU reference in disguise

  // Device tensors through moe_forward give the same bits.
  cuda::device_buffer dx(in.x.size() * 2), dlog(in.logits.size() * 4), dout(static_cast<size_t>(T * H) * 2),
      ws(layer.workspace_bytes(T));
  dx.upload(in.x.data(), in.x.size() * 2);
  dlog.upload(in.logits.data(), in.logits.size() * 4);
  routing_input dr;
  dr.logits = dlog.view(dtype::f32, {T, E});
  moe_forward(layer, dx.view(dtype::bf16, {T, H}), dr, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size());
  cuda::synchronize();
  std::vector<uint16_t> dev_out(static_cast<size_t>(T * H));
  dout.download(dev_out.data(), dev_out.size() * 2);
  for (size_t i = 0; i < dev_out.size(); ++i) ASSERT_EQ(bf16_to_float(dev_out[i]), host_out[i]) << i;
  EXPECT_EQ(layer.read_error_flags(ws.data(), ws.size()), 0u);

  // Host tensors given to a cuda layer: rejected, naming the tensor.
  try {
    moe_forward(layer, in.x_view(), dr, dout.view(dtype::bf16, {T, H}), ws.data(), ws.size());
    ADD_FAILURE() << "accepted a host x for a cuda layer";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.arg(), "x");
  }
  try {
    moe_forward(layer, dx.view(dtype::bf16, {T, H}), in.routing(), dout.view(dtype::bf16, {T, H}), ws.data(), ws.size());
    ADD_FAILURE() << "accepted host logits for a cuda layer";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.arg(), "routing.logits");
  }
  // bf16 weights are the cpu backend's only.
  moe_weights bf16 = src.weights();
  bf16.format = weight_format::bf16;
  EXPECT_THROW(prepare(bf16, cfg, device_kind::cuda), invalid_argument);
}
