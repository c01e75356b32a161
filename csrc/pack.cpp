// pack.cpp: the packers of the 8-bit GEMM's layouts and of the float8 path's bfloat16 pairs (csrc/qgemm.h), compiled for the baseline: every table of a layout shares them.
#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "qgemm.h"

namespace qmm {

// Blocking: AVX2's 4x16 tile keeps its accumulators over all of k (as it was tuned on Zen 3);
// the VNNI and AMX tiles take k in blocks that keep their A and B blocks in L1/L2 (measured on a
// Sapphire Rapids class Xeon, docs/benchmarks.md), AMX with the larger tasks its larger L2 holds.
const QGemmLayout kPairsLayout = {kLayoutPairs, "int16 pairs, 4x16", 4,       16,   2, 1, {0, 0}, {0, 0},
                                  32,           256 << 10,           1 << 15, false};
// int8 a -> uint8 a + 128 and uint8 b -> int8 b - 128: in both cases the byte XOR 0x80 (the common
// uint8 a x int8 b is stored as given: A is read in place where K is whole k-quads).
// k per kernel call 16384: every call ends in a drain of its accumulator chains and a store of C
// that the next one loads; one call over all of k (up to 16384) measured 4-8 % faster than calls of
// 512 on AMD Zen 4 (128x4096x4096, 2048^3, 512x4096x4096, K = 16384), B streaming from L2. Tasks
// of 512 KB of B: each output row costs the driver a fixed epilogue setup per column block, which
// wider blocks spread (2048^3 +1.6 %, 128x4096x4096 within 1 % of 256 KB).
const QGemmLayout kQuadsLayout = {kLayoutQuads, "int8 quads, 8x32", 8,  32,        4,     1,
                                  {0, 128},     {-128, 0},          32, 512 << 10, 16384, true};
const QGemmLayout kTilesLayout = {
    kLayoutTiles, "int8 tiles, 32x32x64", 32, 32, 64, 16, {0, 128}, {-128, 0}, 64, 1 << 20, 2048, false};

namespace {

constexpr int64_t kPairsMr = 4, kPairsNr = 16;

#if defined(__SSE2__)
// Column sums of 16 columns, row by row: int16 partial sums, flushed into int32 totals before
// 128 rows of 255 could overflow them. No array members: the struct stays in registers.
struct PanelSums {
  __m128i lo16 = _mm_setzero_si128(), hi16 = _mm_setzero_si128();  // int16 partial sums, 8 columns each
  __m128i t0 = _mm_setzero_si128(), t1 = t0, t2 = t0, t3 = t0;  // int32 totals, columns 0-3, 4-7, 8-11, 12-15
  int pending = 0;

