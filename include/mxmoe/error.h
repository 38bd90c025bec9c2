// mxmoe/error.h — how mxmoe reports bad input: an exception naming the argument, what was
// expected and what was given. Every public entry point validates before it writes anything.
#pragma once

#include <stdexcept>
#include <string>

namespace mxmoe {

// Bad input from the caller (shape, dtype, alignment, range, a malformed file).
class invalid_argument : public std::invalid_argument {
 public:
  invalid_argument(const std::string& arg, const std::string& expected, const std::string& got)
      : std::invalid_argument("argument '" + arg + "': expected " + expected + ", got " + got),
        arg_(arg) {}
  const std::string& arg() const { return arg_; }

 private:
  std::string arg_;
};

// Values that must be finite are not: a NaN or an Inf in a tensor, named as the file names it
// (quantize_checkpoint refuses them unless told to keep them). Bad input, so an invalid_argument
// whose arg() is the tensor; tensor() says so by name.
class nonfinite_error : public invalid_argument {
 public:
  nonfinite_error(const std::string& tensor, const std::string& expected, const std::string& got)
      : invalid_argument(tensor, expected, got) {}
  const std::string& tensor() const { return arg(); }
};

// A fast path that cannot run on this machine or build (no GPU, CPU-only build, ...).
class unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mxmoe

// Throws mxmoe::invalid_argument when `cond` is false. `expected` and `got` are strings.
#define MXMOE_CHECK_ARG(cond, arg, expected, got)                     \
  do {                                                                \
    if (!(cond)) throw ::mxmoe::invalid_argument((arg), (expected), (got)); \
  } while (0)
