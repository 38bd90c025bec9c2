// `mxmoe run`'s check for NaN / Inf in what it is given — router, biases, MXFP4 scale bytes 0xFF
// (NaN blocks), the inputs — before anything runs: a NaN there makes the output NaN and the
// verification read "rel-L2 inf FAIL", which blames the backend for the data.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mxmoe/dtype.h"

namespace mxmoe::cli {

// A tensor to check, named as the user knows it ("model.layers.0.mlp.router.weight",
// "x of --inputs acts.safetensors"). Float tensors (bf16, f16, f32) are checked for NaN / Inf;
// MXFP4 scale tensors (u8, `scales`) for the byte 0xFF.
struct named_tensor {
  std::string name;
  tensor_view view;
  bool scales = false;
};

// Non-finite values where a finite one is needed (exit code 6 in main.cpp). `tensor()` is the
// name of the first tensor found holding one.
class nonfinite_input : public std::runtime_error {
 public:
  nonfinite_input(std::string tensor, const std::string& what) : std::runtime_error(what), tensor_(std::move(tensor)) {}
  const std::string& tensor() const { return tensor_; }

 private:
  std::string tensor_;
};

// Throws nonfinite_input for the first tensor holding a NaN, an Inf or a 0xFF scale, naming it,
// what it holds and the index of the first such element. Absent (empty) tensors are skipped.
void check_finite(const std::vector<named_tensor>& tensors);

}  // namespace mxmoe::cli
