// The public API's contracts one at a time (forward.h, verify.h, synthetic.h, convert.h): backend
// choice, where tensors must live and what happens when they do not, prepared layers owning their
// weights, the comparison and the tolerances, the synthetic recipe, conversion options validated
// before anything is written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

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

moe_config small_config() {
  moe_config c;
  c.shape = {6, 64, 96};
  c.routing.kind = routing_kind::softmax_topk;
  c.routing.top_k = 2;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Backend, ChoiceSaysWhichAndWhy) {
  const backend_choice cpu = choose_backend(backend_request::cpu);
  EXPECT_EQ(cpu.device, device_kind::cpu);
  EXPECT_EQ(cpu.name, "cpu");
  EXPECT_EQ(cpu.reason, "cpu was requested");
  std::string why;
  const backend_choice any = choose_backend(backend_request::automatic);
  if (cuda::available(&why)) {
    EXPECT_EQ(any.device, device_kind::cuda);
    EXPECT_EQ(choose_backend(backend_request::cuda).device, device_kind::cuda);
  } else {
    EXPECT_EQ(any.device, device_kind::cpu);
    EXPECT_NE(any.reason.find(why), std::string::npos) << any.reason;
    EXPECT_THROW(choose_backend(backend_request::cuda), unsupported);
  }
}

TEST(Prepare, CpuLayerOwnsItsWeights) {
  const moe_config cfg = small_config();
  std::vector<float> out_a(static_cast<size_t>(5 * 64)), out_b(out_a.size());
  synthetic::layer_inputs in;
  {
    auto layer_src = std::make_unique<synthetic::mxfp4_layer>(synthetic::make_layer(cfg, {.biases = true}, 3));
    in = synthetic::make_inputs(cfg, layer_src->weights(), 5, 4);
    cpu::moe_forward(in.x_view(), in.routing(), layer_src->weights(), cfg, tensor_view(out_a.data(), dtype::f32, {5, 64}));
    const prepared_moe layer = prepare(layer_src->weights(), cfg, device_kind::cpu);
    EXPECT_EQ(layer.config().shape.experts, 6);
    // Overwrite, then free, the caller's weights: the prepared layer must not notice.
    std::fill(layer_src->gate_up_blocks.begin(), layer_src->gate_up_blocks.end(), 0xFF);
    layer_src.reset();
    moe_forward(layer, in.x_view(), in.routing(), tensor_view(out_b.data(), dtype::f32, {5, 64}), nullptr, 0);
    EXPECT_EQ(layer.read_error_flags(nullptr, 0), 0u);
  }
  EXPECT_EQ(out_a, out_b);
}

TEST(Prepare, WrongDevicesAndUnavailableBackendAreClearErrors) {
  const moe_config cfg = small_config();
  const synthetic::mxfp4_layer src = synthetic::make_layer(cfg, {}, 1);
  const prepared_moe layer = prepare(src.weights(), cfg, device_kind::cpu);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, src.weights(), 2, 2);
  std::vector<float> out(static_cast<size_t>(2 * 64), 7.0f);
  const tensor_view out_view(out.data(), dtype::f32, {2, 64});
  tensor_view x_cuda = in.x_view();
  x_cuda.device = device_kind::cuda;
  std::string why;
  if (!cuda::available(&why)) {
    // A cuda tensor without a usable cuda backend: unsupported, with the reason.
    try {
      moe_forward(layer, x_cuda, in.routing(), out_view, nullptr, 0);
      ADD_FAILURE() << "accepted a cuda tensor";
    } catch (const unsupported& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x"), std::string::npos) << e.what();
    }
    try {
      prepare(src.weights(), cfg, device_kind::cuda);
      ADD_FAILURE() << "prepared for cuda without cuda";
    } catch (const unsupported& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(moe_forward(layer, x_cuda, in.routing(), out_view, nullptr, 0), invalid_argument);
  }
  // Host tensors of the wrong shape: the backend's validation, before anything is written.
  const std::string e = error_of([&] {
    moe_forward(layer, in.x_view(), in.routing(), tensor_view(out.data(), dtype::f32, {2, 32}), nullptr, 0);
  });
  EXPECT_NE(e.find("'out'"), std::string::npos) << e;
  for (float v : out) ASSERT_EQ(v, 7.0f);
  // A moved-from layer is empty and rejected.
  prepared_moe moved = prepare(src.weights(), cfg, device_kind::cpu);
  const prepared_moe taken = std::move(moved);
  EXPECT_THROW(moe_forward(moved, in.x_view(), in.routing(), out_view, nullptr, 0), invalid_argument);
  EXPECT_THROW(moved.workspace_bytes(1), invalid_argument);
  EXPECT_EQ(taken.device(), device_kind::cpu);
  // Bad weights are rejected at prepare.
  moe_weights bad = src.weights();
  bad.down_scales.shape[2] += 1;
  EXPECT_THROW(prepare(bad, cfg, device_kind::cpu), invalid_argument);
}

