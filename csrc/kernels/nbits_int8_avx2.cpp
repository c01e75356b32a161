// nbits_int8_avx2.cpp: AVX2 MatMulNBits int8 kernels, accuracy level 4 (the table's nbits_rows_int8 and nbits_prepare_int8).
//
// A arrives quantized to int8 per row and block as ONNX Runtime does it (quantize_a_int8 in
// matmul_nbits.cpp, with scale_a and block_sum = scale_a * sum qa per block). Per block,
//   Y += scale_a * scale_b * dot_b(qa, q) - block_sum * (scale_b * zero_point_b),
// the dot product exact in int32, the rest in float32 (docs/matmul_nbits.md, level 4).
// nbits_rows_int8 picks:
//
//  - fewer than 8 rows: nbits_rows_int8_kind, per column and block vpmaddubsw (code x qa) with int16
//    sums widened once per segment (vpmaddwd), codes unpacked once per chunk for up to 4 rows,
//    8 blocks reduced and scaled together; 4-bit (and 3-bit, transcoded) and 2-bit codes in the
//    orders of nbits_decode_avx2.h, the int8 A reordered to match (nbits_prepare_int8);
//  - 8 rows or more: nbits_int8_gemm, the task's 16 columns decoded and transposed into quads of k,
//    A interleaved by quads in groups of 4 rows (nbits_prepare_int8), 4 x 16 register tiles.
//
// Level 4 with a g_idx does not come here (it runs through the float kernels, nbits_f32_avx2.cpp).
// The AVX-512 VNNI kernels (nbits_int8_avx512vnni.cpp) repeat both float32 epilogues operation for
// operation and are tested bit for bit against these: change the order in both, or in neither.
#include "nbits_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "nbits_avx2_common.h"
#include "nbits_decode_avx2.h"

namespace qmm {
namespace {
// Few rows: per column and block, one exact int32 dot product of the codes with the int8 A.
//   2..7-bit codes: vpmaddubsw (u8 code x s8 qa, a pair at most 2 * 127 * (2^bits - 1) < 2^15),
//   summed in int16 over up to int16_steps(bits) chunks of 32, then vpmaddwd with ones into int32;
//   8-bit codes: codes and qa widened to int16, vpmaddwd per chunk (dot32 with wide_codes).
// Eight blocks' int32 sums are reduced into one vector, converted once and scaled by
// scale_a * scale_b lane by lane.
//
// The 8 int32 partial sums of 32 codes times qa[0 .. 31] (wide_codes: as int16 pairs).
inline __m256i dot32(__m256i codes, const int8_t* qa, bool wide_codes) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa));
  if (!wide_codes) return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), _mm256_set1_epi16(1));
  const __m256i c_lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(codes));
  const __m256i c_hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(codes, 1));
  const __m256i a_lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
  const __m256i a_hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1));
  return _mm256_add_epi32(_mm256_madd_epi16(c_lo, a_lo), _mm256_madd_epi16(c_hi, a_hi));
}

// The 8 int32 partial sums of each of d[0..7] added up: one int32 per vector, in order.
inline __m256i reduce8(const __m256i d[8]) {
  const __m256i t0 = _mm256_hadd_epi32(d[0], d[1]), t1 = _mm256_hadd_epi32(d[2], d[3]);
  const __m256i t2 = _mm256_hadd_epi32(d[4], d[5]), t3 = _mm256_hadd_epi32(d[6], d[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

// Blocks of 16 codes, in 128-bit halves: the int32 dot product of the codes k0 .. k0+15 with qa
// (4-bit codes: [8 even | 8 odd] like codes32_even_odd; bytes otherwise), in the low 4 lanes.
template <int Kind>
inline __m256i block_dot16(const uint8_t* row, const int8_t* qa, int64_t k0) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qa + k0));
  if (Kind == 8) {
    const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0)));
    return _mm256_madd_epi16(c, _mm256_cvtepi8_epi16(a));
  }
  __m128i codes;
  if (Kind == 4) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (static_cast<uint64_t>(k0) >> 1)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    codes = _mm_unpacklo_epi64(_mm_and_si128(x, mask), _mm_and_si128(_mm_srli_epi16(x, 4), mask));
  } else {
    codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k0));
  }
  const __m128i dot = _mm_madd_epi16(_mm_maddubs_epi16(codes, a), _mm_set1_epi16(1));
  return _mm256_inserti128_si256(_mm256_setzero_si256(), dot, 0);
}

