// qgemm_portable.cpp: packing (shared by every path) and the portable C++ int8 GEMM kernel and epilogue.
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <vector>

#include "matmul_nbits.h"
#include "qgemm.h"
#include "requantize.h"

namespace qmm {
#include "nbits_dequantize.inc"
#include "sgemm_rows.inc"
}  // namespace qmm

namespace qmm {

void pack_a(const void* a, bool a_signed, int64_t rows, int64_t K, int64_t lda, int32_t* packed) {
  const int64_t pairs = k_pairs(K);
  std::fill(packed, packed + packed_a_int32s(rows, K), 0);
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* out = packed + r / kMr * kMr * pairs + r % kMr;
    auto pack_row = [&](auto* row) {
      for (int64_t p = 0; p < pairs; ++p) {
        const int32_t lo = row[2 * p];
        const int32_t hi = 2 * p + 1 < K ? int32_t(row[2 * p + 1]) : 0;
        out[p * kMr] = static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) | (static_cast<uint32_t>(lo) & 0xFFFFu));
      }
    };
    if (a_signed) pack_row(static_cast<const int8_t*>(a) + r * lda);
    else pack_row(static_cast<const uint8_t*>(a) + r * lda);
  }
}

// Interleaves rows 2p and 2p+1 of one 16-column panel into 32 packed bytes and adds both rows into
// the column sums. SSE2 (every x86-64 CPU) does the 16 columns at once; elsewhere a scalar loop.
#if defined(__SSE2__)
namespace {

struct PanelSums {
  __m128i lo16 = _mm_setzero_si128(), hi16 = _mm_setzero_si128();  // int16 partial sums, 8 columns each
  int32_t total[kNr] = {};
  int pending = 0;  // rows in the int16 sums, flushed before 128 rows of 255 could overflow them

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
  void flush() {
    alignas(16) int16_t parts[kNr];
    _mm_store_si128(reinterpret_cast<__m128i*>(parts), lo16);
    _mm_store_si128(reinterpret_cast<__m128i*>(parts + 8), hi16);
    for (int64_t j = 0; j < kNr; ++j) total[j] += parts[j];
    lo16 = hi16 = _mm_setzero_si128();
    pending = 0;
  }
};

}  // namespace
#endif

void pack_b_panel_rows(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel, int64_t p_begin,
                       int64_t p_end, int8_t* out_panel, int32_t* colsum, bool first) {
  const int64_t n0 = panel * kNr, cols = std::min(kNr, N - n0);
  const auto* bytes = static_cast<const uint8_t*>(b);
  auto* out = reinterpret_cast<uint8_t*>(out_panel);
  // Row k of this panel: read in place when the panel is full, else through a zero-padded buffer.
  auto row = [&](int64_t k, uint8_t* buffer) -> const uint8_t* {
    if (k < K && cols == kNr) return bytes + k * N + n0;
    std::memset(buffer, 0, kNr);
    if (k < K) std::memcpy(buffer, bytes + k * N + n0, static_cast<size_t>(cols));
    return buffer;
  };
  uint8_t buffer0[kNr], buffer1[kNr];
#if defined(__SSE2__)
  PanelSums sums;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(2 * p, buffer0)));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row(2 * p + 1, buffer1)));
    __m128i* dst = reinterpret_cast<__m128i*>(out + p * 2 * kNr);
    _mm_storeu_si128(dst, _mm_unpacklo_epi8(r0, r1));      // b[2p,n0] b[2p+1,n0] ... columns 0..7
    _mm_storeu_si128(dst + 1, _mm_unpackhi_epi8(r0, r1));  // columns 8..15
    sums.add(r0, b_signed);
    sums.add(r1, b_signed);
  }
  sums.flush();
  const int32_t* total = sums.total;
#else
  int32_t total[kNr] = {};
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint8_t* r0 = row(2 * p, buffer0);
    const uint8_t* r1 = row(2 * p + 1, buffer1);
    uint8_t* dst = out + p * 2 * kNr;
    for (int64_t j = 0; j < kNr; ++j) {
      dst[2 * j] = r0[j];
      dst[2 * j + 1] = r1[j];
      total[j] += b_signed ? int32_t(int8_t(r0[j])) + int32_t(int8_t(r1[j])) : int32_t(r0[j]) + int32_t(r1[j]);
    }
  }
#endif
  for (int64_t j = 0; j < cols; ++j) colsum[n0 + j] = (first ? 0 : colsum[n0 + j]) + total[j];
}

