// mxmoe/inspect.h — reading an MXFP4 checkpoint back: per weight, the scale bytes, the largest
// code of each block and the scale rules its bytes are consistent with (mx::min_block_max_code);
// given the BF16 source, the rule that reproduces them byte for byte. `mxmoe inspect` prints these.
// All in host memory; nothing is written.
#pragma once

#include <array>
#include <cstdint>

#include "mxmoe/checkpoint.h"
#include "mxmoe/convert.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"
#include "mxmoe/safetensors.h"

namespace mxmoe::checkpoint {

// Per-rule arrays are indexed in mx::kAllScaleRules order (floor, even, rceil, mse).
inline constexpr size_t kRuleCount = std::size(mx::kAllScaleRules);

struct scale_census {
  int64_t blocks = 0;
  std::array<int64_t, 256> scale_histogram{};   // blocks per scale byte (0xFF: NaN blocks)
  std::array<int64_t, 8> max_code_histogram{};  // blocks per largest |code| (0: an all-zero block)
  int64_t clamped_scales = 0;                   // blocks with scale byte 0 or 254: not judged
  std::array<int64_t, kRuleCount> inconsistent{};  // judged blocks whose largest code the rule rules out
  // No judged block rules `r` out: a necessary condition for the weight having been quantized
  // with it (floor and even, in particular, cannot be told apart this way).
  bool consistent(mx::scale_rule r) const;
};

// The census of one MXFP4 weight: `blocks` and `scales` in the checkpoint layout `geometry`.
// Blocks with a NaN scale, a clamped scale or no non-zero code are counted but not judged.
scale_census take_census(const layout::checkpoint_mxfp4& geometry, const uint8_t* blocks, const uint8_t* scales);

struct rule_match {
  int64_t scales_equal = 0;  // scale bytes equal to the recomputed ones
  int64_t blocks_equal = 0;  // blocks whose scale and 16 code bytes are all equal
  int64_t blocks = 0;
};

// Both MXFP4 weights of layer `info` of `file`, recomputed from the same layer of the BF16
// checkpoint `source` with every rule (on the CPU) and compared byte for byte. The rule with 100%
// equal blocks is the one used. Throws mxmoe::invalid_argument ("source") when `source` has no
// BF16 layer of that index and shape. Re-quantizing is the slow part (about a minute for 1.5 GB on
// 2 cores): `on_progress`, when given, is called after each expert (done of total = E, the note
// "layer L expert E").
std::array<rule_match, kRuleCount> match_scale_rules(const safetensors_reader& file, const moe_layer_info& info,
                                                     const safetensors_reader& source,
                                                     const progress_callback& on_progress = {});

}  // namespace mxmoe::checkpoint