// The int32 dot product of one block (Chunks x 32 codes, Chunks a compile-time count when the
// block size is known, else `chunks`) of one column with the int8 A. Kind: 4 = nibbles ([even |
// odd] order), 8 = 8-bit codes (int16 pairs), 0 = one byte per code of at most 7 bits.
// Codes of up to 7 bits add `steps` chunks of vpmaddubsw pair sums in int16 before one vpmaddwd
// widens them (int16_steps, nbits_avx2_common.h: 8 for 4-bit codes, so one widening per block up to
// 256 codes).

template <int Kind, int Chunks, int MR>
inline void block_dots(const uint8_t* row, const int8_t* const qa[MR], int64_t k0, int64_t chunks, int64_t steps,
                       __m256i dot[MR]) {
  if constexpr (Chunks < 0) {  // a block of 16 codes
    for (int m = 0; m < MR; ++m) dot[m] = block_dot16<Kind>(row, qa[m], k0);
    return;
  }
  for (int m = 0; m < MR; ++m) dot[m] = _mm256_setzero_si256();
  const int64_t n = Chunks ? Chunks : chunks;
  if (Kind == 8) {
    for (int64_t c = 0; c < n; ++c) {
      const __m256i codes = codes32_bytes(row, k0 + 32 * c);
      for (int m = 0; m < MR; ++m) dot[m] = _mm256_add_epi32(dot[m], dot32(codes, qa[m] + k0 + 32 * c, true));
    }
    return;
  }
  // Chunks c0 .. c1-1 summed in int16, then widened into dot.
  auto segment = [&](int64_t c0, int64_t c1) {
    __m256i sum16[MR];
    for (int m = 0; m < MR; ++m) sum16[m] = _mm256_setzero_si256();
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t k = k0 + 32 * c;
      const __m256i codes = Kind == 4   ? codes32_even_odd(row, k)
                            : Kind == 2 ? codes32_quarters(row, k)
                                        : codes32_bytes(row, k);
      for (int m = 0; m < MR; ++m) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa[m] + k));
        sum16[m] = _mm256_add_epi16(sum16[m], _mm256_maddubs_epi16(codes, a));
      }
    }
    for (int m = 0; m < MR; ++m) dot[m] = _mm256_add_epi32(dot[m], _mm256_madd_epi16(sum16[m], _mm256_set1_epi16(1)));
  };
  const int64_t step = Kind == 4 ? int16_steps(4) : Kind == 2 ? int16_steps(2) : steps;
  if (Chunks > 0 && Chunks <= step) return segment(0, Chunks);  // one segment, a compile-time trip count
  for (int64_t c0 = 0; c0 < n; c0 += step) segment(c0, min_i64(n, c0 + step));
}

// MR rows (m0 ...) of A against columns [n0, n1): each chunk of codes is loaded and unpacked once
// for all MR rows.
template <int Kind, int Chunks, int MR>
void nbits_rows_int8_impl(const QuantizedA& a, int64_t m0, const NBitsWeight& w, int64_t n0, int64_t n1,
                          const float* bias, float* Y,
                          const uint8_t* (*column)(const NBitsWeight&, int64_t, uint8_t*)) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, chunks = bs / 32, steps = int16_steps(w.bits);
  thread_local Scratch codes_storage;
  uint8_t* const codes = codes_storage.get<uint8_t>(padded);
  const int8_t* qa[MR];
  for (int m = 0; m < MR; ++m) qa[m] = a.qa + (m0 + m) * padded;
  const float* scale_a = a.scale + m0 * kb;
  const float* block_sum = a.block_sum + m0 * kb;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = column(w, n, codes);
    const float* scales = w.scales + n * kb;
    // Eight blocks at a time: their int32 dot products reduced into one vector per row, scaled by
    // scale_a * scale_b lane by lane; the zero-point term likewise.
    __m256 acc[MR], correction[MR];
    for (int m = 0; m < MR; ++m) acc[m] = correction[m] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= kb; b += 8) {
      __m256i dots[MR][8];
      for (int i = 0; i < 8; ++i) {
        __m256i dot[MR];
        block_dots<Kind, Chunks, MR>(row, qa, (b + i) * bs, chunks, steps, dot);
        for (int m = 0; m < MR; ++m) dots[m][i] = dot[m];
      }
      const __m256 sb = _mm256_loadu_ps(scales + b), szp = _mm256_mul_ps(sb, zero_points8(w, n * kb + b));
      for (int m = 0; m < MR; ++m) {
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8(dots[m])),
                                 _mm256_mul_ps(_mm256_loadu_ps(scale_a + m * kb + b), sb), acc[m]);
        correction[m] = _mm256_fmadd_ps(_mm256_loadu_ps(block_sum + m * kb + b), szp, correction[m]);
      }
    }
    float y[MR];
    for (int m = 0; m < MR; ++m) y[m] = horizontal_sum(acc[m]) - horizontal_sum(correction[m]);
    for (; b < kb; ++b) {
      __m256i dot[MR];
      block_dots<Kind, Chunks, MR>(row, qa, b * bs, chunks, steps, dot);
      for (int m = 0; m < MR; ++m) {
        const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(dot[m]), _mm256_extracti128_si256(dot[m], 1));
        const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        const int32_t total = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
        y[m] += scale_a[m * kb + b] * scales[b] * static_cast<float>(total) -
                block_sum[m * kb + b] * (scales[b] * zero_point(w, n * kb + b));
      }
    }
    for (int m = 0; m < MR; ++m) Y[(m0 + m) * w.N + n] = bias ? y[m] + bias[n] : y[m];
  }
}

