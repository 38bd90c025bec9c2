// Tests of include/mxmoe/layout.h: for every layout, on odd shapes, the inverse undoes every
// offset and the map is a bijection onto its storage (each slot hit once; padding slots are
// exactly those whose inverse returns false). A few offsets are pinned as literal numbers worked
// out by hand from the layouts' public descriptions (docs/formats.md: the gpt-oss checkpoint, the
// cuBLAS / CUTLASS 128x4 scale layout) and the PTX mma.m16n8k16 A-fragment description, so that a
// change of formula fails here even if it stays self-consistent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mxmoe/dtype.h"
#include "mxmoe/layout.h"
#include "mxmoe/mx.h"

namespace layout = mxmoe::layout;
namespace mx = mxmoe::mx;

namespace {

const int64_t kRows[] = {1, 31, 127, 129, 200, 257};
const int64_t kScaleCols[] = {1, 3, 5, 7, 90};
const int64_t kCols[] = {32, 96, 2880};

// Marks storage slots, failing on a slot hit twice.
class slot_tracker {
 public:
  explicit slot_tracker(int64_t slots) : hit_(static_cast<size_t>(slots), 0) {}
  ::testing::AssertionResult hit(int64_t slot) {
    if (slot < 0 || slot >= static_cast<int64_t>(hit_.size()))
      return ::testing::AssertionFailure() << "slot " << slot << " outside storage of " << hit_.size();
    if (hit_[static_cast<size_t>(slot)]++)
      return ::testing::AssertionFailure() << "slot " << slot << " hit twice";
    return ::testing::AssertionSuccess();
  }
  bool was_hit(int64_t slot) const { return hit_[static_cast<size_t>(slot)] != 0; }
  int64_t slots() const { return static_cast<int64_t>(hit_.size()); }

 private:
  std::vector<uint8_t> hit_;
};

// A 2-D layout whose storage of `size` slots may hold padding: every (m, k) in [0, rows) x [0, cols)
// gets a slot of its own from offset(), and coord() maps it back; every other slot is padding:
// coord() says so and gives a coordinate outside the data that offset() maps back to the same slot,
// which is then passed to `padding(m, k)` for the layout's own checks.
template <class Offset, class Coord, class Padding>
void check_padded_bijection(int64_t rows, int64_t cols, int64_t size, Offset offset, Coord coord, Padding padding) {
  slot_tracker slots(size);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t off = offset(m, k);
      ASSERT_TRUE(slots.hit(off));
      int64_t m2 = -1, k2 = -1;
      ASSERT_TRUE(coord(off, &m2, &k2));
      ASSERT_EQ(m2, m);
      ASSERT_EQ(k2, k);
    }
  for (int64_t off = 0; off < size; ++off) {
    int64_t m = -1, k = -1;
    const bool data = coord(off, &m, &k);
    ASSERT_EQ(data, slots.was_hit(off)) << "offset " << off;
    if (!data) {
      ASSERT_TRUE(m >= rows || k >= cols);
      ASSERT_EQ(offset(m, k), off);
      padding(m, k);
    }
  }
}

// ---- scale_linear ---------------------------------------------------------------------------

TEST(ScaleLinear, BijectionAndInverse) {
  for (int64_t rows : kRows)
    for (int64_t cols : kScaleCols) {
      const layout::scale_linear s{rows, cols};
      ASSERT_EQ(s.size(), rows * cols);
      slot_tracker slots(s.size());
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t k = 0; k < cols; ++k) {
          const int64_t off = s.offset(m, k);
          ASSERT_TRUE(slots.hit(off));
          int64_t m2 = -1, k2 = -1;
          s.coord(off, &m2, &k2);
          ASSERT_EQ(m2, m);
          ASSERT_EQ(k2, k);
        }
      for (int64_t off = 0; off < s.size(); ++off) ASSERT_TRUE(slots.was_hit(off));
    }
}

// ---- scale_tiled_128x4 ----------------------------------------------------------------------

