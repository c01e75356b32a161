// matmul_nbits.h: the C++ core of MatMulNBits, accuracy levels 0-4: the weight as the kernels read it, code decoding, and the two drivers.
//
// The Python front end (src/quantmatmul/matmul_nbits.py) validates and normalizes the inputs: codes
// stay in ONNX Runtime's layout (one LSB-first bitstream per output column, src/quantmatmul/
// nbits_layout.py); scales arrive as float32 [N, k_blocks]; integer zero points (packed or
// default) unpacked to uint8 [N, k_blocks], float ones as float32 [N, k_blocks]; g_idx as int32 [K]
// or null (a trivial one is dropped); A as float32 [M, K], already rounded for levels 2 and 3.
//
// matmul_nbits_f32 serves levels 0-3 (float32 products; W rounded to float16 / bfloat16 in the
// kernels at levels 2 and 3) and level 4 with a g_idx (the front end passes A dequantized from
// its int8 form); matmul_nbits_int8 serves level 4 without one (A quantized to int8 here). Both
// split the columns across the thread pool and run the active kernel table's entries (qgemm.h):
// kernels/qgemm_portable.cpp, kernels/nbits_f32_avx2.cpp and kernels/nbits_int8_avx2.cpp, or (level 4)
// kernels/nbits_int8_avx512vnni.cpp and kernels/nbits_int8_amx.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "buffer.h"