void pack_b_panels(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel0, int64_t panel1, int8_t* out,
                   int32_t* colsum) {
  // Sweeps of 64 rows across the whole group of panels: reading along b's rows keeps the TLB and
  // the prefetchers happy (one 16-column panel alone would touch a new page on every row).
  constexpr int64_t kPairsPerSweep = 32;
  const int64_t pairs = k_pairs(K);
  int64_t p0 = 0;
  do {  // at least once: K = 0 still sets the column sums
    const int64_t p1 = std::min(pairs, p0 + kPairsPerSweep);
    for (int64_t panel = panel0; panel < panel1; ++panel)
      pack_b_panel_rows(b, b_signed, K, N, panel, p0, p1, out + (panel - panel0) * pairs * 2 * kNr, colsum, p0 == 0);
    p0 = p1;
  } while (p0 < pairs);
}

namespace {

template <class TB>
void kernel_portable_t(const int32_t* a, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1, int32_t* c,
                       int64_t ldc) {
  const auto* b = reinterpret_cast<const TB*>(b_panel);
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t acc[kNr] = {};
    for (int64_t p = p0; p < p1; ++p) {
      const uint32_t pair = static_cast<uint32_t>(a[p * kMr + r]);
      const int32_t a0 = static_cast<int16_t>(pair & 0xFFFFu), a1 = static_cast<int16_t>(pair >> 16);
      const TB* bp = b + p * 2 * kNr;
      for (int64_t j = 0; j < kNr; ++j)
        acc[j] += static_cast<uint32_t>(a0 * int32_t(bp[2 * j]) + a1 * int32_t(bp[2 * j + 1]));
    }
    for (int64_t j = 0; j < kNr; ++j) c[r * ldc + j] = static_cast<int32_t>(acc[j]);
  }
}

void kernel_portable(const int32_t* a, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1, bool b_signed,
                     int32_t* c, int64_t ldc) {
  if (b_signed) kernel_portable_t<int8_t>(a, rows, b_panel, p0, p1, c, ldc);
  else kernel_portable_t<uint8_t>(a, rows, b_panel, p0, p1, c, ldc);
}

void requantize_row_portable(const int32_t* acc, const float* multiplier, const int32_t* zp, int64_t count,
                             bool y_signed, void* y) {
  const int32_t qmin = y_signed ? -128 : 0, qmax = y_signed ? 127 : 255;
  for (int64_t j = 0; j < count; ++j) {
    const int32_t q = requantize_onnxruntime(acc[j], multiplier[j], zp[j], qmin, qmax);
    if (y_signed) static_cast<int8_t*>(y)[j] = static_cast<int8_t>(q);
    else static_cast<uint8_t*>(y)[j] = static_cast<uint8_t>(q);
  }
}

// MatMulNBits level 0/1, portable: one dequantized column at a time, eight partial sums per dot
// product so that compilers vectorize it without reassociating anything themselves.
void nbits_rows_portable(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                         float* Y) {
  const int64_t K = w.K;
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> wrow;
  codes.resize(static_cast<size_t>(K));
  wrow.resize(static_cast<size_t>(K));
  for (int64_t n = n0; n < n1; ++n) {
    dequantize_column(w, n, codes.data(), wrow.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* a = A + m * K;
      float partial[8] = {};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; ++j) partial[j] += a[k + j] * wrow[k + j];
      float sum = 0.0f;
      for (; k < K; ++k) sum += a[k] * wrow[k];
      for (int j = 0; j < 8; ++j) sum += partial[j];
      Y[m * w.N + n] = bias ? sum + bias[n] : sum;
    }
  }
}

// MatMulNBits level 4, portable: codes decoded to bytes per column, exact int32 dot per block.
void nbits_rows_int8_portable(const QuantizedA& a, const NBitsWeight& w, int64_t n0, int64_t n1, const float* bias,
                              float* Y) {
  const int64_t kb = w.k_blocks, bs = w.block_size, padded = kb * bs;
  thread_local std::vector<uint8_t> codes;
  codes.resize(static_cast<size_t>(padded));
  for (int64_t n = n0; n < n1; ++n) {
    decode_nbits(w.codes + n * w.row_bytes, w.bits, padded, codes.data());  // padded codes meet qa = 0
    const float* scales = w.scales + n * kb;
    for (int64_t m = 0; m < a.M; ++m) {
      const int8_t* qa = a.qa + m * padded;
      float y = 0.0f, correction = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        int32_t dot = 0;
        for (int64_t j = b * bs; j < (b + 1) * bs; ++j) dot += int32_t(qa[j]) * int32_t(codes[j]);
        y += a.scale[m * kb + b] * scales[b] * static_cast<float>(dot);
        correction += a.block_sum[m * kb + b] * (scales[b] * zero_point(w, n * kb + b));
      }
      y -= correction;
      Y[m * w.N + n] = bias ? y + bias[n] : y;
    }
  }
}

}  // namespace

const QGemmKernels kPortableKernels = {Isa::kPortable, kernel_portable, requantize_row_portable, sgemm_rows_impl,
                                     nbits_rows_portable,     nbits_rows_int8_portable,
                                     nullptr,                 nullptr};

}  // namespace qmm