  void add(__m128i row, bool is_signed) {
    const __m128i zero = _mm_setzero_si128();
    __m128i lo = _mm_unpacklo_epi8(row, zero), hi = _mm_unpackhi_epi8(row, zero);
    if (is_signed) {  // sign-extend the bytes
      lo = _mm_srai_epi16(_mm_slli_epi16(lo, 8), 8);
      hi = _mm_srai_epi16(_mm_slli_epi16(hi, 8), 8);
    }
    lo16 = _mm_add_epi16(lo16, lo);
    hi16 = _mm_add_epi16(hi16, hi);
    if (++pending == 120) flush();
  }
  void flush() {  // int16 lanes sign-extended to int32: unpack with themselves, shift right by 16
    t0 = _mm_add_epi32(t0, _mm_srai_epi32(_mm_unpacklo_epi16(lo16, lo16), 16));
    t1 = _mm_add_epi32(t1, _mm_srai_epi32(_mm_unpackhi_epi16(lo16, lo16), 16));
    t2 = _mm_add_epi32(t2, _mm_srai_epi32(_mm_unpacklo_epi16(hi16, hi16), 16));
    t3 = _mm_add_epi32(t3, _mm_srai_epi32(_mm_unpackhi_epi16(hi16, hi16), 16));
    lo16 = hi16 = _mm_setzero_si128();
    pending = 0;
  }
  // The column sums so far (flushed) into out[0 .. 16).
  void store(int32_t* out) {
    flush();
    auto* o = reinterpret_cast<__m128i*>(out);
    _mm_storeu_si128(o, t0);
    _mm_storeu_si128(o + 1, t1);
    _mm_storeu_si128(o + 2, t2);
    _mm_storeu_si128(o + 3, t3);
  }
};
#endif

// Row k, columns [n0, n0 + 16) of a row-major [K, N] byte matrix: in place when all are inside,
// else copied into buffer with zeros past K and N.
const uint8_t* row16(const uint8_t* bytes, int64_t K, int64_t N, int64_t k, int64_t n0, uint8_t* buffer) {
  const int64_t cols = std::max<int64_t>(0, std::min<int64_t>(16, N - n0));
  if (k < K && cols == 16) return bytes + k * N + n0;
  std::memset(buffer, 0, 16);
  if (k < K && cols > 0) std::memcpy(buffer, bytes + k * N + n0, static_cast<size_t>(cols));
  return buffer;
}

}  // namespace

// Layout kLayoutPairs. A: each k-pair as two int16 in one int32.
void pack_a_pairs(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed) {
  const int64_t pairs = kPairsLayout.k_groups(K);
  std::fill(packed, packed + kPairsLayout.packed_a_int32s(rows, K), 0);
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* out = packed + r / kPairsMr * kPairsMr * pairs + r % kPairsMr;
    auto pack_row = [&](auto* row) {
      for (int64_t p = 0; p < pairs; ++p) {
        const int32_t lo = row[2 * p];
        const int32_t hi = 2 * p + 1 < K ? int32_t(row[2 * p + 1]) : 0;
        out[p * kPairsMr] =
            static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) | (static_cast<uint32_t>(lo) & 0xFFFFu));
      }
    };
    if (a_signed) pack_row(static_cast<const int8_t*>(a) + r * lda);
    else pack_row(static_cast<const uint8_t*>(a) + r * lda);
  }
}

namespace {

// Interleaves rows 2p and 2p+1 of one 16-column panel into 32 packed bytes and adds both rows into
// the column sums. SSE2 (every x86-64 CPU) does the 16 columns at once; elsewhere a scalar loop.
void pack_b_pairs_rows(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel, int64_t p_begin,
                       int64_t p_end, int8_t* out_panel, int32_t* colsum, bool first) {
  const int64_t n0 = panel * kPairsNr, cols = std::min(kPairsNr, N - n0);
  const auto* bytes = static_cast<const uint8_t*>(b);
  auto* out = reinterpret_cast<uint8_t*>(out_panel);
  auto row = [&](int64_t k, uint8_t* buffer) { return row16(bytes, K, N, k, n0, buffer); };
  uint8_t buffer0[kPairsNr], buffer1[kPairsNr];
#if defined(__SSE2__)
  PanelSums sums;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(2 * p, buffer0)));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(2 * p + 1, buffer1)));
    __m128i* dst = reinterpret_cast<__m128i*>(out + p * 2 * kPairsNr);
    _mm_storeu_si128(dst, _mm_unpacklo_epi8(r0, r1));  // b[2p,n0] b[2p+1,n0] ... columns 0..7
    _mm_storeu_si128(dst + 1, _mm_unpackhi_epi8(r0, r1));  // columns 8..15
    sums.add(r0, b_signed);
    sums.add(r1, b_signed);
  }
  int32_t total[kPairsNr];
  sums.store(total);
#else
  int32_t total[kPairsNr] = {};
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* r0 = row(2 * p, buffer0);
    const uint8_t* r1 = row(2 * p + 1, buffer1);
    uint8_t* dst = out + p * 2 * kPairsNr;
    for (int64_t j = 0; j < kPairsNr; ++j) {
      dst[2 * j] = r0[j];
      dst[2 * j + 1] = r1[j];
      total[j] += b_signed ? int32_t(int8_t(r0[j])) + int32_t(int8_t(r1[j])) : int32_t(r0[j]) + int32_t(r1[j]);
    }
  }
