// nbits_int8_avx512vnni.cpp: AVX-512 VNNI MatMulNBits int8 kernels, accuracy level 4 (the avx512_vnni table's nbits_rows_int8 and nbits_prepare_int8), every width 2-8.
//
// A arrives quantized to int8 per row and block as ONNX Runtime does it (quantize_a_int8 in
// matmul_nbits.cpp, with scale_a and block_sum = scale_a * sum qa per block). Per block,
//   Y += scale_a * scale_b * dot_b(qa, q) - block_sum * (scale_b * zero_point_b),
// the dot product exact in int32, the rest in float32 (docs/matmul_nbits.md, level 4). vpdpbusd
// multiplies uint8 by int8 and adds four products into an int32 lane without saturating, so every
// width, 8-bit codes included, takes it directly (|code * qa| <= 255 * 127).
//
// The float32 epilogue is the AVX2 kernels' (nbits_int8_avx2.cpp), operation for operation, so the
// two entries give the same bits on every path (tests/test_matmul_nbits.py compares them):
//
//  - fewer than 8 rows (decode): per column, eight blocks at a time, the codes unpacked to bytes in
//    registers 64 at a time (in order: A is read as it is) and multiplied with up to 4 rows of A;
//    the eight blocks' 16-lane sums reduced to one int32 per block (fold_*), converted and scaled
//    lane by lane as acc += D * (sa * sb), corr += block_sum * (sb * zp); then
//    y = hsum(acc) - hsum(corr), and the last k_blocks % 8 blocks one by one in scalar float32;
//  - 8 rows or more (prefill): an int8 GEMM per task of 16 columns. The task's codes are unpacked
//    and transposed in registers into quads [k/4][16 columns][4 codes] (one zmm per quad); A's rows
//    are interleaved by quads in groups of 8 once per call (nbits_prepare_int8); an 8 x 16 tile
//    does one load and 8 vpdpbusd per quad (broadcast A), and each block enters float32 as
//    acc = fma(D, sa * sb, acc); acc = fnmadd(block_sum, sb * zp, acc). 8-bit codes: as the AVX2
//    GEMM, D is sum qa * (c - 128) and the zero point is shifted by -128; here vpdpbusd multiplies
//    (qa + 128) (uint8, A flipped once per call) by c - 128 (int8), and the accumulator starts at
//    -128 * sum (c - 128), that block's and column's code sum from the panel: exact.
//
// Built twice (CMakeLists.txt): natively (-mavx512f/bw/vl/dq -mavx512vnni) and with QMM_EMULATED
// over SIMDe's AVX-512 for the tests on AVX2 machines: intrinsics only, none that SIMDe lacks
// (e.g. _mm512_cvtepu8_epi16, masked loads). Everything is internal except the three functions of
// nbits_avx512vnni.h, in the build's own namespace (the AMX entry, nbits_int8_amx.cpp, runs the
// two kernels for fewer than 16 rows and decodes its B tiles with the third).
#include "avx512_intrinsics.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "matmul_nbits.h"
#include "nbits_avx2_common.h"
#include "nbits_avx512vnni.h"

