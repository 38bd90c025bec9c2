// The public road end to end, through include/mxmoe/ alone, as a program other than the CLI
// walks it: write a small BF16 checkpoint (gpt-oss layout, two MoE layers, odd shapes), convert it
// to MXFP4 (convert.h), load one layer back (checkpoint.h), prepare it for the CPU (forward.h), run
// it and verify it against the float64 reference (verify.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/forward.h"
#include "mxmoe/layout.h"
#include "mxmoe/moe.h"
#include "mxmoe/safetensors.h"
#include "mxmoe/synthetic.h"
#include "mxmoe/verify.h"

namespace fs = std::filesystem;
using namespace mxmoe;

namespace {

constexpr int64_t kE = 5, kH = 96, kI = 160;  // H and I multiples of 32, not of 64

// A gpt-oss BF16 checkpoint: per layer gate_up_proj [E, H, 2I] and down_proj [E, I, H] in the x·W
// form (layout::checkpoint_xw), biases, a router; one unrelated tensor.
std::string write_bf16_checkpoint(const fs::path& dir) {
  const moe_shape s{kE, kH, kI};
  const layout::checkpoint_xw gu = checkpoint::gate_up_xw_geometry(s), dn = checkpoint::down_xw_geometry(s);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> weight(0.0f, 0.08f), small(0.0f, 0.05f);
  std::vector<std::vector<uint16_t>> storage;  // the tensors' bytes, alive until the file is written
  auto draw = [&](int64_t n, std::normal_distribution<float>& d) {
    storage.emplace_back(static_cast<size_t>(n));
    for (auto& v : storage.back()) v = float_to_bf16(d(rng));
    return storage.back().data();
  };
  std::vector<std::pair<std::string, tensor_view>> t;
  for (int64_t layer : {0, 3}) {
    const std::string p = checkpoint::gpt_oss_prefix(layer);
    const auto n = checkpoint::bf16_gpt_oss_tensor_names(p);
    t.emplace_back(n.gate_up, tensor_view(draw(gu.size(), weight), dtype::bf16, {kE, kH, 2 * kI}));
    t.emplace_back(n.down, tensor_view(draw(dn.size(), weight), dtype::bf16, {kE, kI, kH}));
    t.emplace_back(p + "experts.gate_up_proj_bias", tensor_view(draw(kE * 2 * kI, small), dtype::bf16, {kE, 2 * kI}));
    t.emplace_back(p + "experts.down_proj_bias", tensor_view(draw(kE * kH, small), dtype::bf16, {kE, kH}));
    t.emplace_back(p + "router.weight", tensor_view(draw(kE * kH, weight), dtype::bf16, {kE, kH}));
  }
  t.emplace_back("model.norm.weight", tensor_view(draw(kH, small), dtype::bf16, {kH}));
  const std::string path = (dir / "bf16.safetensors").string();
  write_safetensors(path, t);
  return path;
}

class ApiPath : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxmoe-test-api-path-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(ApiPath, ConvertPrepareForwardVerifyOnTheCpu) {
  const std::string bf16 = write_bf16_checkpoint(dir_), mxfp4 = (dir_ / "mxfp4.safetensors").string();

  // convert, with progress
  int64_t last_done = 0, total = 0;
  quantize_options qo;
  qo.rule = mx::scale_rule::mse;
  qo.device = device_kind::cpu;
  qo.on_progress = [&](const convert_progress& p) {
    EXPECT_EQ(p.done, last_done + 1);
    last_done = p.done;
    total = p.total;
  };
  const quantize_report rep = quantize_checkpoint(bf16, mxfp4, qo);
  ASSERT_EQ(rep.tensors.size(), 4u);  // gate_up and down of two layers
  EXPECT_EQ(rep.tensors[0].shape, (std::vector<int64_t>{kE, 2 * kI, kH / 32, 16}));
  EXPECT_EQ(rep.total.elements, 2 * kE * 3 * kH * kI);
  EXPECT_GT(rep.total.sqnr_db(), 15.0);
  EXPECT_EQ(rep.copied_tensors, 1 + 2 * 3);  // the norm; biases and router of each layer
  EXPECT_GT(total, 0);
  EXPECT_EQ(last_done, rep.copied_tensors + 2 * kE);  // each copied tensor and each expert