namespace qmm {

// The operands of the float product: float32 (levels 0 and 1), or A and W rounded to float16
// (level 2) or bfloat16 (level 3), nearest even, the products and sums still float32.
enum class NBitsOperands : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct NBitsPacked;

struct NBitsWeight {
  const uint8_t* codes;  // [N, row_bytes]: row n holds k_blocks * block_size codes of `bits` bits
  int64_t N, K, bits, block_size, k_blocks, row_bytes;
  const float* scales;  // [N, k_blocks]
  // Zero points [N, k_blocks]: integer ones as uint8 (the usual case: packed or default zero
  // points, a quarter of the bytes), float ones as float32. Exactly one of the two is set.
  const float* zero_points;
  const uint8_t* zero_points_u8;
  NBitsOperands operands = NBitsOperands::kFloat32;  // how the dequantized W enters the product
  // Levels 0-3: g_idx[k] in [0, k_blocks), the block whose scale and zero point code k takes, or
  // null for k / block_size. A non-trivial g_idx does not factor by block: the kernels dequantize.
  const int32_t* g_idx = nullptr;
  // Levels 0, 1 and 4: the same weight repacked once for one entry's kernels (below), or null. An
  // entry reads it only where the layout is its own for the level (nbits_layout: int8_layout,
  // f32_layout); else it reads codes.
  const NBitsPacked* packed = nullptr;
};

// A layout an entry's kernels read a constant weight in, packed once (MatMulNBits does it when
// constructed, at the levels whose kernels read it), in panels of `panel_columns` columns: the
// codes, and per panel `panel_floats` float32 of per-block data the kernels would otherwise build
// from the scales and zero points on every call (the weight's own scales and zero points stay
// where they are: the GEMM paths read them).
struct NBitsLayout {
  const char* name;
  int64_t panel_columns;
  // Bytes of packed codes for w; 0 where the layout does not take w (its kernels read w.codes).
  int64_t (*packed_bytes)(const NBitsWeight& w);
  // Panels [p0, p1) of w's codes into codes and their per-block data into floats (each at panel p0's place).
  void (*pack)(const NBitsWeight& w, int64_t p0, int64_t p1, uint8_t* codes, float* floats);
  int64_t (*panel_floats)(const NBitsWeight& w);
  // The inverse for the codes: w's rows (w.codes' layout, N x row_bytes) from the packed codes,
  // bit for bit (codes past K included), so a holder may keep only the packed form.
  void (*unpack)(const NBitsWeight& w, const uint8_t* packed_codes, uint8_t* codes);
  // And the scales [N, k_blocks] and zero points [N, k_blocks] (uint8 or float32, as packed) of the
  // packed weight w.packed, exactly.
  void (*unpack_floats)(const NBitsWeight& w, float* scales, void* zero_points);
};

struct NBitsPacked {
  const NBitsLayout* layout;
  const uint8_t* codes;  // packed_bytes(w)
  const float* floats;  // panel_floats(w) per panel
  // Integer zero points (held as uint8 in the panels) or float ones: the weight's own scales and
  // zero points need not be passed with a packed weight (MatMulNBits holds only the packed form).
  bool u8_zero_points;
};

// The layout of the x86 entries' level-4 kernels (avx2, avx512_vnni and the AMX entries, which run
// the VNNI kernels on few rows), "quads x16": panels of 16 columns; per panel, per block, per quad
// of k (k = 4q .. 4q+3 of the block) 64 bytes,
//   byte 4c + i = the code of column c at k = 4q + i,
// each code S bits wide (quads_storage_bits: S = 2 for 2-bit codes, 4 for 3- and 4-bit, 8 for 5- to
// 8-bit), a group of 8 / S consecutive quads sharing one 64-byte run (quad j of the group in bits
// [S j, S j + S) of each byte); 8-bit codes held as c ^ 0x80 (c - 128 as int8). A panel's blocks
// follow each other. A shift and a mask give one quad of codes of 16 columns (an AVX2 kernel reads
// the run as two halves of 8 columns), which one broadcast of four int8 of A meets in
// vpmaddubsw / vpdpbusd: each column's block sum comes out in its own int32 lane. Block sizes up
// to 4096 (every int32 block sum stays below 2^31), no g_idx. Packed by portable code (matmul_nbits.cpp).
extern const NBitsLayout kNBitsQuads16;
constexpr int64_t kQuadsPanel = 16;
static inline int64_t quads_storage_bits(int64_t bits) { return bits == 2 ? 2 : bits <= 4 ? 4 : 8; }
// Bytes of one panel's codes per block: block_size / 4 quads x 64 bytes x S / 8.
static inline int64_t quads_block_bytes(const NBitsWeight& w) { return w.block_size * quads_storage_bits(w.bits) * 2; }
// A panel of the layout as its kernels read it: the codes (k_blocks runs of quads_block_bytes), and
// per block the 16 columns' scales and zero points (integer ones as uint8, float ones as float32;
// the kernels form scale * zero point, one float32 product), [k_blocks][16] each, zeros past N: the
// panel's floats (packed with the codes). They are the weight's scales and zero points exactly, so
// a packed weight needs no other copy of them (NBitsLayout::unpack_floats gives them back).
struct QuadsPanel {
  const uint8_t* codes;
  const float* scales;
  const float* float_zero_points;  // or null, and then:
  const uint8_t* zero_points;  // [k_blocks][16] uint8 (integer zero points: 1 byte per block and column, not 4)
};
// The per-block data of columns [n0, n0 + 16) from w's scales and zero points, into scales and
// float_zero_points ([k_blocks][16] each; integer zero points converted), or with zero_points given
// and integer zero points in w, into scales and zero_points: packed once with the codes (built per
// call it took more than half of a one-row call's time on AVX-512: a column-strided gather per
// panel), and built for panels made on the fly from codes as they are.
static inline void quads_block_data(const NBitsWeight& w, int64_t n0, float* scales, float* float_zero_points,
                                    uint8_t* zero_points = nullptr) {
  const int64_t kb = w.k_blocks, cols = w.N - n0 < kQuadsPanel ? w.N - n0 : kQuadsPanel;  // no std::min: kernel files
  for (int64_t c = 0; c < kQuadsPanel; ++c) {  // each column's row of scales and zero points in order
    const float* s = w.scales + (n0 + c) * kb;
    if (c >= cols) {
      for (int64_t b = 0; b < kb; ++b) {
        scales[b * kQuadsPanel + c] = 0.0f;
        if (zero_points && w.zero_points_u8) zero_points[b * kQuadsPanel + c] = 0;
        else float_zero_points[b * kQuadsPanel + c] = 0.0f;
      }
    } else if (w.zero_points_u8 && zero_points) {
      const uint8_t* z = w.zero_points_u8 + (n0 + c) * kb;
      for (int64_t b = 0; b < kb; ++b) {
        scales[b * kQuadsPanel + c] = s[b];
        zero_points[b * kQuadsPanel + c] = z[b];
      }
    } else if (w.zero_points_u8) {
      const uint8_t* z = w.zero_points_u8 + (n0 + c) * kb;
      for (int64_t b = 0; b < kb; ++b) {
        scales[b * kQuadsPanel + c] = s[b];
        float_zero_points[b * kQuadsPanel + c] = static_cast<float>(z[b]);
      }
    } else {
      const float* z = w.zero_points + (n0 + c) * kb;
      for (int64_t b = 0; b < kb; ++b) {
        scales[b * kQuadsPanel + c] = s[b];
        float_zero_points[b * kQuadsPanel + c] = z[b];
      }
    }
  }
}
// The codes of panel p of w.packed.
static inline const uint8_t* quads_panel_codes(const NBitsWeight& w, int64_t p) {
  return w.packed->codes + p * w.k_blocks * quads_block_bytes(w);
}
// Whether w's zero points are integers (uint8): from the packed form where there is one (the
// weight's own arrays may be absent then), else from w's arrays.
static inline bool u8_zero_points(const NBitsWeight& w) {
  return w.packed ? w.packed->u8_zero_points : w.zero_points_u8 != nullptr;
}
// Floats per panel of w.packed: 16 scales per block, then 16 float zero points or 16 uint8 zero
// points (4 floats' room) per block, rounded up to 64 bytes so that every panel's data is 64-byte
// aligned.
static inline int64_t quads_panel_floats(const NBitsWeight& w) {
  const int64_t floats = kQuadsPanel * w.k_blocks + (u8_zero_points(w) ? 4 : kQuadsPanel) * w.k_blocks;
  return (floats + 15) / 16 * 16;
}
// Panel p of w.packed: its codes and per-block data.
static inline QuadsPanel quads_panel(const NBitsWeight& w, int64_t p) {
  const float* const scales = w.packed->floats + p * quads_panel_floats(w);
  const float* const rest = scales + kQuadsPanel * w.k_blocks;
  if (u8_zero_points(w)) return {quads_panel_codes(w, p), scales, nullptr, reinterpret_cast<const uint8_t*>(rest)};
  return {quads_panel_codes(w, p), scales, rest, nullptr};
}
// Block b of column n: its scale and zero point (as float32), from w's arrays, or from the panel
// of a weight packed in kNBitsQuads16 (the same values; such a weight may come without the arrays).
static inline void block_scale_and_zero_point(const NBitsWeight& w, int64_t n, int64_t b, float& scale, float& zp) {
  if (w.packed && w.packed->layout == &kNBitsQuads16) {
    const QuadsPanel panel = quads_panel(w, n / kQuadsPanel);
    const int64_t at = b * kQuadsPanel + n % kQuadsPanel;
    scale = panel.scales[at];
    zp = panel.zero_points ? static_cast<float>(panel.zero_points[at]) : panel.float_zero_points[at];
    return;
  }
  scale = w.scales[n * w.k_blocks + b];
  zp = w.zero_points_u8 ? static_cast<float>(w.zero_points_u8[n * w.k_blocks + b]) : w.zero_points[n * w.k_blocks + b];
}
// The GEMMs' per-block data of columns [n0, n0 + cols): sb[b * stride + c] = the scale and
// szb[b * stride + c] = scale * (zero point - offset), one float32 product (offset: 128 where the
// 8-bit codes enter as c - 128, else 0); columns past cols untouched.
static inline void block_scales(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t stride, float offset, float* sb,
                                float* szb) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t b = 0; b < w.k_blocks; ++b) {
      float scale, zp;
      block_scale_and_zero_point(w, n0 + c, b, scale, zp);
      sb[b * stride + c] = scale;
      szb[b * stride + c] = scale * (zp - offset);
    }
}

