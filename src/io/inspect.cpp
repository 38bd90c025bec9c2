// Scale census and rule matching of MXFP4 checkpoints (include/mxmoe/inspect.h). Built into the
// top library: matching re-quantizes through the dispatch of quantize.h.
#include "mxmoe/inspect.h"

#include <algorithm>
#include <vector>

#include "mxmoe/error.h"
#include "mxmoe/quantize.h"

namespace mxmoe::checkpoint {

bool scale_census::consistent(mx::scale_rule r) const {
  for (size_t i = 0; i < kRuleCount; ++i)
    if (mx::kAllScaleRules[i] == r) return inconsistent[i] == 0;
  return false;
}

scale_census take_census(const layout::checkpoint_mxfp4& g, const uint8_t* blocks, const uint8_t* scales) {
  scale_census c;
  c.blocks = g.scale_bytes();
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t n = 0; n < g.rows; ++n)
      for (int64_t kb = 0; kb < g.scale_cols(); ++kb) {
        const uint8_t s = scales[g.scale_offset(e, n, kb)];
        ++c.scale_histogram[s];
        int max_code = 0;
        for (int64_t k = kb * mx::kBlockSize; k < (kb + 1) * mx::kBlockSize; ++k) {
          const layout::nibble_pos p = g.code_offset(e, n, k);
          max_code = std::max(max_code, mx::unpack_e2m1(blocks[p.byte], p.high) & 7);
        }
        ++c.max_code_histogram[static_cast<size_t>(max_code)];
        if (s == mx::kE8M0Nan || max_code == 0) continue;
        if (s == 0 || s == 254) {
          ++c.clamped_scales;
          continue;
        }
        for (size_t r = 0; r < kRuleCount; ++r)
          c.inconsistent[r] += max_code < mx::min_block_max_code(mx::kAllScaleRules[r]) ? 1 : 0;
      }
  return c;
}

std::array<rule_match, kRuleCount> match_scale_rules(const safetensors_reader& file, const moe_layer_info& info,
                                                     const safetensors_reader& source,
                                                     const progress_callback& on_progress) {
  const moe_layer_info src = find_moe_layer(source, info.layer);
  MXMOE_CHECK_ARG(src.layout != moe_layout::mxfp4_gpt_oss, "source", "a BF16 checkpoint", "an MXFP4 one");
  MXMOE_CHECK_ARG(src.shape.experts == info.shape.experts && src.shape.hidden == info.shape.hidden &&
                      src.shape.intermediate == info.shape.intermediate,
                  "source", "the same layer shape", "a different one for layer " + std::to_string(info.layer));
  const mxfp4_names n = mxfp4_tensor_names(info.prefix);
  const layout::checkpoint_mxfp4 gu = gate_up_geometry(info.shape), dn = down_geometry(info.shape);
  std::array<rule_match, kRuleCount> m{};
  std::vector<uint8_t> gate_up_buf, down_buf, packed, scales;
  for (int64_t e = 0; e < info.shape.experts; ++e) {
    const expert_weights x = read_expert(source, src, e, gate_up_buf, down_buf);
    for (const auto* g : {&gu, &dn}) {
      const bool is_gu = g == &gu;
      const uint8_t* fb = file.bytes(file.entry(is_gu ? n.gate_up_blocks : n.down_blocks)).data();
      const uint8_t* fs = file.bytes(file.entry(is_gu ? n.gate_up_scales : n.down_scales)).data();
      // One expert [rows, K] quantized alone is the checkpoint layout of a single expert.
      const layout::checkpoint_mxfp4 one{1, g->rows, g->cols};
      packed.resize(static_cast<size_t>(one.block_bytes()));
      scales.resize(static_cast<size_t>(one.scale_bytes()));
      for (size_t r = 0; r < kRuleCount; ++r) {
        quantize(is_gu ? x.gate_up : x.down, mx::kAllScaleRules[r], scale_layout::linear,
                 tensor_view(packed.data(), dtype::u8, {g->rows, g->row_bytes()}),
                 tensor_view(scales.data(), dtype::u8, {g->rows, g->scale_cols()}));
        for (int64_t row = 0; row < g->rows; ++row)
          for (int64_t kb = 0; kb < g->scale_cols(); ++kb) {
            const bool scale_eq = scales[static_cast<size_t>(one.scale_offset(0, row, kb))] == fs[g->scale_offset(e, row, kb)];
            const uint8_t* mine = packed.data() + one.code_offset(0, row, kb * mx::kBlockSize).byte;
            const uint8_t* theirs = fb + g->code_offset(e, row, kb * mx::kBlockSize).byte;
            m[r].scales_equal += scale_eq ? 1 : 0;
            m[r].blocks_equal += scale_eq && std::equal(mine, mine + mx::kPackedBlockBytes, theirs) ? 1 : 0;
          }
        m[r].blocks += g->rows * g->scale_cols();
      }
    }
    if (on_progress)
      on_progress({e + 1, info.shape.experts, "layer " + std::to_string(info.layer) + " expert " + std::to_string(e)});
  }
  return m;
}

}  // namespace mxmoe::checkpoint
