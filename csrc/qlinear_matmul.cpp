// qlinear_matmul.cpp: portable C++ QLinearMatMul: blocked exact integer accumulation plus the fused epilogues.
#include "qlinear_matmul.h"

#include <algorithm>
#include <vector>

#include "requantize.h"

namespace qmm {
namespace {

constexpr int64_t kRows = 4;          // rows of a per block: each row of b is reused 4 times
constexpr int64_t kCols = 512;        // columns per block: 4 x 512 int32 accumulators stay in L1
constexpr int64_t kDepth = 1 << 15;   // K chunk: 2^15 products of at most 255*255 fit in int32

// Calls epilogue(batch, m, n0, count, acc) with the exact (64-bit) accumulators
// acc[j] = sum_k (a[m,k] - a_zp[m]) * (b[k,n0+j] - b_zp[n0+j]) for every row m and column block.
//
// The zero points come out of the inner loop (docs/quantization.md, "Zero-point terms"):
//   acc = sum a*b - b_zp * rowsum(a) - a_zp * colsum(b) + K * a_zp * b_zp.
template <class TA, class TB, class Epilogue>
void accumulate(const QGemmProblem& p, Epilogue&& epilogue) {
  const int64_t M = p.M, N = p.N, K = p.K;
  const auto* a_all = static_cast<const TA*>(p.a);
  const auto* b_all = static_cast<const TB*>(p.b);
  std::vector<int32_t> acc32(kRows * kCols);
  std::vector<int64_t> acc64(kRows * kCols);
  std::vector<int64_t> colsum(N);
  int64_t colsum_of = -1;  // which b matrix colsum holds

  for (int64_t bt = 0; bt < p.batch; ++bt) {
    const int64_t ia = p.a_index[bt], ib = p.b_index[bt];
    const TA* a = a_all + ia * M * K;
    const TB* b = b_all + ib * K * N;
    const int32_t* a_zp = p.a_zero_point + ia * M;
    const int32_t* b_zp = p.b_zero_point + ib * N;
    if (colsum_of != ib) {
      std::fill(colsum.begin(), colsum.end(), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) colsum[n] += b[k * N + n];
      colsum_of = ib;
    }
    for (int64_t m0 = 0; m0 < M; m0 += kRows) {
      const int64_t rows = std::min(kRows, M - m0);
      int64_t rowsum[kRows] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < K; ++k) rowsum[r] += a[(m0 + r) * K + k];
      for (int64_t n0 = 0; n0 < N; n0 += kCols) {
        const int64_t cols = std::min(kCols, N - n0);
        std::fill(acc64.begin(), acc64.end(), 0);
        for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
          const int64_t k1 = std::min(K, k0 + kDepth);
          std::fill(acc32.begin(), acc32.end(), 0);
          for (int64_t k = k0; k < k1; ++k) {
            const TB* brow = b + k * N + n0;
            for (int64_t r = 0; r < rows; ++r) {
              const int32_t av = a[(m0 + r) * K + k];
              int32_t* acc = acc32.data() + r * kCols;
              for (int64_t j = 0; j < cols; ++j) acc[j] += av * static_cast<int32_t>(brow[j]);
            }
          }
          for (int64_t i = 0; i < rows * kCols; ++i) acc64[i] += acc32[i];
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t m = m0 + r, za = a_zp[m];
          int64_t* acc = acc64.data() + r * kCols;
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t zb = b_zp[n0 + j];
            acc[j] += -zb * rowsum[r] - za * colsum[n0 + j] + K * za * zb;
          }
          epilogue(bt, m, n0, cols, acc);
        }
      }
    }
  }
}

template <class Epilogue>
void dispatch_signedness(const QGemmProblem& p, Epilogue&& epilogue) {
  if (p.a_signed) {
    if (p.b_signed) accumulate<int8_t, int8_t>(p, epilogue);
    else accumulate<int8_t, uint8_t>(p, epilogue);
  } else {
    if (p.b_signed) accumulate<uint8_t, int8_t>(p, epilogue);
    else accumulate<uint8_t, uint8_t>(p, epilogue);
  }
}

