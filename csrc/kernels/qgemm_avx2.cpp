// qgemm_avx2.cpp: AVX2 int8 GEMM micro-kernel (exact int16 pairs with vpmaddwd) and vectorized ONNX Runtime epilogue.
//
// Micro-tile: MR (<= 4) rows x 16 columns, 2*MR ymm accumulators of 8 int32 (more rows spill:
// AVX2 has 16 ymm registers and vpmaddwd needs a temporary before each add).
//
//   per k-pair p:   b0 = widen(B[p][cols 0..7]),  b1 = widen(B[p][cols 8..15])   (16 x int16 each)
//                   for each row r: a = broadcast(A[r][p]) = (a[r,2p], a[r,2p+1]) x 8
//                                   acc[r][0] += vpmaddwd(a, b0); acc[r][1] += vpmaddwd(a, b1)
//
// vpmaddwd multiplies int16 lanes and adds adjacent pairs into int32: exact for 8-bit inputs of
// any signedness (|pair| <= 65280), unlike vpmaddubsw, whose int16 pair sums saturate.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "dispatch.h"
#include "nbits_avx2.h"
#include "nbits_avx2_common.h"
#include "qgemm.h"
#include "requantize.h"

namespace qmm {
#include "fma_tile_avx2.inc"

namespace {

constexpr int64_t kMr = 4, kNr = 16;  // kPairsLayout

template <int MR, bool BSigned>
void micro_tile(const int32_t* a, const int8_t* b, int64_t p0, int64_t p1, bool accumulate, int32_t* c, int64_t ldc) {
  __m256i acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  if (accumulate)
    for (int r = 0; r < MR; ++r) {
      acc[r][0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc));
      acc[r][1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + 8));
    }
  for (int64_t p = p0; p < p1; ++p) {
    const __m128i* bp = reinterpret_cast<const __m128i*>(b + p * 2 * kNr);
    if (MR <= 2) _mm_prefetch(reinterpret_cast<const char*>(bp) + 1024, _MM_HINT_T0);  // few rows: B streams
    const __m256i b0 = BSigned ? _mm256_cvtepi8_epi16(_mm_loadu_si128(bp)) : _mm256_cvtepu8_epi16(_mm_loadu_si128(bp));
    const __m256i b1 =
        BSigned ? _mm256_cvtepi8_epi16(_mm_loadu_si128(bp + 1)) : _mm256_cvtepu8_epi16(_mm_loadu_si128(bp + 1));
    for (int r = 0; r < MR; ++r) {
      const __m256i av = _mm256_set1_epi32(a[p * kMr + r]);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(av, b0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(av, b1));
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), acc[r][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), acc[r][1]);
  }
}