namespace qmm {
namespace {

// ---------------------------------------------------------------------------------------------
// Codes to bytes in registers: 64 codes of one column, in order, from the 8 * Bits bytes at p that
// hold them (nothing beyond those is read).

// 3, 5, 6 and 7 bits: each 128-bit lane takes the 2 * Bits bytes of its 16 codes (vpermt2w over two
// loads that stay inside the chunk), then per code the two bytes around it as one word (vpshufb:
// even codes into one vector, odd into another), shifted so that the code lands in the word's low
// byte (even) or high byte (odd), blended and masked.
struct GenericDecode {
  alignas(64) uint16_t words[32];  // vpermt2w: lane j <- words Bits*j .. Bits*j+7 of the chunk
  alignas(64) uint8_t even[64];  // vpshufb: word s of a lane <- the bytes holding code 2s
  alignas(64) uint8_t odd[64];  // ... code 2s + 1
  alignas(64) uint16_t shift_even[32];  // vpsrlvw: code 2s down to bit 0
  alignas(64) uint16_t shift_odd[32];  // vpsllvw: code 2s + 1 up to bit 8
};

constexpr GenericDecode make_generic_decode(int bits) {
  GenericDecode t{};
  const int per_load = bits == 3 ? 8 : 16;  // words per load (16 or 32 bytes)
  const int second = 4 * bits - per_load;  // the second load's first word: it ends with the chunk
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 8; ++i) {
      const int word = bits * j + i;  // past the chunk only as a code's unused upper neighbour
      t.words[8 * j + i] = static_cast<uint16_t>(word >= 4 * bits ? 0 : word < per_load ? word : 32 + word - second);
    }
  for (int j = 0; j < 4; ++j)
    for (int s = 0; s < 8; ++s) {
      const int e = 2 * s * bits, o = (2 * s + 1) * bits;  // bit offsets of codes 2s, 2s + 1 in the lane
      t.even[16 * j + 2 * s] = static_cast<uint8_t>(e / 8);
      t.even[16 * j + 2 * s + 1] = static_cast<uint8_t>(e / 8 + 1);
      t.odd[16 * j + 2 * s] = static_cast<uint8_t>(o / 8);
      t.odd[16 * j + 2 * s + 1] = static_cast<uint8_t>(o / 8 + 1);
      t.shift_even[8 * j + s] = static_cast<uint16_t>(e % 8);
      t.shift_odd[8 * j + s] = static_cast<uint16_t>(8 - o % 8);
    }
  return t;
}

template <int Bits>
constexpr GenericDecode kGenericDecode = make_generic_decode(Bits);

// lane j, dword i <- byte 4j + i zero-extended (2-bit codes: the byte holding codes 16j+4i .. +3)
struct Spread2 {
  alignas(64) uint8_t index[64];
};
constexpr Spread2 make_spread2() {
  Spread2 t{};
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 16; ++i) t.index[16 * j + i] = static_cast<uint8_t>(i % 4 == 0 ? 4 * j + i / 4 : 0x80);
  return t;
}
constexpr Spread2 kSpread2 = make_spread2();

template <int Bits>
inline __m512i codes64(const uint8_t* p) {
  if constexpr (Bits == 8) {
    return _mm512_loadu_si512(p);
  } else if constexpr (Bits == 4) {
    // word j = byte j = (code 2j+1) << 4 | code 2j, zero-extended; (w | w << 4) & 0x0F0F puts
    // code 2j in the low byte and code 2j+1 in the high byte.
    const __m512i w = _mm512_and_si512(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                                       _mm512_set1_epi16(0x00FF));
    return _mm512_ternarylogic_epi32(w, _mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0F0F), 0xA8);  // (A|B)&C
  } else if constexpr (Bits == 2) {
    // dword = byte x zero-extended; t = x | x << 6, then (t | t << 12) & 0x03030303: bits 2i, 2i+1
    // of x land in byte i.
    const __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i d = _mm512_shuffle_epi8(x, _mm512_load_si512(kSpread2.index));
    const __m512i t = _mm512_or_si512(d, _mm512_slli_epi32(d, 6));
    return _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(t, 12), _mm512_set1_epi32(0x03030303), 0xA8);
  } else {
    const GenericDecode& t = kGenericDecode<Bits>;
    __m512i lo, hi;
    if constexpr (Bits == 3) {  // 24 bytes: bytes 0..15 and 8..23
      lo = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      hi = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    } else {  // 40, 48 or 56 bytes: the first 32 and the last 32
      lo = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      hi = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 8 * Bits - 32)));
    }
    const __m512i lanes = _mm512_permutex2var_epi16(lo, _mm512_load_si512(t.words), hi);
    const __m512i even =
        _mm512_srlv_epi16(_mm512_shuffle_epi8(lanes, _mm512_load_si512(t.even)), _mm512_load_si512(t.shift_even));
    const __m512i odd =
        _mm512_sllv_epi16(_mm512_shuffle_epi8(lanes, _mm512_load_si512(t.odd)), _mm512_load_si512(t.shift_odd));
    return _mm512_and_si512(_mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even, odd),
                            _mm512_set1_epi8(static_cast<char>((1 << Bits) - 1)));
  }
}

// Codes k .. k + count - 1 of a row (count < 64, a multiple of 16: the row's end), then zeros.
template <int Bits>
inline __m512i codes64_partial(const uint8_t* row, int64_t k, int64_t count) {
  alignas(64) uint8_t buffer[64] = {};
  std::memcpy(buffer, row + k * Bits / 8, static_cast<size_t>(count * Bits / 8));
  return codes64<Bits>(buffer);
}