#endif
  for (int64_t j = 0; j < cols; ++j) colsum[n0 + j] = (first ? 0 : colsum[n0 + j]) + total[j];
}

}  // namespace

void pack_b_pairs(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum) {
  // Sweeps of 64 rows across the whole group of panels: reading along b's rows keeps the TLB and
  // the prefetchers happy (one 16-column panel alone would touch a new page on every row).
  constexpr int64_t kPairsPerSweep = 32;
  const int64_t pairs = kPairsLayout.k_groups(K);
  int64_t p0 = 0;
  do {  // at least once: K = 0 still sets the column sums
    const int64_t p1 = std::min(pairs, p0 + kPairsPerSweep);
    for (int64_t panel = panel0; panel < panel1; ++panel)
      pack_b_pairs_rows(b, b_signed, K, N, panel, p0, p1, out + (panel - panel0) * pairs * 2 * kPairsNr, colsum,
                        p0 == 0);
    p0 = p1;
  } while (p0 < pairs);
}

namespace {

// dst[i] = src[i] ^ flip for i < n (the layouts' offset of 128 on a byte).
void xor_copy(const uint8_t* src, int64_t n, uint8_t flip, uint8_t* dst) {
  int64_t i = 0;
#if defined(__SSE2__)
  const __m128i vflip = _mm_set1_epi8(static_cast<char>(flip));
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)), vflip));
#endif
  for (; i < n; ++i) dst[i] = static_cast<uint8_t>(src[i] ^ flip);
}

}  // namespace

// Layout kLayoutQuads. A: row-major, K padded to whole k-quads (row r at r * k_groups(K) int32s),
// signed values XOR 0x80. The driver reads an unsigned A with K a multiple of 4 in place instead.
void pack_a_quads(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed) {
  const int64_t groups = kQuadsLayout.k_groups(K);
  const uint8_t flip = a_signed ? 0x80 : 0;
  for (int64_t r = 0; r < rows; ++r) {
    auto* out = reinterpret_cast<uint8_t*>(packed + r * groups);
    xor_copy(static_cast<const uint8_t*>(a) + r * lda, K, flip, out);
    for (int64_t k = K; k < groups * 4; ++k) out[k] = 0;  // the last, partial k-quad: zeros (stored) past K
  }
}

namespace {

// k-quads [g_begin, g_end) of one 32-column panel: for each half of 16 columns, 64 bytes per
// k-quad (column j's four bytes at 4j), unsigned values XOR 0x80, zeros past K and N.
void pack_b_quads_rows(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel, int64_t g_begin,
                       int64_t g_end, int8_t* out_panel, int32_t* colsum, bool first) {
  const auto* bytes = static_cast<const uint8_t*>(b);
  auto* out = reinterpret_cast<uint8_t*>(out_panel);
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t n0 = panel * 32 + half * 16;
    const int64_t cols = std::max<int64_t>(0, std::min<int64_t>(16, N - n0));
    if (cols == 0) {  // a half past N (b of at most 16 columns): zeros, no sums
      for (int64_t g = g_begin; g < g_end; ++g) std::memset(out + g * 128 + half * 64, 0, 64);
      continue;
    }
    uint8_t buffers[4][16];
#if defined(__SSE2__)
    PanelSums sums;
    const __m128i flip = _mm_set1_epi8(b_signed ? 0 : static_cast<char>(0x80));
    alignas(16) uint8_t valid_bytes[16];
    for (int j = 0; j < 16; ++j) valid_bytes[j] = j < cols ? 0xFF : 0;
    const __m128i valid = _mm_load_si128(reinterpret_cast<const __m128i*>(valid_bytes));
    for (int64_t g = g_begin; g < g_end; ++g) {
      __m128i r[4];
      for (int i = 0; i < 4; ++i) {
        const int64_t k = 4 * g + i;
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row16(bytes, K, N, k, n0, buffers[i])));
        if (k < K) sums.add(v, b_signed);
        r[i] = k < K ? _mm_and_si128(_mm_xor_si128(v, flip), valid) : _mm_setzero_si128();
      }
      const __m128i t01lo = _mm_unpacklo_epi8(r[0], r[1]), t01hi = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i t23lo = _mm_unpacklo_epi8(r[2], r[3]), t23hi = _mm_unpackhi_epi8(r[2], r[3]);
      __m128i* dst = reinterpret_cast<__m128i*>(out + g * 128 + half * 64);
      _mm_storeu_si128(dst, _mm_unpacklo_epi16(t01lo, t23lo));  // columns 0..3
      _mm_storeu_si128(dst + 1, _mm_unpackhi_epi16(t01lo, t23lo));  // 4..7
      _mm_storeu_si128(dst + 2, _mm_unpacklo_epi16(t01hi, t23hi));  // 8..11
      _mm_storeu_si128(dst + 3, _mm_unpackhi_epi16(t01hi, t23hi));  // 12..15
    }
    int32_t total[16];
    sums.store(total);
