// mxmoe/layout.h — the one definition of every MXFP4 weight and scale layout mxmoe reads or
// writes. Each layout maps a logical coordinate to a storage offset and has an inverse; tests
// check round trips on odd shapes and never re-derive a layout by hand.
//
// Logical coordinates: a quantized matrix W[N][K] (N output rows, K the reduction dimension, a
// multiple of 32) has codes c(n, k) and scales s(n, kb) with kb = k / 32 (K/32 scale columns).
//
//   scale_linear       s at n * (K/32) + kb                       (row-major [N, K/32])
//   scale_tiled_128x4  Blackwell block-scaled MMA / cuBLAS / CUTLASS Sm1xxBlockScaledConfig /
//                      FlashInfer layout_128x4: rows padded to 128, columns to 4, stored as
//                      [N/128][K/32/4][32][4][4]  (docs/formats.md; vLLM's untile_cutlass_scale inverts it)
//   checkpoint_mxfp4   gpt-oss / HF: blocks [E, N, K/32, 16] u8, scales [E, N, K/32] u8 — i.e.
//                      row-major packed codes, element 2j low nibble, and linear scales.
//   checkpoint_xw      gpt-oss BF16 expert weights: dense [E, K, N], the x·W form (W transposed).
//   sm90_fragment      mxmoe's kernel layout (below): each lane's mma.sync / wgmma A-fragment
//                      contiguous, 16 rows x 64 k per 512-byte tile, codes in fragment words
//                      (mx::fragment_bit) placed for a cheap bf16 conversion.
//   gate_up_rows       row order of the fused GEMM1 weight in the kernel layout, so that a
//                      thread holds gate and up of the same output in its accumulators.
//   matrix_source      where W[n][k] of one expert lies in the bytes a BF16 checkpoint stores
//                      for it (row-major, x·W, or separate gate and up matrices).
//   sw128_rows         bf16 activation rows of 64 k in shared memory, 128-byte swizzled: what
//                      TMA writes, wgmma's descriptors and ldmatrix read, and the kernels'
//                      cp.async copies write.
//   even_split         n items (experts, or the I/32 blocks of a tensor-parallel shard) cut
//                      into P contiguous parts as even as possible, the remainder to the first
//                      parts (docs/parallel.md).
//
// Padding (rows or columns a layout adds) is never data: readers mask it, and the library's
// own writers fill it with zero codes and scale byte 0.
#pragma once

#include <cstdint>

#include "mxmoe/hd.h"
#include "mxmoe/mx.h"