// ---------------------------------------------------------------------------------------------
// Fewer than 8 rows: per column, exact int32 block dot products, eight blocks reduced together.

// How a block maps onto 64-code chunks: blocks of 16 (4 per chunk), of 32 (2 per chunk), or of
// `Chunks` chunks (0: block_size / 64, at run time).
constexpr int kBlocks16 = -2, kBlocks32 = -1;

// 16 lanes summing to block a (d0) and 16 to block b (d1) -> [8 lanes of a | 8 lanes of b].
inline __m512i fold_pair(__m512i d0, __m512i d1) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(d0, d1, 0x44), _mm512_shuffle_i64x2(d0, d1, 0xEE));
}
// [8 of a | 8 of b], [8 of c | 8 of d] -> 4 lanes of each, one block per 128-bit lane: a, b, c, d.
inline __m512i fold_quad(__m512i x0, __m512i x1) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(x0, x1, 0x88), _mm512_shuffle_i64x2(x0, x1, 0xDD));
}
// Blocks 0-3 (y0) and 4-7 (y1), 4 lanes each per 128-bit lane -> the 8 block sums, in order.
inline __m256i fold_eight(__m512i y0, __m512i y1) {
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(y0, y1), _mm512_unpackhi_epi32(y0, y1));
  const __m512i s = _mm512_add_epi32(t, _mm512_unpackhi_epi64(t, t));  // lane j: [block j, block 4 + j, ..]
  return _mm512_castsi512_si256(
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), s));
}

inline int32_t reduce_add4(__m128i t) {
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
inline int32_t reduce_add8(__m256i v) {
  return reduce_add4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}
inline int32_t reduce_add16(__m512i v) {
  return reduce_add8(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// acc[m] += the 16-lane dot of codes k .. k+63 of the row with qa[m][k .. k+63].
template <int Bits, int MR>
inline void dot64(const uint8_t* row, const int8_t* const qa[MR], int64_t k, __m512i acc[MR]) {
  const __m512i codes = codes64<Bits>(row + k * Bits / 8);
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_dpbusd_epi32(acc[m], codes, _mm512_loadu_si512(qa[m] + k));
}

// The dot products of blocks k/bs .. k/bs + 7 of one column with MR rows of A: out[m] lane i = block i's.
template <int Bits, int Chunks, int MR>
inline void eight_block_dots(const uint8_t* row, const int8_t* const qa[MR], int64_t k, int64_t bs, __m256i out[MR]) {
  if constexpr (Chunks == kBlocks16) {
    __m512i y0[MR], y1[MR];
    for (int m = 0; m < MR; ++m) y0[m] = y1[m] = _mm512_setzero_si512();
    dot64<Bits, MR>(row, qa, k, y0);
    dot64<Bits, MR>(row, qa, k + 64, y1);
    for (int m = 0; m < MR; ++m) out[m] = fold_eight(y0[m], y1[m]);
  } else {
    __m512i x[4][MR];  // blocks 2p, 2p + 1 as [8 lanes | 8 lanes]
    for (int p = 0; p < 4; ++p) {
      if constexpr (Chunks == kBlocks32) {
        for (int m = 0; m < MR; ++m) x[p][m] = _mm512_setzero_si512();
        dot64<Bits, MR>(row, qa, k + 64 * p, x[p]);
      } else {
        const int64_t chunks = Chunks > 0 ? Chunks : bs / 64;
        __m512i d0[MR], d1[MR];
        for (int m = 0; m < MR; ++m) d0[m] = d1[m] = _mm512_setzero_si512();
        const int64_t k0 = k + 2 * p * bs, k1 = k0 + bs;
        for (int64_t c = 0; c < chunks; ++c) {  // the two blocks' chains side by side
          dot64<Bits, MR>(row, qa, k0 + 64 * c, d0);
          dot64<Bits, MR>(row, qa, k1 + 64 * c, d1);
        }
        for (int m = 0; m < MR; ++m) x[p][m] = fold_pair(d0[m], d1[m]);
      }
    }
    for (int m = 0; m < MR; ++m) out[m] = fold_eight(fold_quad(x[0][m], x[1][m]), fold_quad(x[2][m], x[3][m]));
  }
}

// The dot product of the one block at code k with MR rows of A (the last k_blocks % 8 blocks).
// Blocks of 16 or 32 codes are unpacked from a copy (a chunk of 64 would read past the row) and
// multiplied in 128 / 256 bits (qa likewise stays inside the block).
template <int Bits, int Chunks, int MR>
inline void one_block_dot(const uint8_t* row, const int8_t* const qa[MR], int64_t k, int64_t bs, int32_t out[MR]) {
  if constexpr (Chunks == kBlocks16 || Chunks == kBlocks32) {
    const __m512i codes = codes64_partial<Bits>(row, k, bs);
    for (int m = 0; m < MR; ++m) {
      if constexpr (Chunks == kBlocks16) {
        const __m128i d = _mm_dpbusd_epi32(_mm_setzero_si128(), _mm512_castsi512_si128(codes),
                                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(qa[m] + k)));
        out[m] = reduce_add4(d);
      } else {
        out[m] = reduce_add8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(codes),
                                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa[m] + k))));
      }
    }
  } else {
    const int64_t chunks = Chunks > 0 ? Chunks : bs / 64;
    __m512i d[MR];
    for (int m = 0; m < MR; ++m) d[m] = _mm512_setzero_si512();
    for (int64_t c = 0; c < chunks; ++c) dot64<Bits, MR>(row, qa, k + 64 * c, d);
    for (int m = 0; m < MR; ++m) out[m] = reduce_add16(d[m]);
  }
}