// Helpers kernel files share are static inline (see requantize.h).
// x rounded to float16 or bfloat16 (nearest even; float16 overflows to infinity, NaN stays NaN) and
// back, as numpy's / ml_dtypes' astype do; x itself for float32. Scalar: kernels vectorize their own.
static inline float round_operand(float x, NBitsOperands operands) {
  if (operands == NBitsOperands::kFloat32 || std::isnan(x)) return x;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (operands == NBitsOperands::kBFloat16) {
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  } else {
    const float a = std::fabs(x);
    if (a >= 65520.0f) return std::copysign(INFINITY, x);  // at or past max + half an ulp
    if (a < 6.103515625e-05f) return std::copysign(std::ldexp(std::nearbyint(std::ldexp(a, 24)), -24), x);  // subnormal
    bits = (bits + 0xFFFu + ((bits >> 13) & 1u)) & 0xFFFFE000u;  // 10 mantissa bits, nearest even
  }
  std::memcpy(&x, &bits, 4);
  return x;
}

// The zero point of block `index` (= n * k_blocks + b) as float32.
static inline float zero_point(const NBitsWeight& w, int64_t index) {
  return w.zero_points_u8 ? static_cast<float>(w.zero_points_u8[index]) : w.zero_points[index];
}

// Sets code k of one LSB-first bitstream of `bits`-bit codes (the inverse of decode_nbits; the
// row's bits there start at zero).
static inline void encode_nbits_code(uint8_t* row, int64_t bits, int64_t k, unsigned code) {
  for (int64_t i = 0; i < bits; ++i) {
    const int64_t bit = k * bits + i;
    row[bit / 8] = static_cast<uint8_t>(row[bit / 8] | (((code >> i) & 1u) << (bit % 8)));
  }
}