namespace mxmoe::layout {

MXMOE_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
MXMOE_HD int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Position of one 4-bit code in a byte array.
struct nibble_pos {
  int64_t byte;
  int high;  // 1: bits 7..4, 0: bits 3..0
};

// ---- scales: linear [rows, cols] ---------------------------------------------------------
struct scale_linear {
  int64_t rows = 0, cols = 0;  // cols = K / 32
  MXMOE_HD int64_t size() const { return rows * cols; }
  MXMOE_HD int64_t offset(int64_t m, int64_t k) const { return m * cols + k; }
  MXMOE_HD void coord(int64_t off, int64_t* m, int64_t* k) const {
    *m = off / cols;
    *k = off % cols;
  }
};

// ---- scales: 128x4 tiled ---------------------------------------------------------------
// offset(m, k) = (m/128)*kTiles*512 + (k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + (k%4)
struct scale_tiled_128x4 {
  int64_t rows = 0, cols = 0;  // logical rows and scale columns (K / 32)
  MXMOE_HD int64_t m_tiles() const { return ceil_div(rows, 128); }
  MXMOE_HD int64_t k_tiles() const { return ceil_div(cols, 4); }
  MXMOE_HD int64_t padded_rows() const { return m_tiles() * 128; }
  MXMOE_HD int64_t padded_cols() const { return k_tiles() * 4; }
  MXMOE_HD int64_t size() const { return padded_rows() * padded_cols(); }
  MXMOE_HD int64_t offset(int64_t m, int64_t k) const {
    return (m / 128) * k_tiles() * 512 + (k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
  }
  // Inverse over the whole padded storage: returns false for padding.
  MXMOE_HD bool coord(int64_t off, int64_t* m, int64_t* k) const {
    const int64_t tile = off / 512, in = off % 512;
    const int64_t mt = tile / k_tiles(), kt = tile % k_tiles();
    *m = mt * 128 + ((in % 16) / 4) * 32 + in / 16;
    *k = kt * 4 + in % 4;
    return *m < rows && *k < cols;
  }
};

// ---- gpt-oss checkpoint: blocks [E, N, K/32, 16], scales [E, N, K/32] --------------------
struct checkpoint_mxfp4 {
  int64_t experts = 1, rows = 0, cols = 0;  // cols = K (elements)
  MXMOE_HD int64_t scale_cols() const { return cols / mx::kBlockSize; }
  MXMOE_HD int64_t row_bytes() const { return cols / 2; }
  MXMOE_HD int64_t block_bytes() const { return experts * rows * row_bytes(); }
  MXMOE_HD int64_t scale_bytes() const { return experts * rows * scale_cols(); }
  MXMOE_HD nibble_pos code_offset(int64_t e, int64_t n, int64_t k) const {
    return {(e * rows + n) * row_bytes() + k / 2, static_cast<int>(k & 1)};
  }
  MXMOE_HD void code_coord(nibble_pos p, int64_t* e, int64_t* n, int64_t* k) const {
    const int64_t r = p.byte / row_bytes();
    *e = r / rows;
    *n = r % rows;
    *k = (p.byte % row_bytes()) * 2 + p.high;
  }
  // The scales are linear: one scale_linear matrix of E*N rows.
  MXMOE_HD scale_linear scales() const { return {experts * rows, scale_cols()}; }
  MXMOE_HD int64_t scale_offset(int64_t e, int64_t n, int64_t kb) const { return scales().offset(e * rows + n, kb); }
  MXMOE_HD void scale_coord(int64_t off, int64_t* e, int64_t* n, int64_t* kb) const {
    int64_t r;
    scales().coord(off, &r, kb);
    *e = r / rows;
    *n = r % rows;
  }
};

// ---- gpt-oss BF16 checkpoint: dense [E, K, N] ----------------------------------------------
// The BF16 gpt-oss checkpoints (and Hugging Face transformers' GptOssExperts) store each expert's
// weight for x @ W, i.e. W[N][K] transposed: gate_up_proj [E, H, 2I] (column c is row c of the
// fused gate/up weight, gate/up interleaved) and down_proj [E, I, H]. Element (e, n, k) of W sits
// at element (e * K + k) * N + n. Any float type; offsets are in elements.
struct checkpoint_xw {
  int64_t experts = 1, rows = 0, cols = 0;  // N (outputs), K (inputs)
  MXMOE_HD int64_t size() const { return experts * rows * cols; }
  MXMOE_HD int64_t offset(int64_t e, int64_t n, int64_t k) const { return (e * cols + k) * rows + n; }
  MXMOE_HD void coord(int64_t off, int64_t* e, int64_t* n, int64_t* k) const {
    *n = off % rows;
    *k = (off / rows) % cols;
    *e = off / rows / cols;
  }
};

// ---- sm90 fragment layout (mxmoe kernels) -------------------------------------------------
// The matrix is cut into tiles of 16 rows x 64 k, stored tile-row-major ([N/16][K/64]), so a
// warp streaming one row tile along K reads contiguous memory. A tile is 512 bytes = 128 u32
// words: lane L (g = L/4, t = L%4) owns words 4L..4L+3 (bytes [16L, 16L+16)), word j for the k16
// step j. mma.sync.m16n8k16 (and each warp of a wgmma m64 A-from-registers) wants, per lane and
// k16 step, bf16x2 registers a0 = W[g][2t, 2t+1], a1 = W[g+8][2t, 2t+1], a2 = W[g][2t+8, 2t+9],
// a3 = W[g+8][2t+8, 2t+9]: register r's two elements are slots r (low half) and r + 4 (high
// half) of the word, a "fragment word" whose bit placement is mx::fragment_bit (decoded to the
// registers by mx::fragment_bf16x2_pow2m126). Words are little-endian u32 at byte 4 * word.
// Scales: 32 bytes per tile; lane L reads the u32 at byte 4g: bytes (g, kb0), (g+8, kb0),
// (g, kb1), (g+8, kb1), where kb0/kb1 are the tile's two 32-element blocks.
struct sm90_fragment {
  static constexpr int kTileRows = 16, kTileCols = 64, kTileBytes = 512, kTileScaleBytes = 32;
  static constexpr int kTileWords = kTileBytes / 4;
  int64_t rows = 0, cols = 0;  // N, K (K a multiple of 32)
  MXMOE_HD int64_t row_tiles() const { return ceil_div(rows, kTileRows); }
  MXMOE_HD int64_t col_tiles() const { return ceil_div(cols, kTileCols); }
  MXMOE_HD int64_t weight_bytes() const { return row_tiles() * col_tiles() * kTileBytes; }
  MXMOE_HD int64_t weight_words() const { return row_tiles() * col_tiles() * kTileWords; }
  MXMOE_HD int64_t scale_bytes() const { return row_tiles() * col_tiles() * kTileScaleBytes; }