TEST(ScaleTiled128x4, BijectionAndInverseWithPadding) {
  for (int64_t rows : kRows)
    for (int64_t cols : kScaleCols) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols);
      const layout::scale_tiled_128x4 s{rows, cols};
      ASSERT_EQ(s.padded_rows() % 128, 0);
      ASSERT_EQ(s.padded_cols() % 4, 0);
      ASSERT_GE(s.padded_rows(), rows);
      ASSERT_LT(s.padded_rows() - rows, 128);
      ASSERT_LT(s.padded_cols() - cols, 4);
      ASSERT_EQ(s.size(), s.padded_rows() * s.padded_cols());
      int64_t padding = 0;
      ASSERT_NO_FATAL_FAILURE(check_padded_bijection(
          rows, cols, s.size(), [&](int64_t m, int64_t k) { return s.offset(m, k); },
          [&](int64_t off, int64_t* m, int64_t* k) { return s.coord(off, m, k); },
          [&](int64_t m, int64_t k) {  // padding coordinates lie in the padded region
            ++padding;
            EXPECT_LT(m, s.padded_rows());
            EXPECT_LT(k, s.padded_cols());
          }));
      EXPECT_EQ(padding, s.size() - rows * cols);
    }
}

TEST(ScaleTiled128x4, PinnedOffsets) {
  // rows 200, cols 7: 2 row tiles, 2 column tiles, 2 * 2 * 512 = 2048 bytes.
  const layout::scale_tiled_128x4 s{200, 7};
  EXPECT_EQ(s.size(), 2048);
  // (130, 5): (130/128)*2*512 = 1024, (5/4)*512 = 512, (130%32)*16 = 32, ((130%128)/32)*4 = 0,
  // 5%4 = 1  ->  1569
  EXPECT_EQ(s.offset(130, 5), 1569);
  // (77, 2): 0 + 0 + 13*16 + 2*4 + 2 = 218
  EXPECT_EQ(s.offset(77, 2), 218);
  // (199, 6): 1024 + 512 + 7*16 + 2*4 + 2 = 1658
  EXPECT_EQ(s.offset(199, 6), 1658);
  // rows 300, cols 90: 23 column tiles. (257, 89): 2*23*512 = 23552, 22*512 = 11264, 1*16, 0, 1
  EXPECT_EQ((layout::scale_tiled_128x4{300, 90}.offset(257, 89)), 34833);
}

// ---- checkpoint_mxfp4 -----------------------------------------------------------------------

TEST(CheckpointMxfp4, BijectionAndInverse) {
  for (int64_t rows : kRows)
    for (int64_t cols : kCols) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " K " << cols);
      const layout::checkpoint_mxfp4 c{3, rows, cols};
      ASSERT_EQ(c.block_bytes(), 3 * rows * cols / 2);
      ASSERT_EQ(c.scale_bytes(), 3 * rows * cols / 32);
      slot_tracker codes(c.block_bytes() * 2), scales(c.scale_bytes());
      for (int64_t e = 0; e < 3; ++e)
        for (int64_t n = 0; n < rows; ++n) {
          for (int64_t k = 0; k < cols; ++k) {
            const layout::nibble_pos p = c.code_offset(e, n, k);
            ASSERT_TRUE(codes.hit(p.byte * 2 + p.high));
            int64_t e2 = -1, n2 = -1, k2 = -1;
            c.code_coord(p, &e2, &n2, &k2);
            ASSERT_EQ(e2, e);
            ASSERT_EQ(n2, n);
            ASSERT_EQ(k2, k);
          }
          for (int64_t kb = 0; kb < cols / 32; ++kb) {
            const int64_t off = c.scale_offset(e, n, kb);
            ASSERT_TRUE(scales.hit(off));
            int64_t e2 = -1, n2 = -1, kb2 = -1;
            c.scale_coord(off, &e2, &n2, &kb2);
            ASSERT_EQ(e2, e);
            ASSERT_EQ(n2, n);
            ASSERT_EQ(kb2, kb);
          }
        }
      for (int64_t s = 0; s < codes.slots(); ++s) ASSERT_TRUE(codes.was_hit(s));
      for (int64_t s = 0; s < scales.slots(); ++s) ASSERT_TRUE(scales.was_hit(s));
    }
}

