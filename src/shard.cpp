// The host-side cuts of a layer's weights for expert and tensor parallelism (include/mxmoe/shard.h).
// Every cut is one copy of rows: an expert tensor [E, R, ...] is read as E x R rows of bytes, and a
// cut picks, for each expert it keeps, which source rows go where and which bytes of each row.
// The positions come from layout::even_split and layout::gate_up_rows, never restated here.
#include "mxmoe/shard.h"

#include <cstring>
#include <functional>
#include <string>

#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/validate.h"

namespace mxmoe {
namespace {

// Bytes of one row of an expert tensor [E, R, rest...] (a 2-D [E, R] tensor has one element a row).
int64_t row_bytes(const tensor_view& v) {
  int64_t n = dtype_size(v.type);
  for (size_t d = 2; d < v.shape.size(); ++d) n *= v.shape[d];
  return n;
}

// dst[e][r] = bytes [col0, col0 + dst row bytes) of src[expert_of[e]][source_row(r)], for the
// experts e of expert_of and the `rows` rows of dst; dst_shape[0] = expert_of.size().
owned_tensor cut_rows(const tensor_view& src, std::vector<int64_t> dst_shape, const std::vector<int64_t>& expert_of,
                      const std::function<int64_t(int64_t)>& source_row, int64_t col0_bytes) {
  owned_tensor t;
  if (is_absent(src)) return t;
  t.type = src.type;
  t.shape = std::move(dst_shape);
  const tensor_view dst_view(nullptr, t.type, t.shape);
  const int64_t src_rows = src.dim(1), rows = t.shape[1], src_row = row_bytes(src), dst_row = row_bytes(dst_view);
  t.bytes.resize(dst_view.nbytes());
  const auto* s = static_cast<const uint8_t*>(src.data);
  for (size_t e = 0; e < expert_of.size(); ++e)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(t.bytes.data() + (static_cast<int64_t>(e) * rows + r) * dst_row,
                  s + (expert_of[e] * src_rows + source_row(r)) * src_row + col0_bytes, static_cast<size_t>(dst_row));
  return t;
}

std::vector<int64_t> with_experts(std::vector<int64_t> shape, int64_t experts) {
  shape[0] = experts;
  return shape;
}

void check_host_weights(const moe_weights& w, const char* what) {
  const tensor_view& first = w.format == weight_format::mxfp4 ? w.gate_up_blocks : w.gate_up;
  MXMOE_CHECK_ARG(first.device == device_kind::cpu, "weights", std::string("host tensors (") + what + " reads them)",
                  "cuda tensors");
}

}  // namespace

owned_tensor owned_tensor::copy_of(const tensor_view& v) {
  owned_tensor t;
  if (is_absent(v)) return t;
  const auto* p = static_cast<const uint8_t*>(v.data);
  t.bytes.assign(p, p + v.nbytes());
  t.type = v.type;
  t.shape = v.shape;
  return t;
}

tensor_view owned_tensor::view() const {
  if (shape.empty()) return {};
  return tensor_view(const_cast<uint8_t*>(bytes.data()), type, shape);
}

moe_weights owned_weights::weights() const {
  moe_weights w;
  w.format = format;
  w.gate_up_blocks = gate_up_blocks.view();
  w.gate_up_scales = gate_up_scales.view();
  w.down_blocks = down_blocks.view();
  w.down_scales = down_scales.view();
  w.gate_up = gate_up.view();
  w.down = down.view();
  w.gate_up_bias = gate_up_bias.view();
  w.down_bias = down_bias.view();
  w.router_weight = router_weight.view();
  w.router_bias = router_bias.view();
  w.correction_bias = correction_bias.view();
  return w;
}

int64_t shard_begin(int64_t intermediate, const tp_shard& s) {
  const int64_t blocks = intermediate / mx::kBlockSize;
  MXMOE_CHECK_ARG(s.ranks >= 1 && s.ranks <= blocks, "tp.ranks",
                  "a value in [1, I/32] = [1, " + std::to_string(blocks) + "] (every rank holds a 32-block of I)",
                  std::to_string(s.ranks));
  MXMOE_CHECK_ARG(s.rank >= 0 && s.rank < s.ranks, "tp.rank", "a value in [0, " + std::to_string(s.ranks) + ")",
                  std::to_string(s.rank));
  return layout::even_split{blocks, s.ranks}.begin(s.rank) * mx::kBlockSize;
}

int64_t shard_intermediate(int64_t intermediate, const tp_shard& s) {
  shard_begin(intermediate, s);
  return layout::even_split{intermediate / mx::kBlockSize, s.ranks}.count(s.rank) * mx::kBlockSize;
}

std::vector<int32_t> contiguous_owners(int64_t experts, int ranks) {
  MXMOE_CHECK_ARG(ranks >= 1 && ranks <= experts, "ranks",
                  "a value in [1, experts] = [1, " + std::to_string(experts) + "] (every rank holds an expert)",
                  std::to_string(ranks));
  const layout::even_split split{experts, ranks};
  std::vector<int32_t> owners(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) owners[static_cast<size_t>(e)] = static_cast<int32_t>(split.part_of(e));
  return owners;
}

std::vector<int32_t> expert_map_of(const std::vector<int32_t>& owners, int rank) {
  std::vector<int32_t> map(owners.size(), -1);
  int32_t next = 0;
  for (size_t e = 0; e < owners.size(); ++e)
    if (owners[e] == rank) map[e] = next++;
  MXMOE_CHECK_ARG(next > 0, "rank", "a rank that owns at least one expert", std::to_string(rank) + " owns none");
  return map;
}

owned_weights select_experts(const moe_weights& w, const moe_config& cfg, const std::vector<int32_t>& expert_map) {
  validate(w, cfg);
  check_host_weights(w, "select_experts");
  const int64_t held = validate_expert_map(expert_map, cfg.shape.experts);
  std::vector<int64_t> expert_of(static_cast<size_t>(held));
  for (int64_t e = 0; e < cfg.shape.experts; ++e) {
    const int32_t local = expert_map.empty() ? static_cast<int32_t>(e) : expert_map[static_cast<size_t>(e)];
    if (local >= 0) expert_of[static_cast<size_t>(local)] = e;
  }
  const auto same_row = [](int64_t r) { return r; };
  const auto pick = [&](const tensor_view& v) {
    return is_absent(v) ? owned_tensor{} : cut_rows(v, with_experts(v.shape, held), expert_of, same_row, 0);
  };
  owned_weights o;
  o.cfg = cfg;
  o.format = w.format;
  o.gate_up_blocks = pick(w.gate_up_blocks);
  o.gate_up_scales = pick(w.gate_up_scales);
  o.down_blocks = pick(w.down_blocks);
  o.down_scales = pick(w.down_scales);
  o.gate_up = pick(w.gate_up);
  o.down = pick(w.down);
  o.gate_up_bias = pick(w.gate_up_bias);
  o.down_bias = pick(w.down_bias);
  o.router_weight = owned_tensor::copy_of(w.router_weight);
  o.router_bias = owned_tensor::copy_of(w.router_bias);
  o.correction_bias = owned_tensor::copy_of(w.correction_bias);
  return o;
}

owned_weights shard_weights(const moe_weights& w, const moe_config& cfg, const tp_shard& s,
                            const std::vector<int32_t>& expert_map) {
  validate(w, cfg, expert_map);
  MXMOE_CHECK_ARG(w.format == weight_format::mxfp4, "weights.format", "mxfp4 (tensor parallelism cuts 32-blocks)",
                  to_string(w.format));
  check_host_weights(w, "shard_weights");
  const int64_t held = validate_expert_map(expert_map, cfg.shape.experts), H = cfg.shape.hidden,
                I = cfg.shape.intermediate;
  const int64_t i0 = shard_begin(I, s), ir = shard_intermediate(I, s);
  const int64_t b0 = i0 / mx::kBlockSize, nb = ir / mx::kBlockSize;
  std::vector<int64_t> experts(static_cast<size_t>(held));
  for (int64_t e = 0; e < held; ++e) experts[static_cast<size_t>(e)] = e;

  // GEMM1: row (j, is_up) of the shard is row (i0 + j, is_up) of the layer, in cfg.gate_up order.
  const layout::gate_up_rows full{I, cfg.gate_up}, part{ir, cfg.gate_up};
  const auto gate_up_source = [&](int64_t r) {
    int64_t j;
    int is_up;
    part.split_checkpoint_row(r, &j, &is_up);
    return full.checkpoint_row(i0 + j, is_up);
  };
  const auto same_row = [](int64_t r) { return r; };
  const layout::checkpoint_mxfp4 down{held, H, I};
  owned_weights o;
  o.cfg = cfg;
  o.cfg.shape.intermediate = ir;
  o.format = weight_format::mxfp4;
  o.gate_up_blocks = cut_rows(w.gate_up_blocks, {held, 2 * ir, H / 32, 16}, experts, gate_up_source, 0);
  o.gate_up_scales = cut_rows(w.gate_up_scales, {held, 2 * ir, H / 32}, experts, gate_up_source, 0);
  // GEMM2: every row of down, the bytes of the shard's blocks (K columns i0 .. i0 + I_r).
  o.down_blocks = cut_rows(w.down_blocks, {held, H, nb, 16}, experts, same_row, down.code_offset(0, 0, i0).byte);
  o.down_scales = cut_rows(w.down_scales, {held, H, nb}, experts, same_row, down.scale_offset(0, 0, b0));
  if (!is_absent(w.gate_up_bias))
    o.gate_up_bias = cut_rows(w.gate_up_bias, {held, 2 * ir}, experts, gate_up_source, 0);
  if (s.rank == 0) o.down_bias = owned_tensor::copy_of(w.down_bias);  // added once over the ranks
  o.router_weight = owned_tensor::copy_of(w.router_weight);
  o.router_bias = owned_tensor::copy_of(w.router_bias);
  o.correction_bias = owned_tensor::copy_of(w.correction_bias);
  return o;
}

}  // namespace mxmoe