#else
    int32_t total[16] = {};
    const uint8_t flip = b_signed ? 0 : 0x80;
    for (int64_t g = g_begin; g < g_end; ++g) {
      uint8_t* dst = out + g * 128 + half * 64;
      for (int i = 0; i < 4; ++i) {
        const int64_t k = 4 * g + i;
        const uint8_t* row = row16(bytes, K, N, k, n0, buffers[i]);
        for (int64_t j = 0; j < 16; ++j) {
          const bool inside = k < K && j < cols;
          dst[4 * j + i] = inside ? static_cast<uint8_t>(row[j] ^ flip) : 0;
          if (inside) total[j] += b_signed ? int32_t(int8_t(row[j])) : int32_t(row[j]);
        }
      }
    }
#endif
    for (int64_t j = 0; j < cols; ++j) colsum[n0 + j] = (first ? 0 : colsum[n0 + j]) + total[j];
  }
}

// The 32-column panels of k-quads, K padded to a whole number of L's k-groups (a multiple of 4 k):
// kLayoutQuads (k-groups of 4) and kLayoutTiles (of 64) share these bytes.
void pack_b_quad_panels(const QGemmLayout& L, const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0,
                        int64_t panel1, int8_t* out, int32_t* colsum) {
  constexpr int64_t kQuadsPerSweep = 16;  // 64 rows across every panel, along b's rows (see pack_b_pairs)
  const int64_t quads = L.k_groups(K) * (L.kc / 4), panel_bytes = L.panel_bytes(K);
  int64_t g0 = 0;
  do {  // at least once: K = 0 still sets the column sums
    const int64_t g1 = std::min(quads, g0 + kQuadsPerSweep);
    for (int64_t panel = panel0; panel < panel1; ++panel)
      pack_b_quads_rows(b, b_signed, K, N, panel, g0, g1, out + (panel - panel0) * panel_bytes, colsum, g0 == 0);
    g0 = g1;
  } while (g0 < quads);
}

}  // namespace

void pack_b_quads(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum) {
  pack_b_quad_panels(kQuadsLayout, b, b_signed, K, N, panel0, panel1, out, colsum);
}

// Layout kLayoutTiles. A: per group of 32 rows and k-group of 64, a 32 x 64-byte row-major block,
// signed values XOR 0x80, zeros past K and past the rows.
void pack_a_tiles(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed) {
  const QGemmLayout& L = kTilesLayout;
  const int64_t groups = L.k_groups(K), mr = L.mr, kc = L.kc;
  const uint8_t flip = a_signed ? 0x80 : 0;
  auto* bytes = reinterpret_cast<uint8_t*>(packed);
  for (int64_t r = 0; r < (rows + mr - 1) / mr * mr; ++r) {
    uint8_t* out = bytes + (r / mr * mr * groups + r % mr) * kc;  // the row's bytes of k-group 0
    if (r >= rows) {  // padding rows: zeros
      for (int64_t g = 0; g < groups; ++g) std::memset(out + g * mr * kc, 0, static_cast<size_t>(kc));
      continue;
    }
    const auto* row = static_cast<const uint8_t*>(a) + r * lda;
    for (int64_t g = 0; g < groups; ++g) {  // zeros past K
      const int64_t k0 = g * kc, n = std::min(kc, K - k0);
      xor_copy(row + k0, n, flip, out + g * mr * kc);
      std::memset(out + g * mr * kc + n, 0, static_cast<size_t>(kc - n));
    }
  }
}