template <int Kind, int Chunks>
void nbits_rows_int8_rows(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y, const uint8_t* (*column)(const NBitsWeight&, int64_t, uint8_t*)) {
  for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
    switch (min_i64(4, a.M - m0)) {
      case 1: nbits_rows_int8_impl<Kind, Chunks, 1>(a, m0, w, n0, n1, bias, Y, column); break;
      case 2: nbits_rows_int8_impl<Kind, Chunks, 2>(a, m0, w, n0, n1, bias, Y, column); break;
      case 3: nbits_rows_int8_impl<Kind, Chunks, 3>(a, m0, w, n0, n1, bias, Y, column); break;
      default: nbits_rows_int8_impl<Kind, Chunks, 4>(a, m0, w, n0, n1, bias, Y, column);
    }
  }
}

// Column n's codes as the kernels read them: in place for 4 and 8 bits, else decoded to bytes
// (padded codes meet qa = 0, whatever they hold).
const uint8_t* column_in_place(const NBitsWeight& w, int64_t n, uint8_t*) { return w.codes + n * w.row_bytes; }
// 3-bit codes as 4-bit ones (the 4-bit kernel then reads them).
const uint8_t* column_transcoded(const NBitsWeight& w, int64_t n, uint8_t* out) {
  transcode_3bit_to_4bit(w.codes + n * w.row_bytes, w.k_blocks * w.block_size, w.row_bytes, out);
  return out;
}
const uint8_t* column_decoded(const NBitsWeight& w, int64_t n, uint8_t* out) {
  decode_nbits_avx2(w.codes + n * w.row_bytes, w.bits, w.k_blocks * w.block_size, w.row_bytes, out);
  return out;
}

template <int Kind>
void nbits_rows_int8_kind(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y) {
  const auto column = Kind == 0 ? column_decoded : Kind == 4 && w.bits == 3 ? column_transcoded : column_in_place;
  switch (w.block_size) {  // the usual block sizes with compile-time loop counts
    case 16: return nbits_rows_int8_rows<Kind, -1>(a, w, n0, n1, bias, Y, column);
    case 32: return nbits_rows_int8_rows<Kind, 1>(a, w, n0, n1, bias, Y, column);
    case 64: return nbits_rows_int8_rows<Kind, 2>(a, w, n0, n1, bias, Y, column);
    case 128: return nbits_rows_int8_rows<Kind, 4>(a, w, n0, n1, bias, Y, column);
    case 256: return nbits_rows_int8_rows<Kind, 8>(a, w, n0, n1, bias, Y, column);
    default: return nbits_rows_int8_rows<Kind, 0>(a, w, n0, n1, bias, Y, column);
  }
}

