// Checkpoint layouts: the same random expert weights stored as gpt-oss BF16 (x·W form,
// interleaved gate/up columns) and as Qwen3-style per-expert tensors must read back identically;
// layer detection, shape checks, the MXFP4 names and the config metadata round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "mxmoe/checkpoint.h"
#include "mxmoe/error.h"

namespace fs = std::filesystem;
using namespace mxmoe;

namespace {

struct logical_layer {  // W13 gate/up [E][I][H] and W2 [E][H][I] as floats exact in bf16
  int64_t E, H, I;
  std::vector<float> gate, up, down;
};

logical_layer random_layer(int64_t E, int64_t H, int64_t I, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  logical_layer l{E, H, I, {}, {}, {}};
  for (auto* v : {&l.gate, &l.up}) {
    v->resize(static_cast<size_t>(E * I * H));
    for (auto& x : *v) x = bf16_to_float(float_to_bf16(n(rng)));
  }
  l.down.resize(static_cast<size_t>(E * H * I));
  for (auto& x : l.down) x = bf16_to_float(float_to_bf16(n(rng)));
  return l;
}

std::vector<float> floats(const tensor_view& v) {
  std::vector<float> f(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < f.size(); ++i) f[i] = load_float(v.data, v.type, static_cast<int64_t>(i));
  return f;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mxmoe-test-ckpt-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// gpt-oss BF16: gate_up_proj [E, H, 2I] (layout::checkpoint_xw; column 2j = gate j, 2j+1 = up j,
// layout::gate_up_rows interleaved); down_proj [E, I, H].
std::string write_gpt_oss_bf16(const fs::path& d, const logical_layer& l, int layer) {
  const int64_t E = l.E, H = l.H, I = l.I;
  const moe_shape s{E, H, I};
  const layout::checkpoint_xw gxw = checkpoint::gate_up_xw_geometry(s), dxw = checkpoint::down_xw_geometry(s);
  const layout::gate_up_rows rows{I, layout::gate_up_order::interleaved};
  std::vector<uint16_t> gu(static_cast<size_t>(gxw.size())), dn(static_cast<size_t>(dxw.size()));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < I; ++j) {
        gu[static_cast<size_t>(gxw.offset(e, rows.checkpoint_row(j, 0), h))] = float_to_bf16(l.gate[static_cast<size_t>((e * I + j) * H + h)]);
        gu[static_cast<size_t>(gxw.offset(e, rows.checkpoint_row(j, 1), h))] = float_to_bf16(l.up[static_cast<size_t>((e * I + j) * H + h)]);
        dn[static_cast<size_t>(dxw.offset(e, h, j))] = float_to_bf16(l.down[static_cast<size_t>((e * H + h) * I + j)]);
      }
  std::vector<float> router(static_cast<size_t>(E * H), 0.5f), bias(static_cast<size_t>(E * 2 * I), 0.25f);
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const std::string path = (d / "gpt-oss-bf16.safetensors").string();
  write_safetensors(path, {{p + "experts.gate_up_proj", tensor_view(gu.data(), dtype::bf16, {E, H, 2 * I})},
                           {p + "experts.down_proj", tensor_view(dn.data(), dtype::bf16, {E, I, H})},
                           {p + "experts.gate_up_proj_bias", tensor_view(bias.data(), dtype::f32, {E, 2 * I})},
                           {p + "router.weight", tensor_view(router.data(), dtype::f32, {E, H})},
                           {"model.norm.weight", tensor_view(router.data(), dtype::f32, {H})}});
  return path;
}

// Qwen3/DeepSeek: experts.{e}.gate_proj.weight [I, H], up_proj [I, H], down_proj [H, I] (f32 here).
std::string write_per_expert(const fs::path& d, const logical_layer& l, int layer, bool correction_bias) {
  const int64_t E = l.E, H = l.H, I = l.I;
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  std::vector<std::pair<std::string, tensor_view>> t;
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    t.emplace_back(ep + "gate_proj.weight", tensor_view(l.gate.data() + e * I * H, dtype::f32, {I, H}));
    t.emplace_back(ep + "up_proj.weight", tensor_view(l.up.data() + e * I * H, dtype::f32, {I, H}));
    t.emplace_back(ep + "down_proj.weight", tensor_view(l.down.data() + e * H * I, dtype::f32, {H, I}));
  }
  std::vector<float> router(static_cast<size_t>(E * H), 0.5f), corr(static_cast<size_t>(E), 0.0f);
  t.emplace_back(p + "gate.weight", tensor_view(router.data(), dtype::f32, {E, H}));
  if (correction_bias) t.emplace_back(p + "gate.e_score_correction_bias", tensor_view(corr.data(), dtype::f32, {E}));
  const std::string path = (d / "per-expert.safetensors").string();
  write_safetensors(path, t);
  return path;
}

}  // namespace

