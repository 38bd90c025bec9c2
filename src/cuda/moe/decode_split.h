// moe/decode_split.h — how a decode GEMM launch (gemm_decode.cuh) spreads over the SMs: the B rows
// its ring holds, the K split and the shared memory it asks for. Host code only, no CUDA: the
// layer (moe_layer.cu) fills decode_device from the GPU it runs on, and tests/cpu/test_decode_split.cpp
// fills it by hand to pin the choices the comments below name.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mxmoe::cuda {

namespace sm90 {
// Warps per decode CTA; a CTA covers 16 * warps / k_groups weight rows. The narrow CTA (8-token
// tiles only) halves the rows per CTA, so that launches of few CTAs spread evenly over the SMs.
inline constexpr int kDecodeWarps = 8;
inline constexpr int kDecodeWarpsNarrow = 4;
}  // namespace sm90

// B rows per fragment tile of the decode GEMM's ring: the most pairs a tile can hold, rounded up to
// a power of 2. Routed tokens pick an expert once, so a tile holds at most T pairs; caller-provided
// ids may repeat an expert within a token, so then at most T * k.
int decode_ring_rows(int64_t tokens, int top_k, bool precomputed, int bn);

// Decode GEMM CTAs resident per SM, by tile (8 or 16 tokens), K split (1, 2, 4), ring_rows (a
// power of 2 up to the tile) and warps per CTA (8, or 4 for the narrow 8-token CTA): the layer
// measures them (measure_decode_occupancy in moe_layer.cu, the instantiation for scale bytes in
// [1, 128]). The other instantiation (two multiplies per register, more registers) may fit one CTA
// fewer: its split and SM cap are then tuned for one CTA too many per SM, which costs time, not
// correctness.
class decode_occupancy {
 public:
  static constexpr int kWidths = 2;  // tokens per tile 8, 16
  static constexpr int kGroups = 3;  // k_groups 1, 2, 4
  static constexpr int kRows = 5;    // ring_rows 1 .. 16

  void set(int bn, int kg, int rows, int warps, int ctas) { ctas_[slot(bn, kg, rows, warps)] = ctas; }
  int ctas_per_sm(int bn, int kg, int rows, int warps) const { return ctas_[slot(bn, kg, rows, warps)]; }

 private:
  // [8-token, 16-token, narrow 8-token][k_groups][ring_rows]
  static int slot(int bn, int kg, int rows, int warps) {
    const int width = warps == sm90::kDecodeWarpsNarrow ? kWidths : log2(bn / 8);
    return (width * kGroups + log2(kg)) * kRows + log2(rows);
  }
  static int log2(int power_of_2) { return 31 - __builtin_clz(static_cast<unsigned>(power_of_2)); }
  int ctas_[(kWidths + 1) * kGroups * kRows] = {};
};

// Which of the layer's two GEMMs a decode launch is: GEMM2 (down) starts copying its weights before
// GEMM1 ends (gemm_launch::early_weights), which changes what its CTA shape buys.
enum class decode_gemm { gate_up, down };

// How a decode GEMM launch spreads over the SMs: its K split (warps of a CTA splitting K) and the
// dynamic shared memory it asks for.
struct decode_split {
  int k_groups = 1;
  int warps = sm90::kDecodeWarps;
  size_t min_smem_bytes = 0;
};

// Device facts the split goes by, looked up once per layer.
struct decode_device {
  int sms = 0;
  size_t smem_per_sm = 0, smem_reserved_per_cta = 0;
  decode_occupancy occupancy;
};

// The split of one GEMM of `rows` x `cols` (N x K) weights with about est_tiles tiles of bn tokens
// (decode_split.cu says how and why).
decode_split pick_decode_split(decode_gemm gemm, int bn, int ring_rows, int64_t est_tiles, int64_t rows,
                               int64_t cols, const decode_device& dev);

}  // namespace mxmoe::cuda
