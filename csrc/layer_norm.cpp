// layer_norm.cpp: ONNX LayerNormalization as onnx.reference computes it in numpy (float32, the same bits), rows over the thread pool.
#include <algorithm>
#include <cmath>
#include <vector>

#include "onnx_ops.h"
#include "thread_pool.h"

namespace qmm {

namespace {

// numpy's pairwise float32 sum of n contiguous values (numpy/_core/src/umath/loops_utils.h.src,
// pairwise_sum): below 8 one after another from -0.0; up to 128, eight running sums of every eighth
// value, added as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the n % 8 left one after
// another; above, the two halves' sums (the first a multiple of 8 long) added.
float pairwise_sum(const float* a, int64_t n) {
  if (n < 8) {
    float sum = -0.0f;
    for (int64_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  int64_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

}  // namespace

// np.sum along a contiguous row: the reduction's identity +0.0 plus the row's pairwise sum (a row of
// -0.0 sums to +0.0).
float numpy_sum(const float* a, int64_t n) { return 0.0f + pairwise_sum(a, n); }

void layer_norm_rows(const float* x, int64_t rows, int64_t cols, const float* scale, const float* bias, float epsilon,
                     float* y, float* mean, float* inv_std_dev, const float* residual) {
  const float n = static_cast<float>(cols);  // (numpy: the float32 array over a Python int, in float32)
  // About a nanosecond per element (two sums, five roundings each): tasks of about 8 K elements.
  const int64_t task = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, cols));
  parallel_ranges(
      rows, task, tasks_worth_a_thread(static_cast<double>(task * cols)), [&](int64_t, int64_t r0, int64_t r1) {
        std::vector<float> squares(static_cast<size_t>(cols));
        for (int64_t r = r0; r < r1; ++r) {
          const float* in = x + r * cols;
          float* out = y + r * cols;
          if (residual) {  // the row of x + residual (an Add node's float32 sum), normalized in place
            const float* add = residual + r * cols;
            for (int64_t j = 0; j < cols; ++j) out[j] = in[j] + add[j];
            in = out;
          }
          const float m = numpy_sum(in, cols) / n;  // x_mean
          for (int64_t j = 0; j < cols; ++j) {
            const float d = in[j] - m;  // x_diff
            out[j] = d;
            squares[static_cast<size_t>(j)] = d * d;  // x_squared_diff
          }
          const float variance = numpy_sum(squares.data(), cols) / n;
          const float inv = 1.0f / std::sqrt(variance + epsilon);  // np.reciprocal(np.sqrt(variance + epsilon))
          for (int64_t j = 0; j < cols; ++j) {
            float v = out[j] * inv;  // y_mat
            v = v * scale[j];  // * W
            if (bias) v = v + bias[j];
            out[j] = v;
          }
          mean[r] = m;
          inv_std_dev[r] = inv;
        }
      });
}

}  // namespace qmm