TEST(Checkpoint, BothBf16LayoutsReadToTheSameInterleavedExpert) {
  const fs::path d = fresh_dir("layouts");
  const logical_layer l = random_layer(3, 64, 96, 7);  // I not a power of two
  const safetensors_reader a(write_gpt_oss_bf16(d, l, 2));
  const safetensors_reader b(write_per_expert(d, l, 5, false));
  const auto la = checkpoint::find_moe_layers(a), lb = checkpoint::find_moe_layers(b);
  ASSERT_EQ(la.size(), 1u);
  ASSERT_EQ(lb.size(), 1u);
  EXPECT_EQ(la[0].layout, checkpoint::moe_layout::bf16_gpt_oss);
  EXPECT_EQ(lb[0].layout, checkpoint::moe_layout::bf16_per_expert);
  EXPECT_EQ(la[0].layer, 2);
  EXPECT_EQ(lb[0].layer, 5);
  for (const auto* info : {&la[0], &lb[0]}) {
    EXPECT_EQ(info->shape.experts, 3);
    EXPECT_EQ(info->shape.hidden, 64);
    EXPECT_EQ(info->shape.intermediate, 96);
  }
  EXPECT_FALSE(la[0].gate_up_bias.empty());
  EXPECT_TRUE(la[0].down_bias.empty());
  EXPECT_EQ(la[0].router_weight, "model.layers.2.mlp.router.weight");
  EXPECT_EQ(lb[0].router_weight, "model.layers.5.mlp.gate.weight");
  EXPECT_EQ(lb[0].expert_tensors.size(), 9u);

  const layout::gate_up_rows rows{l.I, layout::gate_up_order::interleaved};
  std::vector<uint8_t> abuf13, abuf2, bbuf13, bbuf2;
  for (int64_t e = 0; e < l.E; ++e) {
    const checkpoint::expert_weights ea = checkpoint::read_expert(a, la[0], e, abuf13, abuf2);
    const checkpoint::expert_weights eb = checkpoint::read_expert(b, lb[0], e, bbuf13, bbuf2);
    // Each in its file's element type, nothing widened.
    EXPECT_EQ(ea.gate_up.type, dtype::bf16);
    EXPECT_EQ(eb.gate_up.type, dtype::f32);
    EXPECT_EQ(ea.gate_up.shape, (std::vector<int64_t>{2 * l.I, l.H}));
    EXPECT_EQ(eb.down.shape, (std::vector<int64_t>{l.H, l.I}));
    const std::vector<float> a13 = floats(ea.gate_up), a2 = floats(ea.down), b13 = floats(eb.gate_up), b2 = floats(eb.down);
    EXPECT_EQ(a13, b13);
    EXPECT_EQ(a2, b2);
    // Rows are outputs: gate j and up j where gate_up_rows puts them; W2 is [H, I].
    for (int64_t j = 0; j < l.I; j += 7)
      for (int64_t h = 0; h < l.H; h += 5) {
        EXPECT_EQ(a13[static_cast<size_t>(rows.checkpoint_row(j, 0) * l.H + h)], l.gate[static_cast<size_t>((e * l.I + j) * l.H + h)]);
        EXPECT_EQ(a13[static_cast<size_t>(rows.checkpoint_row(j, 1) * l.H + h)], l.up[static_cast<size_t>((e * l.I + j) * l.H + h)]);
        EXPECT_EQ(a2[static_cast<size_t>(h * l.I + j)], l.down[static_cast<size_t>((e * l.H + h) * l.I + j)]);
      }
  }
  EXPECT_THROW(checkpoint::read_expert(a, la[0], 3, abuf13, abuf2), invalid_argument);

  std::vector<uint16_t> w13, w2;
  const moe_weights w = checkpoint::bf16_weights(b, lb[0], w13, w2);
  EXPECT_EQ(w.gate_up.shape, (std::vector<int64_t>{3, 192, 64}));
  EXPECT_EQ(bf16_to_float(w13[static_cast<size_t>((2 * 192 + rows.checkpoint_row(4, 1)) * 64 + 9)]),
            l.up[static_cast<size_t>((2 * 96 + 4) * 64 + 9)]);
  fs::remove_all(d);
}