TEST(CheckpointMxfp4, PinnedOffsets) {
  // 2 experts, 3 rows, K = 64: 32 bytes and 2 scales per row.
  const layout::checkpoint_mxfp4 c{2, 3, 64};
  // (e 1, n 2, k 5): row (1*3 + 2) = 5 -> byte 5*32 + 5/2 = 162, odd k -> high nibble
  EXPECT_EQ(c.code_offset(1, 2, 5).byte, 162);
  EXPECT_EQ(c.code_offset(1, 2, 5).high, 1);
  EXPECT_EQ(c.code_offset(1, 2, 4).high, 0);
  // (e 1, n 2, kb 1): 5*2 + 1 = 11
  EXPECT_EQ(c.scale_offset(1, 2, 1), 11);
}

// ---- checkpoint_xw ----------------------------------------------------------------------------

TEST(CheckpointXw, BijectionAndInverse) {
  for (int64_t rows : kRows)
    for (int64_t cols : kCols) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " K " << cols);
      const layout::checkpoint_xw c{3, rows, cols};
      ASSERT_EQ(c.size(), 3 * rows * cols);
      slot_tracker slots(c.size());
      for (int64_t e = 0; e < 3; ++e)
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t k = 0; k < cols; ++k) {
            const int64_t off = c.offset(e, n, k);
            ASSERT_TRUE(slots.hit(off));
            int64_t e2 = -1, n2 = -1, k2 = -1;
            c.coord(off, &e2, &n2, &k2);
            ASSERT_EQ(e2, e);
            ASSERT_EQ(n2, n);
            ASSERT_EQ(k2, k);
          }
      for (int64_t s = 0; s < slots.slots(); ++s) ASSERT_TRUE(slots.was_hit(s));
    }
}

// ---- matrix_source -----------------------------------------------------------------------------

TEST(MatrixSource, BijectionAndInverseForEveryOrder) {
  for (layout::source_order order : {layout::source_order::row_major, layout::source_order::xw,
                                     layout::source_order::gate_up_pair})
    for (int64_t rows : kRows)
      for (int64_t cols : kCols) {
        SCOPED_TRACE(testing::Message() << "order " << static_cast<int>(order) << " rows " << rows << " K " << cols);
        if (order == layout::source_order::gate_up_pair && rows % 2) continue;  // gate and up rows in pairs
        const layout::matrix_source m{order, rows, cols};
        slot_tracker slots(m.size());
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t k = 0; k < cols; ++k) {
            const int64_t off = m.offset(n, k);
            ASSERT_TRUE(slots.hit(off));
            int64_t n2 = -1, k2 = -1;
            m.coord(off, &n2, &k2);
            ASSERT_EQ(n2, n);
            ASSERT_EQ(k2, k);
          }
        for (int64_t s = 0; s < slots.slots(); ++s) ASSERT_TRUE(slots.was_hit(s));
      }
}

TEST(MatrixSource, GateUpPairReadsGateThenUpInterleaved) {
  // gate [2, 3] then up [2, 3]: W row 0 = gate 0 at 0, row 1 = up 0 at 6, row 2 = gate 1 at 3.
  const layout::matrix_source m{layout::source_order::gate_up_pair, 4, 3};
  EXPECT_EQ(m.offset(0, 0), 0);
  EXPECT_EQ(m.offset(1, 0), 6);
  EXPECT_EQ(m.offset(2, 1), 4);
  EXPECT_EQ(m.offset(3, 2), 11);
  const layout::matrix_source xw{layout::source_order::xw, 4, 3};  // [K = 3, N = 4]
  EXPECT_EQ(xw.offset(1, 2), 2 * 4 + 1);
}