void pack_b_tiles(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                  int32_t* colsum) {
  pack_b_quad_panels(kTilesLayout, b, b_signed, K, N, panel0, panel1, out, colsum);
}

// --- The float8 path's bfloat16 pairs (PairRows).

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Nonzero unless x (its bits) is pair-exact: low 16 bits 0 and x = +-0 or 2^-48 <= |x| < 2^48, that
// is a biased exponent in [79, 174] (docs/quantization.md derives the range).
uint32_t not_pair_exact(uint32_t bits) {
  const uint32_t mag = bits & 0x7FFFFFFFu;
  const uint32_t out_of_range = mag - (79u << 23) >= (175u - 79u) << 23;  // wraps below 2^-48
  return (bits & 0xFFFFu) | (out_of_range & (mag != 0));
}

// The word of a pair: the bfloat16 halves of k = 2j (low) and k = 2j + 1 (high).
uint32_t pair_word(uint32_t even, uint32_t odd) { return (odd & 0xFFFF0000u) | (even >> 16); }

}  // namespace

bool pack_pair_panel(const float* b, int64_t K, int64_t N, int64_t n0, uint32_t* panel) {
  const int64_t cols = std::min<int64_t>(16, N - n0);
  uint32_t bad = 0;
  for (int64_t k = 0; k < K; k += 2) {
    const float* even = b + k * N + n0;
    const float* odd = k + 1 < K ? even + N : nullptr;
    uint32_t* dst = panel + k / 2 * 16;
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t e = bits_of(even[j]), o = odd ? bits_of(odd[j]) : 0u;
      bad |= not_pair_exact(e) | not_pair_exact(o);
      dst[j] = pair_word(e, o);
    }
    for (int64_t j = cols; j < 16; ++j) dst[j] = 0;
  }
  return bad == 0;
}

PairCodes codes_for_pairs(const float* table) {
  PairCodes codes{};
  for (int c = 0; c < 256; ++c) {
    const uint32_t bits = bits_of(table[c]);
    codes.half[c] = static_cast<uint16_t>(bits >> 16);
    codes.inexact[c] = not_pair_exact(bits) != 0;
  }
  return codes;
}

bool pack_pair_group_codes(const uint8_t* a, int64_t rows, int64_t K, const PairCodes& codes, uint32_t* group) {
  uint32_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = a + r * K;
    int64_t k = 0;
    for (; k + 1 < K; k += 2) {
      const uint8_t e = row[k], o = row[k + 1];
      bad |= codes.inexact[e] | codes.inexact[o];
      group[k / 2 * rows + r] = (uint32_t{codes.half[o]} << 16) | codes.half[e];
    }
    if (k < K) {  // K odd: the last word's high half 0
      bad |= codes.inexact[row[k]];
      group[k / 2 * rows + r] = codes.half[row[k]];
    }
  }
  return bad == 0;
}

bool pack_pair_group(const float* a, int64_t rows, int64_t K, uint32_t* group) {
  uint32_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = a + r * K;
    for (int64_t k = 0; k < K; k += 2) {
      const uint32_t e = bits_of(row[k]), o = k + 1 < K ? bits_of(row[k + 1]) : 0u;
      bad |= not_pair_exact(e) | not_pair_exact(o);
      group[k / 2 * rows + r] = pair_word(e, o);
    }
  }
  return bad == 0;
}

}  // namespace qmm
