// qgemm_portable.cpp: packing (shared by every path) and the portable C++ int8 GEMM kernel and epilogue.
#include <algorithm>
#include <cstring>

#include "qgemm.h"
#include "requantize.h"

namespace qmm {
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

void pack_b_panel(const void* b, bool b_signed, int64_t K, int64_t N, int64_t panel, int8_t* packed, int32_t* colsum) {
  const int64_t pairs = k_pairs(K);
  const int64_t n0 = panel * kNr, cols = std::min(kNr, N - n0);
  const auto* bytes = static_cast<const uint8_t*>(b);
  auto* out = reinterpret_cast<uint8_t*>(packed) + panel * pairs * 2 * kNr;
  static const uint8_t zeros[kNr] = {};
  int32_t sums[kNr] = {};
  for (int64_t p = 0; p < pairs; ++p) {
    uint8_t row0[kNr] = {}, row1[kNr] = {};
    std::memcpy(row0, bytes + 2 * p * N + n0, static_cast<size_t>(cols));
    std::memcpy(row1, 2 * p + 1 < K ? bytes + (2 * p + 1) * N + n0 : zeros, static_cast<size_t>(cols));
    uint8_t* dst = out + p * 2 * kNr;
    for (int64_t j = 0; j < kNr; ++j) {  // interleave the two rows: b[2p, n], b[2p+1, n], ...
      dst[2 * j] = row0[j];
      dst[2 * j + 1] = row1[j];
    }
    if (b_signed) {
      for (int64_t j = 0; j < kNr; ++j) sums[j] += int32_t(int8_t(row0[j])) + int32_t(int8_t(row1[j]));
    } else {
      for (int64_t j = 0; j < kNr; ++j) sums[j] += int32_t(row0[j]) + int32_t(row1[j]);
    }
  }
  for (int64_t j = 0; j < cols; ++j) colsum[n0 + j] = sums[j];
}

namespace {

template <class TB>
void kernel_portable_t(const int32_t* a, int64_t rows, const int8_t* b_panels,
                       int64_t panels, int64_t pairs_total, int64_t p0, int64_t p1, int32_t* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t panel = 0; panel < panels; ++panel) {
      uint32_t acc[kNr] = {};
      const auto* b = reinterpret_cast<const TB*>(b_panels + panel * pairs_total * 2 * kNr);
      for (int64_t p = p0; p < p1; ++p) {
        const uint32_t pair = static_cast<uint32_t>(a[p * kMr + r]);
        const int32_t a0 = static_cast<int16_t>(pair & 0xFFFFu), a1 = static_cast<int16_t>(pair >> 16);
        const TB* bp = b + p * 2 * kNr;
        for (int64_t j = 0; j < kNr; ++j)
          acc[j] += static_cast<uint32_t>(a0 * int32_t(bp[2 * j]) + a1 * int32_t(bp[2 * j + 1]));
      }
      for (int64_t j = 0; j < kNr; ++j) c[r * ldc + panel * kNr + j] = static_cast<int32_t>(acc[j]);
    }
  }
}

void kernel_portable(const int32_t* a, int64_t rows, const int8_t* b_panels, int64_t panels,
                     int64_t pairs_total, int64_t p0, int64_t p1, bool b_signed, int32_t* c, int64_t ldc) {
  if (b_signed) kernel_portable_t<int8_t>(a, rows, b_panels, panels, pairs_total, p0, p1, c, ldc);
  else kernel_portable_t<uint8_t>(a, rows, b_panels, panels, pairs_total, p0, p1, c, ldc);
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

}  // namespace

const QGemmKernels kPortableKernels = {Isa::kPortable, kernel_portable, requantize_row_portable, sgemm_rows_impl};

}  // namespace qmm