  // load the second layer back
  moe_config cfg;
  std::vector<float> out, ref_bf16;
  synthetic::layer_inputs in;
  std::unique_ptr<prepared_moe> layer;
  moe_weights file_weights;
  {
    const safetensors_reader q(mxfp4);
    EXPECT_EQ(q.metadata().at("mxmoe.scale_rule"), "mse");
    const checkpoint::moe_layer_info info = checkpoint::find_moe_layer(q, 3);
    ASSERT_EQ(info.layout, checkpoint::moe_layout::mxfp4_gpt_oss);
    cfg = checkpoint::layer_config(q, info);
    EXPECT_EQ(cfg.routing.kind, routing_kind::topk_softmax);  // gpt-oss names imply the gpt-oss family
    EXPECT_EQ(cfg.gate_up, layout::gate_up_order::interleaved);
    const moe_weights w = checkpoint::mxfp4_weights(q, info);
    in = synthetic::make_inputs(cfg, w, 9, 1);  // logits from the layer's router
    layer = std::make_unique<prepared_moe>(prepare(w, cfg, device_kind::cpu));
    EXPECT_EQ(layer->device(), device_kind::cpu);
    EXPECT_EQ(layer->workspace_bytes(9), 0u);
    EXPECT_GE(layer->weight_bytes(), static_cast<size_t>(w.gate_up_blocks.nbytes() + w.down_blocks.nbytes()));

    // The BF16 layer on the same inputs: what the MXFP4 layer approximates.
    const safetensors_reader b(bf16);
    std::vector<uint16_t> gu16, dn16;
    const moe_weights wb = checkpoint::bf16_weights(b, checkpoint::find_moe_layer(b, 3), gu16, dn16);
    ref_bf16.resize(static_cast<size_t>(9 * kH));
    cpu::moe_forward(in.x_view(), in.routing(), wb, cfg, tensor_view(ref_bf16.data(), dtype::f32, {9, kH}),
                     cpu::precision::f64);
  }
  // The file is closed: the prepared layer owns its weights.
  out.assign(static_cast<size_t>(9 * kH), -1.0f);
  const tensor_view out_view(out.data(), dtype::f32, {9, kH});
  moe_forward(*layer, in.x_view(), in.routing(), out_view, nullptr, 0);

  // verify against the reference on the MXFP4 weights (read again: verification needs the
  // checkpoint-layout weights the layer was prepared from)
  const safetensors_reader q(mxfp4);
  const moe_weights w = checkpoint::mxfp4_weights(q, checkpoint::find_moe_layer(q, 3));
  const verify_result v = verify_forward(w, cfg, in.x_view(), in.routing(), out_view, device_kind::cpu, cpu::precision::f64);
  EXPECT_EQ(v.status, verify_status::passed) << "rel-L2 " << v.error.rel_l2;
  EXPECT_EQ(v.tolerance.rel_l2, 1e-4);
  EXPECT_LT(v.error.rel_l2, 1e-6);
  EXPECT_GT(v.error.max_ref, 0.0);

  // and MXFP4 is close to the BF16 layer it came from, but not equal
  const comparison vs_bf16 = compare(out_view, tensor_view(ref_bf16.data(), dtype::f32, {9, kH}));
  EXPECT_LT(vs_bf16.rel_l2, 0.25);
  EXPECT_GT(vs_bf16.rel_l2, 1e-3);

  // a wrong output is caught
  out[17] += 1.0f;
  EXPECT_EQ(verify_forward(w, cfg, in.x_view(), in.routing(), out_view, device_kind::cpu, cpu::precision::f64).status,
            verify_status::failed);
  out[17] = std::nanf("");
  EXPECT_EQ(verify_forward(w, cfg, in.x_view(), in.routing(), out_view, device_kind::cpu, cpu::precision::f64).status,
            verify_status::nonfinite_output);
}

TEST_F(ApiPath, DequantizeRestoresTheMxfp4ValuesInTheBf16Layout) {
  const std::string bf16 = write_bf16_checkpoint(dir_), mxfp4 = (dir_ / "mxfp4.safetensors").string(),
                    back = (dir_ / "back.safetensors").string();
  quantize_checkpoint(bf16, mxfp4, {mx::scale_rule::even, device_kind::cpu, false, {}});
  dequantize_checkpoint(mxfp4, back, {false, {}});
  const safetensors_reader q(mxfp4), b(back);
  const auto qi = checkpoint::find_moe_layer(q, 0), bi = checkpoint::find_moe_layer(b, 0);
  EXPECT_EQ(bi.layout, checkpoint::moe_layout::bf16_gpt_oss);
  // Both layers compute the same function: the dequantized weights are the MXFP4 values exactly.
  const moe_weights wq = checkpoint::mxfp4_weights(q, qi);
  std::vector<uint16_t> gu16, dn16;
  const moe_weights wb = checkpoint::bf16_weights(b, bi, gu16, dn16);
  const moe_config cfg = checkpoint::layer_config(q, qi);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, wq, 4, 2);
  std::vector<float> a(static_cast<size_t>(4 * kH)), c(a.size());
  cpu::moe_forward(in.x_view(), in.routing(), wq, cfg, tensor_view(a.data(), dtype::f32, {4, kH}), cpu::precision::f64);
  cpu::moe_forward(in.x_view(), in.routing(), wb, cfg, tensor_view(c.data(), dtype::f32, {4, kH}), cpu::precision::f64);
  EXPECT_EQ(a, c);
}