TEST(CheckpointXw, PinnedOffsets) {
  // gpt-oss gate_up_proj [E, H, 2I] with E = 2, H = 3 (K), 2I = 4 (N): W[n][k] is x·W's [k][n].
  const layout::checkpoint_xw c{2, 4, 3};
  EXPECT_EQ(c.offset(0, 0, 0), 0);
  EXPECT_EQ(c.offset(0, 1, 0), 1);   // the next output is the next element of a row of x·W
  EXPECT_EQ(c.offset(0, 0, 1), 4);   // the next input is the next row: N elements on
  EXPECT_EQ(c.offset(1, 3, 2), 23);  // (1*3 + 2)*4 + 3
}

// ---- sm90_fragment --------------------------------------------------------------------------

TEST(Sm90Fragment, CodeBijectionAndInverse) {
  for (int64_t rows : kRows)
    for (int64_t cols : kCols) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " K " << cols);
      const layout::sm90_fragment f{rows, cols};
      ASSERT_EQ(f.weight_bytes(), layout::ceil_div(rows, 16) * layout::ceil_div(cols, 64) * 512);
      ASSERT_EQ(f.weight_words() * 4, f.weight_bytes());
      slot_tracker slots(f.weight_words() * 8);
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t k = 0; k < cols; ++k) {
          const layout::sm90_fragment::code_slot p = f.code_offset(n, k);
          ASSERT_TRUE(p.slot >= 0 && p.slot < 8) << n << "," << k;
          ASSERT_TRUE(slots.hit(p.word * 8 + p.slot)) << n << "," << k;
          int64_t n2 = -1, k2 = -1;
          ASSERT_TRUE(f.code_coord(p, &n2, &k2));
          ASSERT_EQ(n2, n);
          ASSERT_EQ(k2, k);
        }
      for (int64_t s = 0; s < slots.slots(); ++s) {
        int64_t n = -1, k = -1;
        const layout::sm90_fragment::code_slot p{s / 8, static_cast<int>(s % 8)};
        const bool data = f.code_coord(p, &n, &k);
        ASSERT_EQ(data, slots.was_hit(s)) << "slot " << s;
        if (!data) {  // padding: inside the padded tile grid, and maps back to this slot
          ASSERT_TRUE(n >= rows || k >= cols);
          const layout::sm90_fragment::code_slot back = f.code_offset(n, k);
          ASSERT_EQ(back.word, p.word);
          ASSERT_EQ(back.slot, p.slot);
        }
      }
    }
}

TEST(Sm90Fragment, ScaleBijectionAndInverse) {
  for (int64_t rows : kRows)
    for (int64_t cols : kCols) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " K " << cols);
      const layout::sm90_fragment f{rows, cols};
      ASSERT_NO_FATAL_FAILURE(check_padded_bijection(
          rows, cols / 32, f.scale_bytes(), [&](int64_t n, int64_t kb) { return f.scale_offset(n, kb); },
          [&](int64_t off, int64_t* n, int64_t* kb) { return f.scale_coord(off, n, kb); }, [](int64_t, int64_t) {}));
    }
}