// The full 4 x 16 tile with its 8 accumulators pinned to registers (inline asm, AT&T operand
// order): compiled from the intrinsics above, GCC keeps a copy of one accumulator on the stack
// and shuffles the others through spare registers every k-pair; pinned, the same instructions
// run about 10 % faster.
template <bool BSigned>
void micro_tile_4x16(const int32_t* a, const int8_t* b, int64_t p0, int64_t p1, bool accumulate, int32_t* c,
                     int64_t ldc) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  if (accumulate) {
    auto load = [&](int r, int half) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + r * ldc + 8 * half));
    };
    s0 = load(0, 0), s1 = load(0, 1), s2 = load(1, 0), s3 = load(1, 1);
    s4 = load(2, 0), s5 = load(2, 1), s6 = load(3, 0), s7 = load(3, 1);
  }
  if (p1 > p0) {
    const int8_t* bp = b + p0 * 2 * kNr;
    const int32_t* ap = a + p0 * kMr;
    int64_t n = p1 - p0;
#define QMM_WIDEN(op)                                                                                                \
  __asm__("1:\n\t" op " (%[b]), %%ymm8\n\t" op                                                                       \
          " 16(%[b]), %%ymm9\n\t"                                                                                    \
          "vpbroadcastd (%[a]), %%ymm10\n\t"                                                                         \
          "vpbroadcastd 4(%[a]), %%ymm11\n\t"                                                                        \
          "vpmaddwd %%ymm8, %%ymm10, %%ymm12\n\t"                                                                    \
          "vpmaddwd %%ymm9, %%ymm10, %%ymm13\n\t"                                                                    \
          "vpmaddwd %%ymm8, %%ymm11, %%ymm14\n\t"                                                                    \
          "vpmaddwd %%ymm9, %%ymm11, %%ymm15\n\t"                                                                    \
          "vpaddd %%ymm12, %[s0], %[s0]\n\t"                                                                         \
          "vpaddd %%ymm13, %[s1], %[s1]\n\t"                                                                         \
          "vpaddd %%ymm14, %[s2], %[s2]\n\t"                                                                         \
          "vpaddd %%ymm15, %[s3], %[s3]\n\t"                                                                         \
          "vpbroadcastd 8(%[a]), %%ymm10\n\t"                                                                        \
          "vpbroadcastd 12(%[a]), %%ymm11\n\t"                                                                       \
          "vpmaddwd %%ymm8, %%ymm10, %%ymm12\n\t"                                                                    \
          "vpmaddwd %%ymm9, %%ymm10, %%ymm13\n\t"                                                                    \
          "vpmaddwd %%ymm8, %%ymm11, %%ymm14\n\t"                                                                    \
          "vpmaddwd %%ymm9, %%ymm11, %%ymm15\n\t"                                                                    \
          "vpaddd %%ymm12, %[s4], %[s4]\n\t"                                                                         \
          "vpaddd %%ymm13, %[s5], %[s5]\n\t"                                                                         \
          "vpaddd %%ymm14, %[s6], %[s6]\n\t"                                                                         \
          "vpaddd %%ymm15, %[s7], %[s7]\n\t"                                                                         \
          "add $32, %[b]\n\t"                                                                                        \
          "add $16, %[a]\n\t"                                                                                        \
          "dec %[n]\n\t"                                                                                             \
          "jnz 1b\n\t"                                                                                               \
          : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4), [s5] "+x"(s5), [s6] "+x"(s6), \
            [s7] "+x"(s7), [b] "+r"(bp), [a] "+r"(ap), [n] "+r"(n)                                                   \
          :                                                                                                          \
          : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory")
    if (BSigned) QMM_WIDEN("vpmovsxbw");
    else QMM_WIDEN("vpmovzxbw");
#undef QMM_WIDEN
  }
  const __m256i rows[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  for (int r = 0; r < 4; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), rows[2 * r]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), rows[2 * r + 1]);
  }
}

template <bool BSigned>
void kernel_avx2_t(const int32_t* a, int64_t rows, const int8_t* b, int64_t p0, int64_t p1, bool accumulate, int32_t* c,
                   int64_t ldc) {
  switch (rows) {
    case 1: return micro_tile<1, BSigned>(a, b, p0, p1, accumulate, c, ldc);
    case 2: return micro_tile<2, BSigned>(a, b, p0, p1, accumulate, c, ldc);
    case 3: return micro_tile<3, BSigned>(a, b, p0, p1, accumulate, c, ldc);
    default: return micro_tile_4x16<BSigned>(a, b, p0, p1, accumulate, c, ldc);
  }
}

void kernel_avx2(const int32_t* a, int64_t, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1, bool b_signed,
                 bool accumulate, int32_t* c, int64_t ldc) {
  if (b_signed) kernel_avx2_t<true>(a, rows, b_panel, p0, p1, accumulate, c, ldc);
  else kernel_avx2_t<false>(a, rows, b_panel, p0, p1, accumulate, c, ldc);
}