// Level 4 with many rows of A (prefill): a register-tiled int8 GEMM over each task's 16 columns.
//
// The task's codes are decoded once to one byte each and laid out by quads of k:
//   panel[q][c][j] = code of column c at k = 4q + j        (64 bytes per quad: 16 columns x 4)
// so that one 32-byte load holds 8 columns x 4 codes, and one broadcast of 4 int8 of a row of A
// meets them in vpmaddubsw (u8 code x s8 qa, adjacent pairs added into int16).
//
// A pair sum is at most 2 * 127 * qmax (|qa| <= 127, qmax = 2^bits - 1), so `steps` =
// floor(32767 / (254 * qmax)) of them add up in int16 without overflow (8 for 4-bit codes, 43 for
// 2-bit, 1 for 7-bit); then one vpmaddwd with ones widens to int32, and the block's int32 sum is
// exact. The block then enters float32 as the per-row formula does: acc += D * (sa * sb) and
// acc -= block_sum_a * (sb * zp). 8-bit codes (u8 x s8 pairs up to 64770) take the signed form of
// int8_segment_signed, with the codes and the zero point both shifted by -128.
//
// Per quad of k, a 4 x 16 tile does 2 loads of codes, 4 broadcasts of A, 8 vpmaddubsw and 8 int16
// adds for 256 multiply-adds: the widening, conversion and scaling run once per `steps` quads.

// Whether w comes packed in this entry's layout (nbits_packed_avx2.cpp).
inline bool is_packed(const NBitsWeight& w) { return w.packed && w.packed->layout == &kNBitsQuads16; }

// Whether M rows of A against a packed w take the packed few-row kernel rather than the GEMM: below
// 16 rows (8 for 8-bit codes, whose sums are widened every quad), where it measured faster (one
// thread, Zen 3: 4-bit blocks of 32 at 12 rows 3.17 ms against the GEMM's 3.30, at 16 rows 4.37
// against 4.16).
inline bool packed_few_rows(int64_t M, const NBitsWeight& w) { return is_packed(w) && M < (w.bits == 8 ? 8 : 16); }

// The int16 sums of quads [q0, q1) of the tile, widened to int32 with vpmaddwd: out[r][v] for
// rows r < MR and the two 8-column vectors v of the panel.
template <int MR>
inline void int8_segment(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                         int64_t q1, __m256i out[MR][2]) {
  __m256i sum16[MR][2];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 2; ++v) sum16[r][v] = _mm256_setzero_si256();
  for (int64_t q = q0; q < q1; ++q) {
    __m256i c[2];
    for (int v = 0; v < 2; ++v) c[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64 + 32 * v));
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * row_stride + q * quad_stride, 4);
      const __m256i av = _mm256_set1_epi32(four);
      for (int v = 0; v < 2; ++v) sum16[r][v] = _mm256_add_epi16(sum16[r][v], _mm256_maddubs_epi16(c[v], av));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < 2; ++v) out[r][v] = _mm256_madd_epi16(sum16[r][v], ones);
}

// The 4 x 16 tile over quads [q0, q1) of 4 grouped rows ([quad][row][4] int8, nbits_prepare_int8_avx2),
// its 8 int16 sums pinned to registers: written with intrinsics, GCC keeps one of them on the stack
// and the loop then waits on store-to-load forwarding every quad (measured: 1.4x slower).
inline void int8_segment_4x16(const int8_t* a, const uint8_t* p, int64_t q0, int64_t q1, __m256i out[4][2]) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  const uint8_t* codes = p + q0 * 64;
  const int8_t* rows = a + q0 * 16;
  int64_t n = q1 - q0;
  // AT&T order: vpmaddubsw signed, unsigned, destination.
  __asm__(
      "1:\n\t"
      "vmovdqu (%[codes]), %%ymm8\n\t"
      "vmovdqu 32(%[codes]), %%ymm9\n\t"
      "vpbroadcastd (%[rows]), %%ymm10\n\t"
      "vpbroadcastd 4(%[rows]), %%ymm11\n\t"
      "vpmaddubsw %%ymm10, %%ymm8, %%ymm12\n\t"
      "vpmaddubsw %%ymm10, %%ymm9, %%ymm13\n\t"
      "vpmaddubsw %%ymm11, %%ymm8, %%ymm14\n\t"
      "vpmaddubsw %%ymm11, %%ymm9, %%ymm15\n\t"
      "vpaddw %%ymm12, %[s0], %[s0]\n\t"
      "vpaddw %%ymm13, %[s1], %[s1]\n\t"
      "vpaddw %%ymm14, %[s2], %[s2]\n\t"
      "vpaddw %%ymm15, %[s3], %[s3]\n\t"
      "vpbroadcastd 8(%[rows]), %%ymm10\n\t"
      "vpbroadcastd 12(%[rows]), %%ymm11\n\t"
      "vpmaddubsw %%ymm10, %%ymm8, %%ymm12\n\t"
      "vpmaddubsw %%ymm10, %%ymm9, %%ymm13\n\t"
      "vpmaddubsw %%ymm11, %%ymm8, %%ymm14\n\t"
      "vpmaddubsw %%ymm11, %%ymm9, %%ymm15\n\t"
      "vpaddw %%ymm12, %[s4], %[s4]\n\t"
      "vpaddw %%ymm13, %[s5], %[s5]\n\t"
      "vpaddw %%ymm14, %[s6], %[s6]\n\t"
      "vpaddw %%ymm15, %[s7], %[s7]\n\t"
      "add $64, %[codes]\n\t"
      "add $16, %[rows]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4), [s5] "+x"(s5), [s6] "+x"(s6),
        [s7] "+x"(s7), [codes] "+r"(codes), [rows] "+r"(rows), [n] "+r"(n)
      :
      : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i sums[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < 2; ++v) out[r][v] = _mm256_madd_epi16(sums[2 * r + v], ones);
}