TEST(Verify, ComparisonAndTolerances) {
  const std::vector<float> ref = {1.0f, -2.0f, 0.5f, 0.0f};
  std::vector<float> out = ref;
  const auto view = [](const std::vector<float>& v) { return tensor_view(v.data(), dtype::f32, {2, 2}); };
  comparison c = compare(view(out), view(ref));
  EXPECT_EQ(c.elements, 4);
  EXPECT_EQ(c.rel_l2, 0.0);
  EXPECT_EQ(c.max_ref, 2.0);
  out[1] = -2.5f;  // diff 0.5; ||ref|| = sqrt(5.25)
  c = compare(view(out), view(ref));
  EXPECT_DOUBLE_EQ(c.rel_l2, 0.5 / std::sqrt(5.25));
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  out[2] = std::numeric_limits<float>::infinity();
  c = compare(view(out), view(ref));
  EXPECT_EQ(c.nonfinite_out, 1);
  EXPECT_TRUE(std::isinf(c.rel_l2));
  EXPECT_EQ(judge(c, tolerance_for(device_kind::cuda)), verify_status::nonfinite_output);
  // bf16 against f32 of the same values: equal
  std::vector<uint16_t> b16;
  for (float v : ref) b16.push_back(float_to_bf16(v));
  EXPECT_EQ(compare(tensor_view(b16.data(), dtype::bf16, {2, 2}), view(ref)).rel_l2, 0.0);
  EXPECT_THROW(compare(view(out), tensor_view(ref.data(), dtype::f32, {4})), invalid_argument);

  // One definition of each tolerance.
  EXPECT_EQ(tolerance_for(device_kind::cuda).rel_l2, cuda::kForwardRelL2Tolerance);
  EXPECT_EQ(tolerance_for(device_kind::cuda).max_err_rel, cuda::kForwardMaxErrTolerance);
  EXPECT_EQ(tolerance_for(device_kind::cpu).rel_l2, 1e-4);
  EXPECT_TRUE(std::isinf(tolerance_for(device_kind::cpu).max_err_rel));
  // cuda checks the max error too: a small rel-L2 with one large outlier fails.
  comparison spike;
  spike.rel_l2 = 1e-3;
  spike.max_abs = 0.1;
  spike.max_ref = 1.0;
  EXPECT_EQ(judge(spike, tolerance_for(device_kind::cuda)), verify_status::failed);
  EXPECT_EQ(judge(spike, tolerance_for(device_kind::cpu)), verify_status::failed);
  spike.max_abs = 0.01;
  EXPECT_EQ(judge(spike, tolerance_for(device_kind::cuda)), verify_status::passed);

  const moe_config cfg = small_config();
  EXPECT_EQ(auto_reference(device_kind::cpu, cfg, 1 << 20), cpu::precision::f64);
  EXPECT_EQ(auto_reference(device_kind::cuda, cfg, 16), cpu::precision::f64);
  EXPECT_EQ(auto_reference(device_kind::cuda, cfg, 1 << 20), cpu::precision::f32);
  const synthetic::mxfp4_layer src = synthetic::make_layer(cfg, {}, 1);
  const synthetic::layer_inputs in = synthetic::make_inputs(cfg, src.weights(), 2, 2);
  std::vector<float> o(static_cast<size_t>(2 * 64));
  EXPECT_THROW(verify_forward(src.weights(), cfg, in.x_view(), in.routing(), tensor_view(o.data(), dtype::f32, {2, 64}),
                              device_kind::cpu, cpu::precision::f32),
               invalid_argument);
}