// Zb null (every column's zb' alike: t holds zb' * t) drops a multiply per lane, za' = 1 another, and a row of one
// output zero point has its clamp bounds formed once, as in requantize_avx512.inc.
template <bool WithZb, bool UnitZa, bool UniformZp>
void requantize_row_avx2_t(const int32_t* raw, const RowTerms& terms, const float* multiplier, const int32_t* zp,
                           int64_t count, bool y_signed, uint8_t* y) {
  const int32_t qmin = y_signed ? -128 : 0, qmax = y_signed ? 127 : 255;
  const int32_t* const zb = terms.zb;  // locals: the uint8 stores could alias terms
  const int32_t* const colsum = terms.colsum;
  const __m256i vqmin = _mm256_set1_epi32(qmin), vqmax = _mm256_set1_epi32(qmax);
  const __m256i za = _mm256_set1_epi32(terms.za), t = _mm256_set1_epi32(terms.t);
  const __m256i z0 = _mm256_set1_epi32(zp[0]);
  const __m256 lo0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(vqmin, z0)),
               hi0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(vqmax, z0));
  uint8_t* const out = y;
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    auto load = [&](const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j)); };
    const __m256i cs = load(colsum);
    __m256i acc = _mm256_sub_epi32(load(raw), UnitZa ? cs : _mm256_mullo_epi32(za, cs));
    acc = _mm256_sub_epi32(acc, WithZb ? _mm256_mullo_epi32(load(zb), t) : t);  // wrapping
    const __m256i z = UniformZp ? z0 : load(zp);
    const __m256 lo = UniformZp ? lo0 : _mm256_cvtepi32_ps(_mm256_sub_epi32(vqmin, z));
    const __m256 hi = UniformZp ? hi0 : _mm256_cvtepi32_ps(_mm256_sub_epi32(vqmax, z));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(multiplier + j));
    v = _mm256_max_ps(v, lo);  // operand order as MLAS: a NaN becomes the lower bound
    v = _mm256_min_ps(v, hi);
    const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(v), z);  // round half to even (default MXCSR)
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i bytes = y_signed ? _mm_packs_epi16(words, words) : _mm_packus_epi16(words, words);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), bytes);
  }
  for (; j < count; ++j) {
    const int32_t q = requantize_onnxruntime(row_terms_applied(raw, terms, j), multiplier[j], zp[j], qmin, qmax);
    out[j] = static_cast<uint8_t>(y_signed ? static_cast<uint8_t>(static_cast<int8_t>(q)) : q);
  }
}

// Whether zp[0 .. count) are all zp[0].
bool uniform_row_avx2(const int32_t* zp, int64_t count) {
  const __m256i z0 = _mm256_set1_epi32(zp[0]);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(zp + j));
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(z, z0)) != -1) return false;
  }
  for (; j < count; ++j)
    if (zp[j] != zp[0]) return false;
  return true;
}

// One row, its zero points' uniformity known.
void requantize_row_avx2(const int32_t* raw, const RowTerms& terms, const float* multiplier, const int32_t* zp,
                         int64_t count, bool uniform, bool y_signed, uint8_t* y) {
  const bool with_zb = terms.zb != nullptr, unit_za = terms.za == 1;
  auto row = [&](auto kernel) { kernel(raw, terms, multiplier, zp, count, y_signed, y); };
  if (with_zb) {
    if (unit_za) uniform ? row(requantize_row_avx2_t<true, true, true>) : row(requantize_row_avx2_t<true, true, false>);
    else uniform ? row(requantize_row_avx2_t<true, false, true>) : row(requantize_row_avx2_t<true, false, false>);
  } else {
    if (unit_za)
      uniform ? row(requantize_row_avx2_t<false, true, true>) : row(requantize_row_avx2_t<false, true, false>);
    else uniform ? row(requantize_row_avx2_t<false, false, true>) : row(requantize_row_avx2_t<false, false, false>);
  }
}

// A block's rows (RequantizeRows, csrc/qgemm.h): zero points shared by the rows checked once.
void requantize_rows_avx2(const int32_t* raw, int64_t ld, const RowTerms* terms, int64_t rows, const float* multiplier,
                          int64_t multiplier_ld, const int32_t* zp, int64_t zp_ld, int64_t count, bool y_signed,
                          uint8_t* y, int64_t ldy) {
  const bool shared_uniform = zp_ld == 0 && count > 0 && uniform_row_avx2(zp, count);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* z = zp + r * zp_ld;
    const bool uniform = zp_ld == 0 ? shared_uniform : count > 0 && uniform_row_avx2(z, count);
    requantize_row_avx2(raw + r * ld, terms[r], multiplier + r * multiplier_ld, z, count, uniform, y_signed,
                        y + r * ldy);
  }
}