// 8-bit codes, held in the panel as c - 128 (int8): sum qa * (c - 128) per column, exact in int32.
// vpmaddubsw takes |c - 128| (at most 128, unsigned) and qa with the sign of c - 128 (vpsignb; qa
// is never -128), so a pair sums to at most 2 * 128 * 127 < 2^15; each quad is widened at once.
template <int MR>
inline void int8_segment_signed(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                                int64_t q1, __m256i out[MR][2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < MR; ++r) out[r][0] = out[r][1] = _mm256_setzero_si256();
  for (int64_t q = q0; q < q1; ++q) {
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64));
    const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + q * 64 + 32));
    const __m256i m0 = _mm256_abs_epi8(c0), m1 = _mm256_abs_epi8(c1);
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      std::memcpy(&four, a + r * row_stride + q * quad_stride, 4);
      const __m256i av = _mm256_set1_epi32(four);
      out[r][0] =
          _mm256_add_epi32(out[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(m0, _mm256_sign_epi8(av, c0)), ones));
      out[r][1] =
          _mm256_add_epi32(out[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(m1, _mm256_sign_epi8(av, c1)), ones));
    }
  }
}

template <int MR, bool Signed8>
inline void int8_segment_tile(const int8_t* a, int64_t row_stride, int64_t quad_stride, const uint8_t* p, int64_t q0,
                              int64_t q1, __m256i out[MR][2]) {
  if constexpr (Signed8) int8_segment_signed<MR>(a, row_stride, quad_stride, p, q0, q1, out);
  else if constexpr (MR == 4) int8_segment_4x16(a, p, q0, q1, out);  // grouped rows: row_stride 4, quad_stride 16
  else int8_segment<MR>(a, row_stride, quad_stride, p, q0, q1, out);
}

// Blocks [b0, b1) of rows [0, MR) of the tile into acc ([MR][16] float32). A block of more than
// `steps` quads adds its segments' int32 sums in `dot`, kept in memory: the 2 * MR int16 sums
// already take 2 * MR of the 16 ymm registers (int32 sums in registers too spill worse, and a
// 4 x 8 tile that has room for them measured slower).
template <int MR, bool Signed8>
void int8_gemm_tile(const int8_t* qa, int64_t row_stride, int64_t quad_stride, const float* sa, const float* bsum,
                    int64_t kb, const uint8_t* panel, const float* sb, const float* szb, int64_t b0, int64_t b1,
                    int64_t quads_per_block, int64_t steps, float* acc, int32_t* dot) {
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = panel + b * quads_per_block * 64;
    const int8_t* a = qa + b * quads_per_block * quad_stride;
    __m256i sum[MR][2];
    int8_segment_tile<MR, Signed8>(a, row_stride, quad_stride, p, 0, min_i64(steps, quads_per_block), sum);
    if (steps < quads_per_block) {
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < 2; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(dot + r * 16 + 8 * v), sum[r][v]);
      for (int64_t q0 = steps; q0 < quads_per_block; q0 += steps) {
        int8_segment_tile<MR, Signed8>(a, row_stride, quad_stride, p, q0, min_i64(quads_per_block, q0 + steps), sum);
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < 2; ++v) {
            auto* d = reinterpret_cast<__m256i*>(dot + r * 16 + 8 * v);
            _mm256_store_si256(d, _mm256_add_epi32(_mm256_load_si256(d), sum[r][v]));
          }
        __asm__ volatile("" : : "r"(dot) : "memory");  // dot stays in memory
      }
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < 2; ++v)
          sum[r][v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(dot + r * 16 + 8 * v));
    }
    for (int r = 0; r < MR; ++r) {
      const __m256 scale_a = _mm256_set1_ps(sa[r * kb + b]), block_sum = _mm256_set1_ps(bsum[r * kb + b]);
      for (int v = 0; v < 2; ++v) {
        float* out = acc + r * 16 + 8 * v;
        __m256 f = _mm256_loadu_ps(out);
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][v]), _mm256_mul_ps(scale_a, _mm256_loadu_ps(sb + b * 16 + 8 * v)),
                            f);
        f = _mm256_fnmadd_ps(block_sum, _mm256_loadu_ps(szb + b * 16 + 8 * v), f);
        _mm256_storeu_ps(out, f);
      }
    }
  }
}