// The PTX ISA's mma.m16n8k16 A fragment (bf16): lane L, g = L/4, t = L%4 holds four .b32
// registers a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9],
// a3 = A[g+8][2t+8..2t+9]. layout.h stores lane L's k16 step j as the fragment word 4L + j of
// its tile with register r's two elements in slots r and r+4.
TEST(Sm90Fragment, MatchesTheMmaAFragment) {
  const layout::sm90_fragment f{32, 128};  // 2 x 2 tiles
  // Literal positions, worked by hand:
  // (n 9, k 19): tile 0; row 9 = g 1 + 8 -> a1 or a3; k 19 = step 1, column 3 = 2t+1 with t = 1
  // -> a1, second element -> slot 1 + 4 = 5; lane 1*4 + 1 = 5 -> word 5*4 + 1 = 21
  EXPECT_EQ(f.code_offset(9, 19).word, 21);
  EXPECT_EQ(f.code_offset(9, 19).slot, 5);
  // (n 20, k 75): tile (1, 1) = 3 -> word 384; row 4 = g 4; k 11 in step 0 = 2t+8+1 with t = 1
  // -> a2, second element -> slot 6; lane 17 -> 384 + 68 + 0 = 452
  EXPECT_EQ(f.code_offset(20, 75).word, 452);
  EXPECT_EQ(f.code_offset(20, 75).slot, 6);
  // (n 0, k 0): lane 0, a0 first element -> word 0, slot 0
  EXPECT_EQ(f.code_offset(0, 0).word, 0);
  EXPECT_EQ(f.code_offset(0, 0).slot, 0);
  // (n 15, k 63): tile 0, g 7 t 3 -> lane 31, step 3, a3 second element (slot 7) -> word 127
  EXPECT_EQ(f.code_offset(15, 63).word, 127);
  EXPECT_EQ(f.code_offset(15, 63).slot, 7);

  // Every position of a tile, from the fragment description.
  for (int lane = 0; lane < 32; ++lane)
    for (int step = 0; step < 4; ++step)
      for (int reg = 0; reg < 4; ++reg)
        for (int half = 0; half < 2; ++half) {
          const int g = lane / 4, t = lane % 4;
          const int64_t row = g + 8 * (reg % 2), col = 16 * step + 2 * t + 8 * (reg / 2) + half;
          const layout::sm90_fragment::code_slot p = f.code_offset(16 + row, 64 + col);  // tile 3
          EXPECT_EQ(p.word, 3 * 128 + 4 * lane + step) << lane << " " << step << " " << reg;
          EXPECT_EQ(p.slot, reg + 4 * half);
        }
  // Scales: lane L reads the u32 at tile byte 4g = bytes (g, kb0), (g+8, kb0), (g, kb1), (g+8, kb1).
  // (n 9, kb 3): tile 1 -> 32; g 1 -> 4; (g+8, kb1) is byte 3 -> 39
  EXPECT_EQ(f.scale_offset(9, 3), 39);
  for (int g = 0; g < 8; ++g)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f.scale_offset(16 + g + 8 * (i % 2), 2 + i / 2), 3 * 32 + 4 * g + i);
}

// End to end with the kernels' conversion: codes placed with code_offset and packed into fragment
// words (mx::fragment_word_pack), read back per lane and register with
// mx::fragment_bf16x2_pow2m126 and scaled, give mx::dequantize_value of W[row][col] (low half)
// and W[row][col+1] (high half) for every code and scale byte of a matrix with partial row and
// column tiles; padding slots hold code 0.
TEST(Sm90Fragment, FastConversionReadsTheFragment) {
  const int64_t rows = 40, cols = 160;
  const layout::sm90_fragment f{rows, cols};
  std::mt19937 gen(2);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols)), scales(static_cast<size_t>(rows * cols / 32));
  for (auto& c : codes) c = static_cast<uint8_t>(gen() & 0xF);
  for (auto& s : scales) s = static_cast<uint8_t>(gen() % 255);  // every finite scale byte
  // Pack the storage word by word from the inverse map, as the repack kernel does.
  std::vector<uint32_t> words(static_cast<size_t>(f.weight_words()));
  for (int64_t w = 0; w < f.weight_words(); ++w) {
    uint8_t slot_codes[8];
    for (int s = 0; s < 8; ++s) {
      int64_t n, k;
      slot_codes[s] = f.code_coord({w, s}, &n, &k) ? codes[static_cast<size_t>(n * cols + k)] : 0;
    }
    words[static_cast<size_t>(w)] = mx::fragment_word_pack(slot_codes);
  }
  const float pow2_126 = mxmoe::bf16_to_float(mx::kBf16Pow2_126);
  for (int64_t tile = 0; tile < f.row_tiles() * f.col_tiles(); ++tile)
    for (int lane = 0; lane < 32; ++lane)
      for (int step = 0; step < 4; ++step) {
        const uint32_t word = words[static_cast<size_t>(tile * 128 + 4 * lane + step)];
        for (int reg = 0; reg < 4; ++reg) {
          const uint32_t pair = mx::fragment_bf16x2_pow2m126(word, reg);
          const int64_t row = (tile / f.col_tiles()) * 16 + lane / 4 + 8 * (reg % 2);
          const int64_t col = (tile % f.col_tiles()) * 64 + 16 * step + 2 * (lane % 4) + 8 * (reg / 2);
          for (int half = 0; half < 2; ++half) {
            const uint16_t h = static_cast<uint16_t>(pair >> (16 * half));
            if (row >= rows || col + half >= cols) {
              ASSERT_EQ(h, 0u) << "padding at " << row << "," << col + half;
              continue;
            }
            const uint8_t c = codes[static_cast<size_t>(row * cols + col + half)];
            const uint8_t s = scales[static_cast<size_t>((row * cols + col + half) / 32)];
            const float got = mxmoe::bf16_to_float(h) * pow2_126 * mxmoe::bf16_to_float(mx::e8m0_to_bf16_bits(s));
            const float want = mx::dequantize_value(c, s);
            if (std::isinf(want)) {
              ASSERT_EQ(got, want) << row << "," << col + half;
            } else {
              ASSERT_EQ(mx::float_bits(got), mx::float_bits(want)) << row << "," << col + half << " scale " << int(s);
            }
          }
        }
      }
}