// The float8 path's float32 GEMM (contract: kernels/sgemm_rows.inc): one fused multiply-add per k,
// in order of k, exactly as the portable code does (std::fma), so both give the same bits. a comes
// interleaved by k in groups of 6 rows (kSgemmGroup, the entry's a_group: the driver packs it once
// per call, [k][6], so that a tile's broadcasts read one run per k) for 6 x 16 tiles of 12
// accumulators; the last group's rows (rows % 6, [k][rows % 6]) take a tile of that many rows.
// Each panel of b is swept in chunks of 256 k (16 KB, L1-resident while every row tile passes);
// the tiles' sums wait in a [rows][16] block between chunks, so each sum still sees its k in order.
constexpr int64_t kSgemmGroup = 6;
constexpr int64_t kSgemmChunk = 256;

// The last group's tile: `rows` (1 .. 5) rows interleaved by k.
void fma_tile_tail(int64_t rows, const float* a, int64_t k0, int64_t k1, const float* panel, float* partial) {
  switch (rows) {
    case 1: return fma_tile<1>(a, 1, 1, k0, k1, panel, partial);
    case 2: return fma_tile<2>(a, 1, 2, k0, k1, panel, partial);
    case 3: return fma_tile<3>(a, 1, 3, k0, k1, panel, partial);
    case 4: return fma_tile<4>(a, 1, 4, k0, k1, panel, partial);
    default: return fma_tile<5>(a, 1, 5, k0, k1, panel, partial);
  }
}

void sgemm_rows_avx2(const float* a, const float* b_panels, float* y, int64_t ldy, int64_t rows, int64_t cols,
                     int64_t K) {
  const int64_t full = rows / kSgemmGroup * kSgemmGroup, tail = rows - full;
  thread_local Scratch partial_storage;
  float* const partial = partial_storage.get<float>(rows * 16);
  for (int64_t n = 0; n < cols; n += 16) {
    const float* panel = b_panels + n * K;
    const int64_t width = cols - n < 16 ? cols - n : 16;
    zero_floats(partial, rows * 16);  // +0: the sums' starting value
    for (int64_t k0 = 0; k0 < K; k0 += kSgemmChunk) {
      const int64_t k1 = min_i64(K, k0 + kSgemmChunk);
      for (int64_t m = 0; m < full; m += kSgemmGroup)
        fma_tile<kSgemmGroup>(a + m * K, 1, kSgemmGroup, k0, k1, panel, partial + m * 16);
      if (tail) fma_tile_tail(tail, a + full * K, k0, k1, panel, partial + full * 16);
    }
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t j = 0; j < width; ++j) y[m * ldy + n + j] = partial[m * 16 + j];
  }
}

#include "small_product_avx2.inc"

constexpr EntryInfo kInfo = {.name = "avx2", .isa = Isa::kAvx2, .needs = kAvx2Features, .emulated = false};

const QGemmDispatch kQGemm = {
    .info = kInfo,
    .layout = &kPairsLayout,
    .pack_a = pack_a_pairs,
    .pack_b_panels = pack_b_pairs,
    .kernel = kernel_avx2,
    .requantize_onnxruntime = requantize_rows_avx2,
    .begin_task = nullptr,
    .small_product = small_product_avx2,
};
const NBitsDispatch kNBits = {
    .info = kInfo,
    .rows = avx2::nbits_rows,
    .rows_int8 = avx2::nbits_rows_int8,
    .prepare_int8 = avx2::nbits_prepare_int8,
    .prepare_f32 = nullptr,  // the prefill reads A in place
    .round_operands = avx2::nbits_round_operands,
    .quantize_a = avx2::nbits_quantize_a,
    .int8_layout = &kNBitsQuads16,
    .f32_layout = &kNBitsQuads16,
};
const Float8Dispatch kFloat8 = {.info = kInfo, .a_group = kSgemmGroup, .sgemm_rows = sgemm_rows_avx2};

}  // namespace

KernelEntries QMM_KERNELS_FN() { return {&kQGemm, &kNBits, &kFloat8}; }

}  // namespace qmm