// 8 columns x 32 codes (rows[c] + k) into the panel's quads q = k/4 .. k/4+7 (8 dwords each
// side): an 8 x 8 transpose of 32-bit elements.
inline void transpose_8x32(const uint8_t* const rows[8], int64_t k, uint8_t* panel_half) {
  __m256i r[8];
  for (int c = 0; c < 8; ++c) r[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c] + k));
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  // u0: quad 0 of columns 0-3 | quad 4 of columns 0-3 (lanes), u4 the same for columns 4-7, ...
  const __m256i quads[8] = {_mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
                            _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
                            _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
                            _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
  for (int q = 0; q < 8; ++q) _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel_half + (k / 4 + q) * 64), quads[q]);
}

void nbits_int8_gemm(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs, M = a.M, cols = n1 - n0;
  const bool signed8 = w.bits == 8, packed = is_packed(w);
  const int64_t decoded_len = (padded + 31) / 32 * 32;  // whole 32s for the transpose; the extra codes meet no A
  thread_local Scratch panel_storage, columns_storage, sb_storage, szb_storage, acc_storage;
  // Plain pointers: thread_local storage is looked up on every access the compiler cannot hoist.
  uint8_t* const panel = panel_storage.get<uint8_t>(decoded_len / 4 * 64);
  uint8_t* const columns = columns_storage.get<uint8_t>(16 * decoded_len);
  float* const sb = sb_storage.get<float>(kb * 16);
  float* const szb = szb_storage.get<float>(kb * 16);
  float* const acc = acc_storage.get<float>(M * 16);
  zero_floats(sb, kb * 16);  // columns past N keep scale 0
  zero_floats(szb, kb * 16);
  zero_floats(acc, M * 16);
  block_scales(w, n0, cols, 16, signed8 ? 128.0f : 0.0f, sb, szb);  // from the panels of a packed weight
  if (packed) {  // the panel by shifts and masks of the packed codes (8-bit ones held as c - 128)
    avx2::nbits_panel_from_packed(w, n0, panel);
  } else {
    for (int64_t c = 0; c < 16; ++c) {
      uint8_t* column = columns + c * decoded_len;
      if (c >= cols) {  // past N: codes 0 (their scales are 0 too)
        std::memset(column, 0, static_cast<size_t>(decoded_len));
        continue;
      }
      decode_padded_column(w, n0 + c, column);
      if (signed8)  // c - 128, and the zero point likewise: (c - 128) - (zp - 128) = c - zp
        for (int64_t k = 0; k < padded; ++k) column[k] ^= 0x80;
    }
    for (int half = 0; half < 2; ++half) {
      const uint8_t* rows[8];
      for (int c = 0; c < 8; ++c) rows[c] = columns + (8 * half + c) * decoded_len;
      for (int64_t k = 0; k < decoded_len; k += 32) transpose_8x32(rows, k, panel + 32 * half);
    }
  }
  const int64_t quads_per_block = bs / 4, steps = signed8 ? quads_per_block : int16_steps(w.bits);
  const int64_t chunk = max_i64(1, 256 / bs);  // blocks per pass: 16 KB of codes at most stay in L1
  alignas(32) int32_t dot[4 * 16];
  for (int64_t b0 = 0; b0 < kb; b0 += chunk) {
    const int64_t b1 = min_i64(kb, b0 + chunk);
    int64_t m = 0;
    auto tile = [&](auto rows) {
      constexpr int MR = decltype(rows)::value;
      // Whole groups of 4 rows come interleaved by quads (nbits_prepare_int8_avx2), the rest in order.
      const bool grouped = MR == 4;
      const int8_t* qa = a.qa + m * padded;
      const int64_t row_stride = grouped ? 4 : padded, quad_stride = grouped ? 16 : 4;
      const float *sa = a.scale + m * kb, *bsum = a.block_sum + m * kb;
      if (signed8)
        int8_gemm_tile<MR, true>(qa, row_stride, quad_stride, sa, bsum, kb, panel, sb, szb, b0, b1, quads_per_block,
                                 steps, acc + m * 16, dot);
      else
        int8_gemm_tile<MR, false>(qa, row_stride, quad_stride, sa, bsum, kb, panel, sb, szb, b0, b1, quads_per_block,
                                  steps, acc + m * 16, dot);
      m += MR;
    };
    while (m + 4 <= M) tile(std::integral_constant<int, 4>{});
    if (M - m == 3) tile(std::integral_constant<int, 3>{});
    if (M - m == 2) tile(std::integral_constant<int, 2>{});
    if (M - m == 1) tile(std::integral_constant<int, 1>{});
  }
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = n0; n < n1; ++n) {
      const float y = acc[r * 16 + (n - n0)];
      Y[r * w.N + n] = bias ? y + bias[n] : y;
    }
}