// MR rows (m0 ...) of A against columns [n0, n1): each chunk of codes is unpacked once for all MR rows.
template <int Bits, int Chunks, int MR>
void decode_rows_pass(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                      float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs;
  const int8_t* qa[MR];
  for (int m = 0; m < MR; ++m) qa[m] = a.qa + (m0 + m) * padded;
  const float* scale_a = a.scale + m0 * kb;
  const float* block_sum = a.block_sum + m0 * kb;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.codes + n * w.row_bytes;
    const float* scales = w.scales + n * kb;
    // As nbits_rows_int8_impl (nbits_int8_avx2.cpp): eight blocks per lane vector, then the rest.
    __m256 acc[MR], correction[MR];
    for (int m = 0; m < MR; ++m) acc[m] = correction[m] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= kb; b += 8) {
      __m256i dots[MR];
      eight_block_dots<Bits, Chunks, MR>(row, qa, b * bs, bs, dots);
      const __m256 sb = _mm256_loadu_ps(scales + b), szp = _mm256_mul_ps(sb, zero_points8(w, n * kb + b));
      for (int m = 0; m < MR; ++m) {
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[m]), _mm256_mul_ps(_mm256_loadu_ps(scale_a + m * kb + b), sb),
                                 acc[m]);
        correction[m] = _mm256_fmadd_ps(_mm256_loadu_ps(block_sum + m * kb + b), szp, correction[m]);
      }
    }
    float y[MR];
    for (int m = 0; m < MR; ++m) y[m] = horizontal_sum(acc[m]) - horizontal_sum(correction[m]);
    for (; b < kb; ++b) {
      int32_t dot[MR];
      one_block_dot<Bits, Chunks, MR>(row, qa, b * bs, bs, dot);
      for (int m = 0; m < MR; ++m)
        y[m] += scale_a[m * kb + b] * scales[b] * static_cast<float>(dot[m]) -
                block_sum[m * kb + b] * (scales[b] * zero_point(w, n * kb + b));
    }
    for (int m = 0; m < MR; ++m) Y[(m0 + m) * w.N + n] = bias ? y[m] + bias[n] : y[m];
  }
}

template <int Bits, int Chunks>
void decode_rows_chunks(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                        float* Y) {
  for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
    switch (min_i64(4, a.M - m0)) {
      case 1: decode_rows_pass<Bits, Chunks, 1>(a, m0, w, n0, n1, bias, Y); break;
      case 2: decode_rows_pass<Bits, Chunks, 2>(a, m0, w, n0, n1, bias, Y); break;
      case 3: decode_rows_pass<Bits, Chunks, 3>(a, m0, w, n0, n1, bias, Y); break;
      default: decode_rows_pass<Bits, Chunks, 4>(a, m0, w, n0, n1, bias, Y);
    }
  }
}

