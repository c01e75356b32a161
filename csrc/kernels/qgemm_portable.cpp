// qgemm_portable.cpp: the portable entries of every family: int8 GEMM kernel and epilogue (int16-pairs layout), MatMulNBits, float8 GEMM.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <vector>

#include "dispatch.h"
#include "matmul_nbits.h"
#include "qgemm.h"
#include "requantize.h"

namespace qmm {
#include "nbits_dequantize.inc"
#include "sgemm_rows.inc"
}  // namespace qmm

namespace qmm {

namespace {

constexpr int64_t kMr = 4, kNr = 16;  // kPairsLayout

template <class TB>
void kernel_portable_t(const int32_t* a, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1, bool accumulate,
                       int32_t* c, int64_t ldc) {
  const auto* b = reinterpret_cast<const TB*>(b_panel);
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t acc[kNr] = {};
    if (accumulate)
      for (int64_t j = 0; j < kNr; ++j) acc[j] = static_cast<uint32_t>(c[r * ldc + j]);
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

void kernel_portable(const int32_t* a, int64_t, int64_t rows, const int8_t* b_panel, int64_t p0, int64_t p1,
                     bool b_signed, bool accumulate, int32_t* c, int64_t ldc) {
  if (b_signed) kernel_portable_t<int8_t>(a, rows, b_panel, p0, p1, accumulate, c, ldc);
  else kernel_portable_t<uint8_t>(a, rows, b_panel, p0, p1, accumulate, c, ldc);
}

// Small products read in place (csrc/qgemm.h): one row of int32 sums at a time, k outer.
void small_product_portable(const void* a, bool a_signed, int64_t lda, const int32_t* za, const void* b, bool b_signed,
                            int64_t ldb, const int32_t* zb, int64_t rows, int64_t K, int64_t cols, int32_t* c,
                            int64_t ldc) {
  auto value = [](const void* x, bool is_signed, int64_t i) {
    return is_signed ? int32_t{static_cast<const int8_t*>(x)[i]} : int32_t{static_cast<const uint8_t*>(x)[i]};
  };
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* out = c + r * ldc;
    std::fill(out, out + cols, 0);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t x = value(a, a_signed, r * lda + k) - za[r];
      for (int64_t j = 0; j < cols; ++j) out[j] += x * (value(b, b_signed, k * ldb + j) - zb[j]);
    }
  }
}

void requantize_rows_portable(const int32_t* raw, int64_t ld, const RowTerms* terms, int64_t rows,
                              const float* multiplier, int64_t multiplier_ld, const int32_t* zp, int64_t zp_ld,
                              int64_t count, bool y_signed, uint8_t* y, int64_t ldy) {
  const int32_t qmin = y_signed ? -128 : 0, qmax = y_signed ? 127 : 255;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < count; ++j) {
      const int32_t q = requantize_onnxruntime(row_terms_applied(raw + r * ld, terms[r], j),
                                               multiplier[r * multiplier_ld + j], zp[r * zp_ld + j], qmin, qmax);
      y[r * ldy + j] = static_cast<uint8_t>(y_signed ? static_cast<uint8_t>(static_cast<int8_t>(q)) : q);
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

const QGemmDispatch kPortableQGemm = {
    .info = {.name = "portable", .isa = Isa::kPortable, .needs = 0, .emulated = false},
    .layout = &kPairsLayout,
    .pack_a = pack_a_pairs,
    .pack_b_panels = pack_b_pairs,
    .kernel = kernel_portable,
    .requantize_onnxruntime = requantize_rows_portable,
    .begin_task = nullptr,
    .small_product = small_product_portable,
};
const NBitsDispatch kPortableNBits = {
    .info = {.name = "portable", .isa = Isa::kPortable, .needs = 0, .emulated = false},
    .rows = nbits_rows_portable,
    .rows_int8 = nbits_rows_int8_portable,
    .prepare_int8 = nullptr,
    .prepare_f32 = nullptr,
    .round_operands = nullptr,
};
const Float8Dispatch kPortableFloat8 = {
    .info = {.name = "portable", .isa = Isa::kPortable, .needs = 0, .emulated = false},
    .a_group = 1,
    .sgemm_rows = sgemm_rows_impl,
};

}  // namespace qmm
