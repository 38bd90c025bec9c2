// mxmoe/presets.h — the MoE layers of the models mxmoe targets (docs/models.md), as configurations.
// Used by `mxmoe run --preset`, the benchmark and the tests; weights are synthetic.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "mxmoe/moe.h"

namespace mxmoe {

struct model_preset {
  const char* name;
  moe_config config;
  bool has_biases;  // gpt-oss carries biases on both GEMMs
};

std::span<const model_preset> model_presets();
// nullptr when unknown.
const model_preset* find_model_preset(std::string_view name);
// "a | b | c": the preset names, for help texts and error messages.
std::string model_preset_names();

}  // namespace mxmoe