template <int Bits>
void decode_rows(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  switch (w.block_size) {
    case 16: return decode_rows_chunks<Bits, kBlocks16>(a, w, n0, n1, bias, Y);
    case 32: return decode_rows_chunks<Bits, kBlocks32>(a, w, n0, n1, bias, Y);
    case 64: return decode_rows_chunks<Bits, 1>(a, w, n0, n1, bias, Y);
    default: return decode_rows_chunks<Bits, 0>(a, w, n0, n1, bias, Y);
  }
}

// ---------------------------------------------------------------------------------------------
// 8 rows or more: an int8 GEMM over each task's 16 columns.
//
//   panel[q][c][j] = code of column c at k = 4q + j    (one zmm per quad: 16 columns x 4 codes)
//   A: whole groups of 8 rows as [quad][row][4] int8 (nbits_prepare_int8), the last M % 8 rows in order.
// Per quad, a tile of MR rows loads the quad once and broadcasts 4 int8 of each row into vpdpbusd
// (code x qa: per column, the 4 products summed into its int32 lane). Each block's int32 sums then
// enter float32 exactly as in nbits_int8_gemm (nbits_int8_avx2.cpp).
constexpr int64_t kGemmMinRows = 8;  // as the AVX2 kernels: below it the per-column kernel
// Up to kNBitsPackedMaxRows rows a packed weight takes the few-row kernel of nbits_packed_avx512vnni.cpp
// (at 8 rows, 4-bit K = N = 4096, 2 threads: 1.54 ms through the GEMM's per-task panels here, 0.83
// there; faster up to 255 rows: nbits_avx512vnni.h); 8-bit codes up to kNBitsPackedMaxRows8, the
// few-row kernel taking this GEMM's integers and zero-point term sb * (zp - 128) from 8 rows.
inline bool packed_rows(const NBitsWeight& w, int64_t M) {
  return w.packed && w.packed->layout == &kNBitsQuads16 &&
         M <= (w.bits == 8 ? kNBitsPackedMaxRows8 : kNBitsPackedMaxRows);
}
constexpr int kGroupRows = 8;  // rows interleaved by quads, the tile's height

#include "transpose16_avx512.inc"  // r[c] = quads 0..15 of column c -> r[q] = columns 0..15 of quad q

// The panel of columns n0 .. n0 + cols - 1 (zeros past them), codes k0 .. k1 - 1 (k0 a multiple of
// 64, k1 <= k_blocks * block_size) rounded up to 64, quad (k - k0) / 4 at 64 * that; 8-bit codes
// as c - 128 (int8).
template <int Bits>
void decode_panel(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel) {
  const int64_t padded = w.k_blocks * w.block_size;
  for (int64_t k = k0; k < k1; k += 64) {
    __m512i r[16];
    for (int64_t c = 0; c < 16; ++c) {
      if (c >= cols) {
        r[c] = _mm512_setzero_si512();
        continue;
      }
      const uint8_t* row = w.codes + (n0 + c) * w.row_bytes;
      r[c] = k + 64 <= padded ? codes64<Bits>(row + k * Bits / 8) : codes64_partial<Bits>(row, k, padded - k);
      if constexpr (Bits == 8) r[c] = _mm512_xor_si512(r[c], _mm512_set1_epi8(static_cast<char>(0x80)));
    }
    transpose16(r);
    for (int q = 0; q < 16; ++q) _mm512_storeu_si512(panel + ((k - k0) / 4 + q) * 64, r[q]);
  }
}