void nbits_rows_int8_avx2(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                          float* Y) {
  if (packed_few_rows(a.M, w)) return avx2::nbits_rows_int8_packed(a, w, n0, n1, bias, Y);
  if (a.M >= kInt8GemmMinRows) return nbits_int8_gemm(a, w, n0, n1, bias, Y);
  if (w.bits == 8) return nbits_rows_int8_kind<8>(a, w, n0, n1, bias, Y);
  if (w.bits == 3) return nbits_rows_int8_kind<4>(a, w, n0, n1, bias, Y);  // as 4-bit codes, qa as for 4-bit
  if (w.bits == 2 && w.block_size >= 32) return nbits_rows_int8_kind<2>(a, w, n0, n1, bias, Y);  // qa in quarters order
  if (w.bits != 4) return nbits_rows_int8_kind<0>(a, w, n0, n1, bias, Y);
  nbits_rows_int8_kind<4>(a, w, n0, n1, bias, Y);  // A in [even | odd] order: nbits_prepare_int8_avx2
}

// quarters_order between two buffers that never overlap, said so for GCC, which then vectorizes it
// (it could tell by itself while the copy was a fresh std::vector).
inline void quarters_order_disjoint(const int8_t* __restrict x, int8_t* __restrict out) { quarters_order(x, out); }

// Level 4's int8 A, rearranged once per call for the kernel that will read it:
//  - the GEMM (kInt8GemmMinRows+ rows): every whole group of 4 rows interleaved by quads of k,
//    [quad][row][4], so that a tile's broadcasts read one 16-byte run per quad (rows 4096 bytes
//    apart would also share L1 sets); the last M % 4 rows stay in order;
//  - the per-row 4-bit kernel: each 32 to the [even | odd] order of codes32_even_odd (each 16
//    with blocks of 16, for block_dot16); the 2-bit one (blocks of 32+): each 32 to the quarters
//    order of codes32_quarters.
void nbits_prepare_int8_avx2(int8_t* qa, int64_t M, const NBitsWeight& w) {
  const int64_t padded = w.k_blocks * w.block_size;
  // A copy of (part of) qa. thread_local like the kernels' buffers: a local one would need an
  // exception cleanup (and with it the personality routine's weak DW.ref symbol).
  thread_local Scratch copy_storage;
  if (packed_few_rows(M, w)) return;  // the packed few-row kernel reads A as it is
  if (M >= kInt8GemmMinRows) {
    int8_t* const group = copy_storage.get<int8_t>(4 * padded);
    for (int64_t g = 0; g + 4 <= M; g += 4) {
      int8_t* rows = qa + g * padded;
      std::memcpy(group, rows, static_cast<size_t>(4 * padded));
      for (int64_t q = 0; q < padded / 4; ++q)
        for (int r = 0; r < 4; ++r) std::memcpy(rows + q * 16 + r * 4, group + r * padded + q * 4, 4);
    }
    return;
  }
  if (w.bits == 2 && w.block_size >= 32) {
    int8_t* const natural = copy_storage.get<int8_t>(M * padded);
    std::memcpy(natural, qa, static_cast<size_t>(M * padded));
    for (int64_t k = 0; k < M * padded; k += 32) quarters_order_disjoint(natural + k, qa + k);
    return;
  }
  if (w.bits != 4 && w.bits != 3) return;  // 3-bit codes reach the 4-bit kernel transcoded
  const int64_t count = M * padded;  // a multiple of 32 except with blocks of 16 and k_blocks odd
  int8_t* const natural = copy_storage.get<int8_t>(count);
  std::memcpy(natural, qa, static_cast<size_t>(count));
  even_odd_qa(natural, count / 32 * 32, qa, w.block_size == 16);
  if (count % 32) {  // the last 16
    alignas(16) int8_t last[32] = {};
    std::memcpy(last, natural + count / 32 * 32, 16);
    even_odd_qa(last, 32, last, true);
    std::memcpy(qa + count / 32 * 32, last, 16);
  }
}
}  // namespace