TEST(Synthetic, RecipeAndDeterminism) {
  moe_config cfg = small_config();
  cfg.routing.kind = routing_kind::sigmoid_grouped_topk;
  const synthetic::mxfp4_layer a = synthetic::make_layer(cfg, {.biases = true, .correction_bias = true}, 9);
  const synthetic::mxfp4_layer b = synthetic::make_layer(cfg, {.biases = true, .correction_bias = true}, 9);
  EXPECT_EQ(a.gate_up_blocks, b.gate_up_blocks);
  EXPECT_EQ(a.correction_bias, b.correction_bias);
  EXPECT_NO_THROW(validate(a.weights(), cfg));
  // Sizes from the checkpoint layout.
  EXPECT_EQ(static_cast<int64_t>(a.gate_up_blocks.size()), (layout::checkpoint_mxfp4{6, 2 * 96, 64}.block_bytes()));
  EXPECT_EQ(static_cast<int64_t>(a.down_scales.size()), (layout::checkpoint_mxfp4{6, 64, 96}.scale_bytes()));
  // Every code appears; scale bytes within centre +- 1 of their K.
  std::set<int> codes;
  for (uint8_t byte : a.gate_up_blocks) codes.insert(byte & 0xF), codes.insert(byte >> 4);
  EXPECT_EQ(codes.size(), 16u);
  for (auto [scales, k] : {std::pair{&a.gate_up_scales, int64_t{64}}, {&a.down_scales, int64_t{96}}}) {
    std::set<int> seen(scales->begin(), scales->end());
    EXPECT_EQ(seen.size(), 3u);
    EXPECT_EQ(*seen.begin(), synthetic::scale_centre(k) - 1);
    EXPECT_EQ(*seen.rbegin(), synthetic::scale_centre(k) + 1);
  }
  // 2^(centre - 127) ~ 1 / (2.93 sqrt(K)): within a factor sqrt(2).
  for (int64_t k : {32, 2880, 7168}) {
    const double ratio = std::ldexp(1.0, synthetic::scale_centre(k) - 127) * 2.93 * std::sqrt(static_cast<double>(k));
    EXPECT_GT(ratio, 0.7);
    EXPECT_LT(ratio, 1.42);
  }
  const synthetic::mxfp4_layer small = synthetic::make_layer(cfg, {.biases = true, .expert_weights = false}, 9);
  EXPECT_TRUE(small.gate_up_blocks.empty());
  EXPECT_TRUE(small.weights().gate_up_blocks.empty());
  EXPECT_FALSE(small.weights().gate_up_bias.empty());
  EXPECT_THROW(synthetic::make_layer(moe_config{}, {}, 1), invalid_argument);
}

TEST(Convert, OptionsAreCheckedBeforeTheOutputExists) {
  const fs::path dir = fs::temp_directory_path() / ("mxmoe-test-api-units-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<float> w(4 * 64 * 64, 0.5f);
  const std::string in = (dir / "in.safetensors").string(), out = (dir / "out.safetensors").string();
  write_safetensors(in, {{"model.layers.0.mlp.experts.gate_up_proj", tensor_view(w.data(), dtype::f32, {2, 64, 64})},
                         {"model.layers.0.mlp.experts.down_proj", tensor_view(w.data(), dtype::f32, {2, 32, 64})}});
  std::string why;
  if (!cuda::available(&why)) {
    EXPECT_THROW(quantize_checkpoint(in, out, {mx::scale_rule::even, device_kind::cuda, false, {}}), unsupported);
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_THROW(quantize_checkpoint(out, in, {}), std::system_error);  // no such input
  const quantize_report rep = quantize_checkpoint(in, out, {});
  EXPECT_EQ(rep.tensors.size(), 2u);
  // An existing output is kept unless overwrite.
  const auto size = fs::file_size(out);
  EXPECT_THROW(quantize_checkpoint(in, out, {}), invalid_argument);
  EXPECT_EQ(fs::file_size(out), size);
  EXPECT_NO_THROW(quantize_checkpoint(in, out, {mx::scale_rule::floor, device_kind::cpu, true, {}}));
  // An MXFP4 input is not quantized again; a BF16 one is not dequantized.
  EXPECT_THROW(quantize_checkpoint(out, (dir / "x.safetensors").string(), {}), invalid_argument);
  EXPECT_THROW(dequantize_checkpoint(in, (dir / "x.safetensors").string(), {}), invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "x.safetensors"));
  fs::remove_all(dir);
}