// Blocks [b0, b1) of MR rows of A into acc ([MR][16] float32). U: independent accumulator sets
// (even and odd quads) for short tiles, whose MR chains alone would wait on vpdpbusd's latency.
// Signed8: 8-bit codes, the panel int8 (c - 128) and A uint8 (qa + 128); the sums start at
// start[b] = -128 * sum (c - 128) per column.
template <int MR, int U, bool Signed8>
void gemm_tile(const int8_t* qa, int64_t row_stride, int64_t quad_stride, const float* sa, const float* bsum,
               int64_t kb, const uint8_t* panel, const float* sb, const float* szb, const int32_t* start, int64_t b0,
               int64_t b1, int64_t quads_per_block, float* acc) {
  __m512 f[MR];
  for (int r = 0; r < MR; ++r) f[r] = _mm512_loadu_ps(acc + r * 16);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = panel + b * quads_per_block * 64;
    const int8_t* a = qa + b * quads_per_block * quad_stride;
    __m512i s[U][MR];
    __m512i first = _mm512_setzero_si512();
    if constexpr (Signed8) first = _mm512_loadu_si512(start + b * 16);
    for (int r = 0; r < MR; ++r) {
      s[0][r] = first;
      for (int u = 1; u < U; ++u) s[u][r] = _mm512_setzero_si512();
    }
    for (int64_t q = 0; q < quads_per_block; q += U) {  // quads_per_block: a multiple of 4
      for (int u = 0; u < U; ++u) {
        const __m512i codes = _mm512_loadu_si512(p + (q + u) * 64);
        for (int r = 0; r < MR; ++r) {
          int32_t four;
          std::memcpy(&four, a + r * row_stride + (q + u) * quad_stride, 4);
          const __m512i av = _mm512_set1_epi32(four);
          s[u][r] = Signed8 ? _mm512_dpbusd_epi32(s[u][r], av, codes) : _mm512_dpbusd_epi32(s[u][r], codes, av);
        }
      }
    }
    const __m512 scale_b = _mm512_loadu_ps(sb + b * 16), scaled_zp = _mm512_loadu_ps(szb + b * 16);
    for (int r = 0; r < MR; ++r) {
      __m512i sum = s[0][r];
      for (int u = 1; u < U; ++u) sum = _mm512_add_epi32(sum, s[u][r]);
      f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(_mm512_set1_ps(sa[r * kb + b]), scale_b), f[r]);
      f[r] = _mm512_fnmadd_ps(_mm512_set1_ps(bsum[r * kb + b]), scaled_zp, f[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(acc + r * 16, f[r]);
}

template <bool Signed8>
void gemm_rows(const QuantizedA& a, int64_t kb, int64_t bs, const uint8_t* panel, const float* sb, const float* szb,
               const int32_t* start, float* acc) {
  const int64_t M = a.M, padded = kb * bs, quads_per_block = bs / 4;
  const int64_t chunk = max_i64(1, 1024 / bs);  // blocks per pass: 16 KB of the panel stay in L1
  for (int64_t b0 = 0; b0 < kb; b0 += chunk) {
    const int64_t b1 = min_i64(kb, b0 + chunk);
    int64_t m = 0;
    auto tile = [&](auto rows, auto sets) {
      constexpr int MR = decltype(rows)::value, U = decltype(sets)::value;
      const bool grouped = MR == kGroupRows;  // whole groups come interleaved, the rest in order
      gemm_tile<MR, U, Signed8>(a.qa + m * padded, grouped ? 4 : padded, grouped ? 4 * kGroupRows : 4, a.scale + m * kb,
                                a.block_sum + m * kb, kb, panel, sb, szb, start, b0, b1, quads_per_block, acc + m * 16);
      m += MR;
    };
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    while (m + kGroupRows <= M) tile(std::integral_constant<int, kGroupRows>{}, One{});
    switch (M - m) {
      case 7: tile(std::integral_constant<int, 7>{}, One{}); break;
      case 6: tile(std::integral_constant<int, 6>{}, One{}); break;
      case 5: tile(std::integral_constant<int, 5>{}, One{}); break;
      case 4: tile(std::integral_constant<int, 4>{}, Two{}); break;
      case 3: tile(std::integral_constant<int, 3>{}, Two{}); break;
      case 2: tile(std::integral_constant<int, 2>{}, Two{}); break;
      case 1: tile(std::integral_constant<int, 1>{}, Two{}); break;
      default: break;
    }
  }
}

void gemm(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, M = a.M, cols = n1 - n0;
  const bool signed8 = w.bits == 8;
  thread_local Scratch panel_storage, sb_storage, szb_storage, start_storage, acc_storage;
  // Plain pointers: thread_local storage is looked up on every access the compiler cannot hoist.
  uint8_t* const panel = panel_storage.get<uint8_t>((padded + 63) / 64 * 64 * 16);
  float* const sb = sb_storage.get<float>(kb * 16);
  float* const szb = szb_storage.get<float>(kb * 16);
  int32_t* const start = start_storage.get<int32_t>(signed8 ? kb * 16 : 0);
  float* const acc = acc_storage.get<float>(M * 16);
  zero_floats(sb, kb * 16);  // columns past N keep scale 0
  zero_floats(szb, kb * 16);
  zero_floats(acc, M * 16);
  block_scales(w, n0, cols, 16, signed8 ? 128.0f : 0.0f, sb, szb);  // from the panels of a packed weight
  QMM_KERNEL_NS::nbits_decode_panel16(w, n0, cols, 0, padded, panel);
  if (signed8) {
    // start[b] = -128 * (sum of the block's c - 128) per column: vpdpbusd with ones adds each
    // column's 4 codes of a quad into its lane.
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t b = 0; b < kb; ++b) {
      __m512i sum = _mm512_setzero_si512();
      for (int64_t q = b * bs / 4; q < (b + 1) * bs / 4; ++q)
        sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(panel + q * 64));
      _mm512_storeu_si512(start + b * 16, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
    }
    gemm_rows<true>(a, kb, bs, panel, sb, szb, start, acc);
  } else {
    gemm_rows<false>(a, kb, bs, panel, sb, szb, start, acc);
  }
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = n0; n < n1; ++n) {
      const float y = acc[r * 16 + (n - n0)];
      Y[r * w.N + n] = bias ? y + bias[n] : y;
    }
}

}  // namespace