// ---- gate_up_rows ---------------------------------------------------------------------------

TEST(GateUpRows, BijectionAndInverseBothOrders) {
  for (layout::gate_up_order order : {layout::gate_up_order::concatenated, layout::gate_up_order::interleaved})
    for (int64_t inter : {1, 7, 8, 9, 31, 100, 360, 2880}) {
      SCOPED_TRACE(testing::Message() << layout::to_string(order) << " I " << inter);
      const layout::gate_up_rows g{inter, order};
      const int64_t kernel_rows = layout::round_up(inter, 8) * 2;
      slot_tracker checkpoint(2 * inter), kernel(kernel_rows);
      for (int64_t j = 0; j < inter; ++j)
        for (int up = 0; up < 2; ++up) {
          const int64_t c = g.checkpoint_row(j, up), k = g.kernel_row(j, up);
          ASSERT_TRUE(checkpoint.hit(c));
          ASSERT_TRUE(kernel.hit(k));
          int64_t j2 = -1;
          int up2 = -1;
          g.split_checkpoint_row(c, &j2, &up2);
          ASSERT_EQ(j2, j);
          ASSERT_EQ(up2, up);
          g.split_kernel_row(k, &j2, &up2);
          ASSERT_EQ(j2, j);
          ASSERT_EQ(up2, up);
          ASSERT_EQ(g.kernel_to_checkpoint(k), c);
          ASSERT_EQ(g.checkpoint_to_kernel(c), k);
          // An mma thread's accumulator rows g and g+8 of one 16-row tile: gate and up of output j.
          if (up == 0) {
            ASSERT_EQ(g.kernel_row(j, 1), k + 8);
          }
        }
      for (int64_t r = 0; r < 2 * inter; ++r) ASSERT_TRUE(checkpoint.was_hit(r));
      for (int64_t r = 0; r < kernel_rows; ++r) {
        int64_t j = -1;
        int up = -1;
        g.split_kernel_row(r, &j, &up);
        ASSERT_EQ(j < inter, kernel.was_hit(r)) << "kernel row " << r << " (padding iff j >= I)";
      }
    }
}

TEST(GateUpRows, PinnedRows) {
  const layout::gate_up_rows inter{10, layout::gate_up_order::interleaved};
  const layout::gate_up_rows concat{10, layout::gate_up_order::concatenated};
  EXPECT_EQ(inter.checkpoint_row(3, 1), 7);    // gpt-oss: row 2j+1 is up j
  EXPECT_EQ(concat.checkpoint_row(3, 1), 13);  // [gate; up]: I + j
  EXPECT_EQ(inter.kernel_row(9, 1), 25);       // tile 1 (outputs 8..15), up half, row 8 + 1
  EXPECT_EQ(inter.kernel_row(3, 0), 3);
  EXPECT_EQ(inter.kernel_to_checkpoint(11), 7);   // kernel row 11 = up of output 3
  EXPECT_EQ(concat.kernel_to_checkpoint(11), 13);
}