namespace avx2 {

void nbits_quantize_a(const float* A, int64_t m0, int64_t m1, int64_t K, int64_t block_size, int8_t* qa, float* scale,
                      float* block_sum) {
  const int64_t k_blocks = (K + block_size - 1) / block_size, padded = k_blocks * block_size;
  const float tiny = 127.0f / std::numeric_limits<float>::max();  // below it: quantize_a_block's float64 path
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t b = 0; b < k_blocks; ++b) {
      const float* a = A + m * K + b * block_size;
      const int64_t count = std::min(block_size, K - b * block_size);
      int8_t* q = qa + m * padded + b * block_size;
      float& scale_b = scale[m * k_blocks + b];
      float& sum_b = block_sum[m * k_blocks + b];
      // max|a| as the largest bit pattern of |a| (quantize_a_block's reduction, 8 lanes at a time)
      __m256i top = _mm256_setzero_si256();
      int64_t j = 0;
      for (; j + 8 <= count; j += 8)
        top = _mm256_max_epu32(
            top, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + j)), magnitude));
      top = _mm256_max_epu32(top, _mm256_permute2x128_si256(top, top, 1));  // the 8 lanes' max, in registers
      top = _mm256_max_epu32(top, _mm256_shuffle_epi32(top, 0x4E));
      top = _mm256_max_epu32(top, _mm256_shuffle_epi32(top, 0xB1));
      uint32_t amax_bits = static_cast<uint32_t>(_mm256_cvtsi256_si32(top));
      for (; j < count; ++j) {
        uint32_t bits;
        std::memcpy(&bits, a + j, 4);
        amax_bits = std::max(amax_bits, bits & 0x7FFFFFFFu);
      }
      float amax;
      std::memcpy(&amax, &amax_bits, 4);
      if (amax_bits >= 0x7F800000u || (amax > 0.0f && amax < tiny)) {
        quantize_a_block(a, count, block_size, q, scale_b, sum_b);
        continue;
      }
      // float32 product, rounded half to even by the conversion (default MXCSR), as the portable
      // code's float32 rounding does; |a * inverse| <= 127.
      const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
      const __m256 v_inverse = _mm256_set1_ps(inverse);
      __m256i sums = _mm256_setzero_si256();
      for (j = 0; j + 8 <= count; j += 8) {
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(a + j), v_inverse));
        sums = _mm256_add_epi32(sums, v);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(words, words));
      }
      sums = _mm256_add_epi32(sums, _mm256_permute2x128_si256(sums, sums, 1));  // int32 wrap: exact here
      sums = _mm256_add_epi32(sums, _mm256_shuffle_epi32(sums, 0x4E));
      sums = _mm256_add_epi32(sums, _mm256_shuffle_epi32(sums, 0xB1));
      int32_t sum = _mm256_cvtsi256_si32(sums);
      for (; j < count; ++j) {
        q[j] = static_cast<int8_t>(_mm_cvtss_si32(_mm_set_ss(a[j] * inverse)));
        sum += q[j];
      }
      if (count < block_size) std::memset(q + count, 0, static_cast<size_t>(block_size - count));
      scale_b = amax / 127.0f;
      sum_b = scale_b * static_cast<float>(sum);
    }
}

void nbits_rows_int8(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias, float* Y) {
  nbits_rows_int8_avx2(a, w, n0, n1, bias, Y);
}
void nbits_prepare_int8(int8_t* qa, int64_t M, const NBitsWeight& w) { nbits_prepare_int8_avx2(qa, M, w); }

}  // namespace avx2
}  // namespace qmm