namespace QMM_KERNEL_NS {

void nbits_decode_panel16(const NBitsWeight& w, int64_t n0, int64_t cols, int64_t k0, int64_t k1, uint8_t* panel) {
  if (w.packed && w.packed->layout == &kNBitsQuads16) return nbits_panel16_from_packed(w, n0, cols, k0, k1, panel);
  switch (w.bits) {
    case 2: return decode_panel<2>(w, n0, cols, k0, k1, panel);
    case 3: return decode_panel<3>(w, n0, cols, k0, k1, panel);
    case 4: return decode_panel<4>(w, n0, cols, k0, k1, panel);
    case 5: return decode_panel<5>(w, n0, cols, k0, k1, panel);
    case 6: return decode_panel<6>(w, n0, cols, k0, k1, panel);
    case 7: return decode_panel<7>(w, n0, cols, k0, k1, panel);
    default: return decode_panel<8>(w, n0, cols, k0, k1, panel);
  }
}

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  if (packed_rows(w, a.M)) return nbits_rows_int8_packed(a, w, n0, n1, bias, Y);
  if (a.M >= kGemmMinRows) return gemm(a, w, n0, n1, bias, Y);
  switch (w.bits) {
    case 2: return decode_rows<2>(a, w, n0, n1, bias, Y);
    case 3: return decode_rows<3>(a, w, n0, n1, bias, Y);
    case 4: return decode_rows<4>(a, w, n0, n1, bias, Y);
    case 5: return decode_rows<5>(a, w, n0, n1, bias, Y);
    case 6: return decode_rows<6>(a, w, n0, n1, bias, Y);
    case 7: return decode_rows<7>(a, w, n0, n1, bias, Y);
    default: return decode_rows<8>(a, w, n0, n1, bias, Y);
  }
}

// Level 4's int8 A, rearranged once per call for the GEMM (kGemmMinRows+ rows; the per-column
// kernel reads A as it is): every whole group of 8 rows interleaved by quads of k, [quad][row][4],
// so that a tile's broadcasts read one 32-byte run per quad; the last M % 8 rows stay in order.
// With 8-bit codes, every qa becomes qa + 128 as uint8 (qa is never -128).
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w) {
  if (M < kGemmMinRows || packed_rows(w, M)) return;  // the few-row kernels read A as it is
  const int64_t padded = w.k_blocks * w.block_size;
  // thread_local like the kernels' buffers: a local one would need an exception cleanup.
  thread_local Scratch copy_storage;
  int8_t* const group = copy_storage.get<int8_t>(kGroupRows * padded);
  for (int64_t g = 0; g + kGroupRows <= M; g += kGroupRows) {
    int8_t* rows = qa + g * padded;
    std::memcpy(group, rows, static_cast<size_t>(kGroupRows * padded));
    for (int64_t q = 0; q < padded / 4; ++q)
      for (int r = 0; r < kGroupRows; ++r) std::memcpy(rows + (q * kGroupRows + r) * 4, group + r * padded + q * 4, 4);
  }
  if (w.bits == 8)
    for (int64_t i = 0; i < M * padded; ++i) qa[i] = static_cast<int8_t>(qa[i] ^ 0x80);
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