// ---- even_split -----------------------------------------------------------------------------

TEST(Sw128Rows, BijectionAndInverse) {
  const int rows = 176;  // the widest prefill tile: 22 swizzle atoms
  slot_tracker slots(rows * layout::sw128_rows::kChunks);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < layout::sw128_rows::kChunks; ++c) {
      const int off = layout::sw128_rows::offset(r, c);
      ASSERT_EQ(off % layout::sw128_rows::kChunkBytes, 0);
      ASSERT_TRUE(slots.hit(off / layout::sw128_rows::kChunkBytes)) << r << "," << c;
      int r2 = -1, c2 = -1;
      layout::sw128_rows::coord(off, &r2, &c2);
      ASSERT_EQ(r2, r);
      ASSERT_EQ(c2, c);
      // the atom repeats every 8 rows, 1024 bytes further
      ASSERT_EQ(layout::sw128_rows::offset(r + 8, c), off + 1024);
    }
  for (int s = 0; s < slots.slots(); ++s) ASSERT_TRUE(slots.was_hit(s)) << s;
}

// CU_TENSOR_MAP_SWIZZLE_128B: within each 128-byte row, 16-byte chunk index bits are XORed with
// the row index mod 8 (address bits 4..6 ^= bits 7..9).
TEST(Sw128Rows, PinnedOffsets) {
  EXPECT_EQ(layout::sw128_rows::offset(0, 0), 0);
  EXPECT_EQ(layout::sw128_rows::offset(0, 7), 0b111'0000);
  EXPECT_EQ(layout::sw128_rows::offset(1, 0), 0b1'001'0000);      // row 1, chunk 0 ^ 1
  EXPECT_EQ(layout::sw128_rows::offset(3, 5), 0b11'110'0000);     // row 3, chunk 5 ^ 3 = 6
  EXPECT_EQ(layout::sw128_rows::offset(7, 7), 0b111'000'0000);    // row 7, chunk 7 ^ 7 = 0
  EXPECT_EQ(layout::sw128_rows::offset(13, 2), 0b1101'111'0000);  // row 13, chunk 2 ^ 5 = 7
}

TEST(EvenSplit, PartsTileTheItemsAndInvert) {
  for (int64_t items : {1, 5, 17, 90, 384, 385})
    for (int64_t parts : {1, 2, 3, 7, 8, 64}) {
      const layout::even_split s{items, parts};
      int64_t next = 0;
      for (int64_t r = 0; r < parts; ++r) {
        ASSERT_EQ(s.begin(r), next) << items << " over " << parts << ", part " << r;
        ASSERT_LE(s.count(r), items / parts + 1);
        ASSERT_GE(s.count(r), items / parts);
        if (r > 0) {
          ASSERT_LE(s.count(r), s.count(r - 1)) << "the remainder goes to the first parts";
        }
        for (int64_t j = 0; j < s.count(r); ++j) {
          ASSERT_EQ(s.part_of(next + j), r);
          ASSERT_EQ(s.index_in_part(next + j), j);
        }
        next += s.count(r);
      }
      ASSERT_EQ(next, items);
    }
}

TEST(EvenSplit, PinnedParts) {
  const layout::even_split blocks{2880 / 32, 8};  // gpt-oss I over 8 ranks: 90 blocks
  EXPECT_EQ(blocks.count(0), 12);
  EXPECT_EQ(blocks.count(1), 12);
  EXPECT_EQ(blocks.count(2), 11);
  EXPECT_EQ(blocks.begin(2), 24);
  EXPECT_EQ(blocks.begin(7), 79);
  EXPECT_EQ(blocks.part_of(89), 7);
  const layout::even_split experts{384, 3};
  EXPECT_EQ(experts.begin(2), 256);
  EXPECT_EQ(experts.part_of(255), 1);
}

}  // namespace