  // Where code (n, k) lives: fragment word `word` (u32 index into the code storage), slot 0..7.
  struct code_slot {
    int64_t word;
    int slot;
  };
  MXMOE_HD code_slot code_offset(int64_t n, int64_t k) const {
    const int64_t tile = (n / kTileRows) * col_tiles() + k / kTileCols;
    const int r = static_cast<int>(n % kTileRows), c = static_cast<int>(k % kTileCols);
    const int j = c / 16, cc = c % 16;
    const int g = r % 8, rh = r / 8, t = (cc % 8) / 2, hi = cc & 1, kh = cc / 8;
    const int lane = g * 4 + t;
    return {tile * kTileWords + lane * 4 + j, (rh + 2 * kh) + 4 * hi};
  }
  // Inverse over the padded storage; false for padding.
  MXMOE_HD bool code_coord(code_slot pos, int64_t* n, int64_t* k) const {
    const int64_t tile = pos.word / kTileWords;
    const int in = static_cast<int>(pos.word % kTileWords);
    const int lane = in / 4, j = in % 4;
    const int g = lane / 4, t = lane % 4, reg = pos.slot % 4, hi = pos.slot / 4;
    const int rh = reg % 2, kh = reg / 2;
    *n = (tile / col_tiles()) * kTileRows + g + 8 * rh;
    *k = (tile % col_tiles()) * kTileCols + j * 16 + kh * 8 + 2 * t + hi;
    return *n < rows && *k < cols;
  }
  MXMOE_HD int64_t scale_offset(int64_t n, int64_t kb) const {
    const int64_t tile = (n / kTileRows) * col_tiles() + kb / 2;
    const int r = static_cast<int>(n % kTileRows);
    return tile * kTileScaleBytes + (r % 8) * 4 + (kb % 2) * 2 + r / 8;
  }
  MXMOE_HD bool scale_coord(int64_t off, int64_t* n, int64_t* kb) const {
    const int64_t tile = off / kTileScaleBytes;
    const int in = static_cast<int>(off % kTileScaleBytes);
    *n = (tile / col_tiles()) * kTileRows + (in / 4) + 8 * (in % 2);
    *kb = (tile % col_tiles()) * 2 + (in % 4) / 2;
    return *n < rows && *kb < cols / mx::kBlockSize;
  }
};

// ---- GEMM1 row order in the kernel layout ------------------------------------------------
// Checkpoints store the fused gate/up weight [2I, H] either concatenated ([gate; up]) or
// interleaved (gpt-oss: row 2j gate j, row 2j+1 up j). The kernel layout orders rows so that
// kernel row R (tile R/16, r = R%16) holds gate (r < 8) or up (r >= 8) of output j = (R/16)*8 + r%8:
// an mma thread's accumulator rows g and g+8 are then gate and up of the same output.
enum class gate_up_order : uint8_t { concatenated, interleaved };

inline const char* to_string(gate_up_order o) {
  return o == gate_up_order::interleaved ? "interleaved" : "concatenated";
}

struct gate_up_rows {
  int64_t intermediate = 0;  // I; the fused weight has 2I rows
  gate_up_order order = gate_up_order::concatenated;
  // (output j, is_up) of a checkpoint row, and back.
  MXMOE_HD int64_t checkpoint_row(int64_t j, int is_up) const {
    return order == gate_up_order::interleaved ? 2 * j + is_up : is_up * intermediate + j;
  }
  MXMOE_HD void split_checkpoint_row(int64_t row, int64_t* j, int* is_up) const {
    if (order == gate_up_order::interleaved) {
      *j = row / 2;
      *is_up = static_cast<int>(row % 2);
    } else {
      *j = row % intermediate;
      *is_up = static_cast<int>(row / intermediate);
    }
  }
  MXMOE_HD int64_t kernel_row(int64_t j, int is_up) const { return (j / 8) * 16 + is_up * 8 + j % 8; }
  MXMOE_HD void split_kernel_row(int64_t row, int64_t* j, int* is_up) const {
    *j = (row / 16) * 8 + row % 8;
    *is_up = static_cast<int>((row % 16) / 8);
  }
  MXMOE_HD int64_t kernel_to_checkpoint(int64_t row) const {
    int64_t j;
    int u;
    split_kernel_row(row, &j, &u);
    return checkpoint_row(j, u);
  }
  MXMOE_HD int64_t checkpoint_to_kernel(int64_t row) const {
    int64_t j;
    int u;
    split_checkpoint_row(row, &j, &u);
    return kernel_row(j, u);
  }
};

// ---- expert matrices of BF16 checkpoints --------------------------------------------------
// How one expert's matrix W[N][K] (N outputs) lies in the bytes read for it from a BF16
// checkpoint (its pieces back to back), so that converters on every device reorder it the same:
//   row_major     [N, K] as is (Qwen3/DeepSeek down_proj.weight)
//   xw            [K, N], the x·W form of checkpoint_xw (gpt-oss gate_up_proj[e], down_proj[e])
//   gate_up_pair  gate [N/2, K] then up [N/2, K] (Qwen3/DeepSeek gate_proj, up_proj), read into
//                 the interleaved order of gate_up_rows (row 2j gate j, row 2j+1 up j)
enum class source_order : uint8_t { row_major, xw, gate_up_pair };

struct matrix_source {
  source_order order = source_order::row_major;
  int64_t rows = 0, cols = 0;  // N, K
  MXMOE_HD int64_t size() const { return rows * cols; }
  // Element index, in the bytes read, of W[n][k].
  MXMOE_HD int64_t offset(int64_t n, int64_t k) const {
    if (order == source_order::xw) return checkpoint_xw{1, rows, cols}.offset(0, n, k);
    if (order == source_order::gate_up_pair) {
      int64_t j;
      int is_up;
      pair_rows().split_checkpoint_row(n, &j, &is_up);
      return (is_up * (rows / 2) + j) * cols + k;
    }
    return n * cols + k;
  }
  // The inverse: W[n][k] held at element index `off` of the bytes read.
  MXMOE_HD void coord(int64_t off, int64_t* n, int64_t* k) const {
    if (order == source_order::xw) {
      int64_t e;
      checkpoint_xw{1, rows, cols}.coord(off, &e, n, k);
      return;
    }
    *k = off % cols;
    const int64_t row = off / cols;
    *n = order == source_order::gate_up_pair ? pair_rows().checkpoint_row(row % (rows / 2), static_cast<int>(row / (rows / 2)))
                                             : row;
  }