// Runs the accumulation and writes requantize(acc, b, m, n) into the 8-bit output.
template <class Requantize>
void run(const QGemmProblem& p, const QOutput& out, Requantize&& requantize) {
  const int32_t qmin = out.is_signed ? -128 : 0, qmax = out.is_signed ? 127 : 255;
  const int64_t M = p.M, N = p.N;
  auto epilogue = [&](int64_t bt, int64_t m, int64_t n0, int64_t cols, const int64_t* acc) {
    const int64_t base = (bt * M + m) * N + n0;
    for (int64_t j = 0; j < cols; ++j) {
      const int32_t q = requantize(acc[j], bt, m, n0 + j, out.zero_point(bt, m, n0 + j), qmin, qmax);
      if (out.is_signed) static_cast<int8_t*>(out.data)[base + j] = static_cast<int8_t>(q);
      else static_cast<uint8_t*>(out.data)[base + j] = static_cast<uint8_t>(q);
    }
  };
  dispatch_signedness(p, epilogue);
}

// The int32 accumulator of numerics "onnxruntime" and "onnx-reference": the exact sum modulo 2^32,
// which is what a wrapping int32 accumulation of the same products gives.
inline int32_t wrap32(int64_t acc) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(acc)));
}

}  // namespace

void qlinear_matmul_onnxruntime(const QGemmProblem& p, View3<float> multiplier, QOutput out) {
  run(p, out, [&](int64_t acc, int64_t b, int64_t m, int64_t n, int32_t zp, int32_t qmin, int32_t qmax) {
    return requantize_onnxruntime(wrap32(acc), multiplier(b, m, n), zp, qmin, qmax);
  });
}

void qlinear_matmul_onnx_reference(const QGemmProblem& p, View3<double> multiplier, QOutput out) {
  run(p, out, [&](int64_t acc, int64_t b, int64_t m, int64_t n, int32_t zp, int32_t qmin, int32_t qmax) {
    return requantize_onnx_reference(wrap32(acc), multiplier(b, m, n), zp, qmin, qmax);
  });
}

void qlinear_matmul_exact(const QGemmProblem& p, View3<float> a_scale, View3<float> b_scale,
                          View3<float> y_scale, QOutput out) {
  run(p, out, [&](int64_t acc, int64_t b, int64_t m, int64_t n, int32_t zp, int32_t qmin, int32_t qmax) {
    return requantize_exact(acc, a_scale(b, m, n), b_scale(b, m, n), y_scale(b, m, n), zp, qmin, qmax);
  });
}

void matmul_f32_sequential(int64_t batch, int64_t M, int64_t N, int64_t K, const float* a,
                           const int64_t* a_index, const float* b, const int64_t* b_index, float* out) {
  for (int64_t bt = 0; bt < batch; ++bt) {
    const float* A = a + a_index[bt] * M * K;
    const float* B = b + b_index[bt] * K * N;
    float* Y = out + bt * M * N;
    for (int64_t m = 0; m < M; ++m) {
      float* y = Y + m * N;
      std::fill(y, y + N, 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const float av = A[m * K + k];
        const float* brow = B + k * N;
        for (int64_t n = 0; n < N; ++n) {
          const float product = av * brow[n];  // rounded on its own: built with -ffp-contract=off
          y[n] = y[n] + product;
        }
      }
    }
  }
}

void matmul_i64_exact128(int64_t batch, int64_t M, int64_t N, int64_t K, const int64_t* a,
                         const int64_t* a_index, const int64_t* b, const int64_t* b_index,
                         int64_t* out_hi, uint64_t* out_lo) {
  std::vector<__int128> acc(N);
  for (int64_t bt = 0; bt < batch; ++bt) {
    const int64_t* A = a + a_index[bt] * M * K;
    const int64_t* B = b + b_index[bt] * K * N;
    for (int64_t m = 0; m < M; ++m) {
      std::fill(acc.begin(), acc.end(), 0);
      for (int64_t k = 0; k < K; ++k) {
        const __int128 av = A[m * K + k];
        const int64_t* brow = B + k * N;
        for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
      }
      const int64_t base = (bt * M + m) * N;
      for (int64_t n = 0; n < N; ++n) {
        out_hi[base + n] = static_cast<int64_t>(acc[n] >> 64);
        out_lo[base + n] = static_cast<uint64_t>(acc[n]);
      }
    }
  }
}

}  // namespace qmm