// Writes the first `count` codes of one LSB-first bitstream as bytes.
void decode_nbits(const uint8_t* row, int64_t bits, int64_t count, uint8_t* out);
// Writes codes first .. first+count-1 of one LSB-first bitstream as bytes.
void decode_nbits_range(const uint8_t* row, int64_t bits, int64_t first, int64_t count, uint8_t* out);

// Y[m, n] = sum_k A[m, k] * W[k, n] (+ bias[n]) with W[k, n] = float32(q - zero_point) * scale, every
// operation in float32 (level 0/1; docs/matmul_nbits.md bounds the error of any summation order).
// A is [M, K], Y is [M, N], bias may be null. Columns are split across the thread pool.
void matmul_nbits_f32(const float* A, int64_t M, const NBitsWeight& w, const float* bias, float* Y);

// Level 4: A quantized per row and per block of block_size exactly as ONNX Runtime does
// (QuantizeARow_CompInt8: scale = max|a| / 127, qa = round_half_even(a * (127 / max|a|)) in float32;
// a block whose 127 / max|a| overflows uses the exact ratio; a block holding NaN or infinity gets
// qa = 0 and a NaN scale). qa is [M, k_blocks * block_size] (zero past K), scale and block_sum
// (= scale * sum qa) are [M, k_blocks].
struct QuantizedA {
  const int8_t* qa;
  const float* scale;
  const float* block_sum;
  int64_t M, padded_K;
};
// Rows [m0, m1) of A quantized as quantize_a_int8 does (qa, scale and block_sum at row 0's place).
using NBitsQuantizeA = void (*)(const float* A, int64_t m0, int64_t m1, int64_t K, int64_t block_size, int8_t* qa,
                                float* scale, float* block_sum);
// The portable rows, and its one block of count values (count <= block_size; q padded with zeros
// to block_size): for the SIMD rows' uncommon blocks (not finite, or max|a| so small that 127 /
// max|a| overflows float32).
void quantize_a_int8_rows(const float* A, int64_t m0, int64_t m1, int64_t K, int64_t block_size, int8_t* qa,
                          float* scale, float* block_sum);
void quantize_a_block(const float* a, int64_t count, int64_t block_size, int8_t* q, float& scale, float& block_sum);
// All M rows with `rows` (null: the portable rows), in parts on the threads where A is large.
void quantize_a_int8(NBitsQuantizeA rows, const float* A, int64_t M, int64_t K, int64_t block_size, int8_t* qa,
                     float* scale, float* block_sum);