 private:
  MXMOE_HD gate_up_rows pair_rows() const { return {rows / 2, gate_up_order::interleaved}; }
};

// ---- activation rows in shared memory: the 128-byte swizzle ----------------------------------
// K-major bf16 rows of 64 elements (128 bytes): 16-byte chunk c (elements 8c..8c+7) of row r at
// byte r·128 + 16·(c XOR (r mod 8)) of the tile. It is the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B (CUDA driver API, cuTensorMapEncodeTiled), the 128-byte swizzling
// mode of the PTX ISA's wgmma shared-memory matrix layouts (the kernels' sw128_desc: 8-row atoms
// 1024 bytes apart), and conflict-free for ldmatrix. The hardware applies the XOR to address
// bits 4..6 with bits 7..9, so a tile starts 1024-byte aligned and rows r and r + 8 differ by
// 1024 bytes with the same chunk order.
struct sw128_rows {
  static constexpr int kRowBytes = 128, kChunkBytes = 16, kChunks = 8;
  MXMOE_HD static constexpr int offset(int r, int c) { return r * kRowBytes + ((c ^ (r & 7)) << 4); }
  // The inverse: the row and chunk held at byte `off` (a multiple of 16) of the tile.
  MXMOE_HD static constexpr void coord(int off, int* r, int* c) {
    *r = off / kRowBytes;
    *c = ((off % kRowBytes) >> 4) ^ (*r & 7);
  }
};

// ---- contiguous parts of n items over P ranks -------------------------------------------
// Part r holds items [begin(r), begin(r) + count(r)): n / P each, one more for the first n % P.
// Expert parallelism splits the E experts this way, tensor parallelism the I/32 blocks of I.
struct even_split {
  int64_t items = 0, parts = 1;
  MXMOE_HD int64_t count(int64_t r) const { return items / parts + (r < items % parts ? 1 : 0); }
  MXMOE_HD int64_t begin(int64_t r) const { return r * (items / parts) + (r < items % parts ? r : items % parts); }
  // Inverse: the part holding item i, and its index inside that part.
  MXMOE_HD int64_t part_of(int64_t i) const {
    const int64_t big = items / parts + 1, in_big = (items % parts) * big;
    return i < in_big ? i / big : items % parts + (i - in_big) / (items / parts);
  }
  MXMOE_HD int64_t index_in_part(int64_t i) const { return i - begin(part_of(i)); }
};

}  // namespace mxmoe::layout