TEST(Checkpoint, ReorderedBandsAreBandsOfTheReorderedMatrix) {
  // Every source order (x·W bf16, gate/up pair and row-major f32), odd sizes, bands that do not
  // divide the rows, cross the transposition's 32-row tiles or hold one row.
  const fs::path d = fresh_dir("bands");
  const logical_layer l = random_layer(2, 96, 160, 11);
  const safetensors_reader a(write_gpt_oss_bf16(d, l, 0));
  const safetensors_reader b(write_per_expert(d, l, 0, false));
  for (const safetensors_reader* file : {&a, &b}) {
    const auto layers = checkpoint::find_moe_layers(*file);
    ASSERT_EQ(layers.size(), 1u);
    for (int64_t e = 0; e < l.E; ++e)
      for (const bool gate_up : {true, false}) {
        const checkpoint::expert_matrix m = checkpoint::expert_matrix_of(*file, layers[0], e, gate_up);
        SCOPED_TRACE(testing::Message() << "order " << static_cast<int>(m.source.order) << " expert " << e);
        std::vector<const uint8_t*> pieces;
        for (const auto& p : m.pieces) pieces.push_back(file->bytes(*p.entry).data() + p.offset);
        std::vector<uint8_t> whole(m.bytes());
        checkpoint::reorder_matrix(m, pieces.data(), whole.data());
        const size_t row_bytes = whole.size() / static_cast<size_t>(m.source.rows);
        for (const int64_t band : {int64_t{1}, int64_t{5}, int64_t{22}, int64_t{33}, m.source.rows}) {
          std::vector<uint8_t> banded(whole.size(), 0xEE);
          for (int64_t n0 = 0; n0 < m.source.rows; n0 += band) {
            const int64_t n1 = std::min(m.source.rows, n0 + band);
            checkpoint::reorder_rows(m, pieces.data(), n0, n1, banded.data() + static_cast<size_t>(n0) * row_bytes);
          }
          EXPECT_EQ(banded, whole) << "band " << band;
        }
        std::vector<uint8_t> one(row_bytes);
        EXPECT_THROW(checkpoint::reorder_rows(m, pieces.data(), 3, 2, one.data()), invalid_argument);
        EXPECT_THROW(checkpoint::reorder_rows(m, pieces.data(), m.source.rows, m.source.rows + 1, one.data()),
                     invalid_argument);
      }
  }
  fs::remove_all(d);
}

TEST(Checkpoint, DefaultConfigFollowsTheModelFamily) {
  const fs::path d = fresh_dir("config");
  const logical_layer l = random_layer(8, 32, 32, 3);
  const safetensors_reader a(write_gpt_oss_bf16(d, l, 0));
  const moe_config ca = checkpoint::layer_config(a, checkpoint::find_moe_layer(a, 0));
  EXPECT_EQ(ca.routing.kind, routing_kind::topk_softmax);
  EXPECT_EQ(ca.activation.kind, activation_kind::swiglu_clamped);
  EXPECT_EQ(ca.gate_up, layout::gate_up_order::interleaved);
  const safetensors_reader b(write_per_expert(d, l, 0, true));
  const moe_config cb = checkpoint::layer_config(b, checkpoint::find_moe_layer(b, 0));
  EXPECT_EQ(cb.routing.kind, routing_kind::sigmoid_grouped_topk);
  EXPECT_NO_THROW(validate(cb));
  EXPECT_THROW(checkpoint::find_moe_layer(b, 1), invalid_argument);
  fs::remove_all(d);
}

TEST(Checkpoint, ConfigJsonRoundTrip) {
  moe_config c;
  c.shape = {16, 64, 32};
  c.routing = {routing_kind::sigmoid_grouped_topk, 6, true, 4, 2, 2.5f};
  c.activation = {activation_kind::swiglu_clamped, 1.5f, 6.0f};
  c.gate_up = layout::gate_up_order::interleaved;
  const moe_config r = checkpoint::config_from_json(checkpoint::config_to_json(c), c.shape);
  EXPECT_EQ(r.routing.kind, c.routing.kind);
  EXPECT_EQ(r.routing.top_k, 6);
  EXPECT_EQ(r.routing.n_group, 4);
  EXPECT_EQ(r.routing.topk_group, 2);
  EXPECT_FLOAT_EQ(r.routing.routed_scaling_factor, 2.5f);
  EXPECT_EQ(r.activation.kind, activation_kind::swiglu_clamped);
  EXPECT_FLOAT_EQ(r.activation.alpha, 1.5f);
  EXPECT_FLOAT_EQ(r.activation.limit, 6.0f);
  EXPECT_THROW(checkpoint::config_from_json("{\"routing\":\"nope\"}", c.shape), invalid_argument);
  EXPECT_THROW(checkpoint::config_from_json("not json", c.shape), invalid_argument);
}