// The kernels of the family (csrc/dispatch.h's NBitsDispatch):
// levels 0-3: Y[:, n0:n1] for all M rows of A.
using NBitsRows = void (*)(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                           float* Y);
// Level 4: Y[:, n0:n1] from A quantized to int8 per block.
using NBitsRowsInt8 = void (*)(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                               float* Y);
// Level 4: rearranges the int8 A [M, k_blocks * block_size] in place, once per call, into the
// order the same entry's rows_int8 reads for this weight. Where the entry's NBitsInt8Tiling applies
// (below), qa has room for M rounded up to its row_group rows, those past M zero, and the driver
// may call it on ranges of whole row groups at once (qa at the range's first row, M the range's
// rows: at least min_rows, the last range ending at M): each group is rearranged on its own.
using NBitsPrepareInt8 = void (*)(int8_t* qa, int64_t M, const NBitsWeight& w);
// Level 4's tasks for an entry whose kernel works on blocks of rows (AMX tiles). Where min_rows is 0
// or M < min_rows: tasks of 16 columns over all M rows. Else tasks of `columns` columns x a range
// of rows that starts at a multiple of row_group and holds at least row_group rows (or all M), and
// rows_int8 gets that range as a view: QuantizedA's qa, scale and block_sum at the range's first row
// (prepare_int8 keeps each group of row_group rows within its own rows' bytes), its M the range's
// rows, and Y at the range's first row. So rows_int8 sees at least min(M, row_group) rows.
struct NBitsInt8Tiling {
  int64_t min_rows;  // 0: none
  int64_t columns;  // per task
  int64_t row_group;  // >= min_rows
};
// Levels 0-3: rearranges A [M, w.K] once per call into out (M * K floats) in the order the same
// entry's rows reads for M rows of a product with w (its level: w.operands); returns false (out
// unused) where it reads A as it is. The driver runs it in `parts` parts on its threads: part
// `part` (0 <= part < parts) writes its share of the rows' groups (prepare_share), every part
// returns the same answer, and together they write all of out. With out null it writes nothing and
// returns that answer (the driver asks first, and allocates out only where it is true).
using NBitsPrepareF32 = bool (*)(const float* A, int64_t M, const NBitsWeight& w, float* out, int64_t part,
                                 int64_t parts);
// Levels 2/3: x[0, count) rounded in place to float16 / bfloat16 and back, round_operand's results
// (the driver rounds A with it once per call, before any prepare_f32).
using NBitsRoundOperands = void (*)(float* x, int64_t count, NBitsOperands operands);

// Part `part` of `parts` of `count` groups: [first, last), contiguous, as even as they go.
static inline void prepare_share(int64_t count, int64_t part, int64_t parts, int64_t& first, int64_t& last) {
  first = count * part / parts;
  last = count * (part + 1) / parts;
}

// Y = sum_b scale_a * scale_b * dot_b(qa, q) - sum_b block_sum_a * (scale_b * zero_point_b) (+ bias),
// exact integer dot products per block, float32 elsewhere (docs/matmul_nbits.md, level 4).
void matmul_nbits_int8(const float* A, int64_t M, const NBitsWeight& w, const float* bias, float* Y);

// A constant weight packed in `layout` (an entry's: nbits_layout(entry, level), dispatch.h), its
// panels packed in parallel; layout is null (nothing held) where that is null or does not take w. w.packed =
// &packed.view() then reaches the kernels of entries with that layout.
struct NBitsDispatch;
struct PackedNBits {
  const NBitsLayout* layout = nullptr;
  const NBitsDispatch* entry = nullptr;  // the entry in use when packed, where known (the bindings set it)
  Buffer<uint8_t> codes;
  Buffer<float> floats;
  int64_t code_bytes = 0, float_count = 0;
  int64_t N = 0, K = 0, bits = 0, block_size = 0, k_blocks = 0, row_bytes = 0;  // the weight's shape
  bool u8_zero_points = false;
  NBitsPacked view() const { return {layout, codes.get(), floats.get(), u8_zero_points}; }
  size_t bytes() const { return static_cast<size_t>(code_bytes) + sizeof(float) * static_cast<size_t>(float_count); }
};
PackedNBits pack_nbits_weight(const NBitsLayout* layout, const NBitsWeight& w);
// The codes [N, row_bytes] of the weight `packed` holds, as they were (layout->unpack); its
// scales and zero points [N, k_blocks] (uint8 where packed.u8_zero_points, else float32), exactly.
void unpack_nbits_weight(const PackedNBits& packed, uint8_t* codes);
void unpack_nbits_floats(const PackedNBits& packed, float* scales, void* zero_points);
// The weight as `packed` holds it, for its kernels: the shape, w.packed = &view (packed.view()), no
// codes, scales or zero points.
NBitsWeight packed_nbits_weight(const PackedNBits& packed, const NBitsPacked& view);

// The two drivers on a given entry instead of the selected one (the self-test of csrc/dispatch.cpp).
void matmul_nbits_f32(const NBitsDispatch& kernels, const float* A, int64_t M, const NBitsWeight& w, const float* bias,
                      float* Y);
void matmul_nbits_int8(const NBitsDispatch& kernels, const float* A, int64_t M, const NBitsWeight& w, const float* bias,
                       float* Y);

}  // namespace qmm
