// libFuzzer target for the safetensors reader: any byte string must either parse into entries
// whose bytes lie inside the input, or throw mxmoe::format_error. Anything else (a crash, an
// out-of-bounds read under ASan, another exception type) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "mxmoe/checkpoint.h"
#include "mxmoe/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mxmoe::safetensors_reader r(std::span<const uint8_t>(data, size), "fuzz-input");
    uint64_t sum = 0;
    for (const auto& e : r.entries()) {
      const auto bytes = r.bytes(e);
      if (bytes.data() < data || bytes.data() + bytes.size() > data + size) std::abort();
      for (uint8_t b : bytes) sum += b;  // touch every byte: ASan catches a bad range
    }
    // Layer detection and shape validation on top of the parsed header.
    try {
      for (const auto& l : mxmoe::checkpoint::find_moe_layers(r)) sum += static_cast<uint64_t>(l.shape.experts);
    } catch (const mxmoe::format_error&) {
    }
    return static_cast<int>(sum & 0);
  } catch (const mxmoe::format_error&) {
    return 0;
  }
}