TEST(Checkpoint, Mxfp4LayerWrittenFromDeclsReadsBackAsWeights) {
  const fs::path d = fresh_dir("mxfp4");
  const moe_shape s{2, 64, 32};
  const std::string p = checkpoint::gpt_oss_prefix(1);
  const auto decls = checkpoint::mxfp4_layer_decls(p, s);
  ASSERT_EQ(decls.size(), 4u);
  EXPECT_EQ(decls[0].shape, (std::vector<int64_t>{2, 64, 2, 16}));  // [E, 2I, H/32, 16]
  EXPECT_EQ(decls[3].shape, (std::vector<int64_t>{2, 64, 1}));      // [E, H, I/32]
  const std::string path = (d / "q.safetensors").string();
  {
    safetensors_writer w(path, decls);
    for (const auto& decl : decls) {
      int64_t n = 1;
      for (int64_t x : decl.shape) n *= x;
      std::vector<uint8_t> bytes(static_cast<size_t>(n), 0x77);
      w.write(decl.name, bytes.data(), bytes.size());
    }
    w.commit();
  }
  const safetensors_reader r(path);
  const auto info = checkpoint::find_moe_layer(r, 1);
  EXPECT_EQ(info.layout, checkpoint::moe_layout::mxfp4_gpt_oss);
  EXPECT_EQ(info.shape.intermediate, 32);
  const moe_weights w = checkpoint::mxfp4_weights(r, info);
  EXPECT_EQ(w.format, weight_format::mxfp4);
  EXPECT_EQ(w.gate_up_blocks.shape, decls[0].shape);
  EXPECT_EQ(w.down_scales.shape, decls[3].shape);
  EXPECT_TRUE(w.gate_up_bias.empty());
  EXPECT_EQ(checkpoint::gate_up_geometry(s).block_bytes(), 2 * 64 * 32);
  fs::remove_all(d);
}

TEST(Checkpoint, IncompleteOrInconsistentLayersAreFormatErrors) {
  const fs::path d = fresh_dir("bad");
  std::vector<float> buf(4096, 1.0f);
  const std::string p = "model.layers.0.mlp.experts.";
  const auto check = [&](std::vector<std::pair<std::string, tensor_view>> t, const std::string& needle) {
    const std::string path = (d / "bad.safetensors").string();
    write_safetensors(path, t, {}, true);
    const safetensors_reader r(path);
    try {
      checkpoint::find_moe_layers(r);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const format_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // expert 1 lacks up_proj
  check({{p + "0.gate_proj.weight", tensor_view(buf.data(), dtype::f32, {4, 8})},
         {p + "0.up_proj.weight", tensor_view(buf.data(), dtype::f32, {4, 8})},
         {p + "0.down_proj.weight", tensor_view(buf.data(), dtype::f32, {8, 4})},
         {p + "1.gate_proj.weight", tensor_view(buf.data(), dtype::f32, {4, 8})},
         {p + "1.down_proj.weight", tensor_view(buf.data(), dtype::f32, {8, 4})}},
        "experts.1.up_proj.weight");
  // expert ids with a gap
  check({{p + "0.gate_proj.weight", tensor_view(buf.data(), dtype::f32, {4, 8})},
         {p + "2.gate_proj.weight", tensor_view(buf.data(), dtype::f32, {4, 8})}},
        "not contiguous");
  // down_proj of the wrong shape
  check({{p + "gate_up_proj", tensor_view(buf.data(), dtype::f32, {2, 8, 8})},
         {p + "down_proj", tensor_view(buf.data(), dtype::f32, {2, 8, 4})}},
        "expected [2, 4, 8]");
  // MXFP4 scales that do not match the blocks
  check({{p + "gate_up_proj_blocks", tensor_view(buf.data(), dtype::u8, {1, 64, 1, 16})},
         {p + "gate_up_proj_scales", tensor_view(buf.data(), dtype::u8, {1, 3, 1})},
         {p + "down_proj_blocks", tensor_view(buf.data(), dtype::u8, {1, 32, 1, 16})},
         {p + "down_proj_scales", tensor_view(buf.data(), dtype::u8, {1, 32, 1})}},
        "gate_up_proj_scales");
  fs::remove_all(d);
}
