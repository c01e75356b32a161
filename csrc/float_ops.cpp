// float_ops.cpp: the ONNX session's float32 element-wise chains and Softmax rows, with the bits of onnx.reference's numpy operations, over the thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "onnx_ops.h"
#include "thread_pool.h"

namespace qmm {

#if QMM_ERF_AVX512
namespace avx512f {  // kernels/float_chain_avx512.cpp
void chain_binary(ChainOp op, const float* l, int64_t l_step, const float* r, int64_t r_step, int64_t n, float* v);
}  // namespace avx512f
#endif
#if QMM_ERF_AVX512_EMULATED
namespace avx512f_emulated {
void chain_binary(ChainOp op, const float* l, int64_t l_step, const float* r, int64_t r_step, int64_t n, float* v);
}  // namespace avx512f_emulated
#endif

namespace {

constexpr int64_t kChunk = 256;  // elements of a chain's row worked on at a time (its values stay in L1)

// One operand's element strides over the output's (coalesced) dimensions.
struct Strided {
  const float* data;
  int64_t strides[kMaxChainRank];
};

void check_steps(const std::vector<ChainStep>& steps, size_t operands) {
  if (steps.empty()) throw std::invalid_argument("float_chain: no steps");
  for (size_t s = 0; s < steps.size(); ++s) {
    const ChainStep& step = steps[s];
    const bool unary = step.op == ChainOp::kErf || step.op == ChainOp::kSqrt || step.op == ChainOp::kNeg;
    for (int slot = 0; slot < (unary ? 1 : 2); ++slot) {
      const int32_t source = slot ? step.b : step.a;
      // the chain's value exists from the second step on; an operand index must name an operand
      if ((source == kChainValue && s == 0) || source < kChainValue || source >= static_cast<int32_t>(operands))
        throw std::invalid_argument("float_chain: a step reads an operand that is not there");
    }
  }
}

#include "float_chain_loops.inc"

}  // namespace

std::vector<int64_t> chain_shape(const std::vector<ChainOperand>& operands) {
  size_t rank = 0;
  for (const ChainOperand& o : operands) rank = std::max(rank, o.shape.size());
  if (rank > static_cast<size_t>(kMaxChainRank)) throw std::invalid_argument("float_chain: too many dimensions");
  std::vector<int64_t> shape(rank, 1);
  for (const ChainOperand& o : operands) {
    const size_t lead = rank - o.shape.size();
    for (size_t d = 0; d < o.shape.size(); ++d) {
      const int64_t n = o.shape[d];
      int64_t& out = shape[lead + d];
      if (n == out || n == 1) continue;
      if (out != 1) throw std::invalid_argument("float_chain: operands that do not broadcast together");
      out = n;
    }
  }
  return shape;
}

void float_chain(const std::vector<ChainOperand>& operands, const std::vector<ChainStep>& steps, const char* erf_path,
                 float* y) {
  check_steps(steps, operands.size());
  const std::vector<int64_t> shape = chain_shape(operands);
  const size_t rank = shape.size();
  int64_t count = 1;
  for (int64_t n : shape) count *= n;
  if (count == 0) return;
  // the path's erf and its build of the binary loops (avx512: the avx512f build's; the C library's erf: the
  // baseline's)
  const std::string path = *erf_path ? erf_path : qmm::erf_path();
  const ErfRange erf = erf_range(path.c_str());
  if (!erf) throw std::invalid_argument("float_chain: no such erf path");
  auto binary = chain_binary;
#if QMM_ERF_AVX512
  if (path == "avx512") binary = avx512f::chain_binary;
#endif
#if QMM_ERF_AVX512_EMULATED
  if (path == "avx512-emulated") binary = avx512f_emulated::chain_binary;
#endif

  // Coalesce the dimensions (leading ones dropped, and a dimension merged into the next where every
  // operand steps over both as over one): a same-shaped chain with scalars is one row.
  std::vector<int64_t> dims;
  std::vector<Strided> strided(operands.size());
  std::vector<std::vector<int64_t>> strides(operands.size());
  for (size_t d = 0; d < rank; ++d) {
    if (shape[d] == 1) continue;
    const bool merge = !dims.empty() && [&] {
      for (size_t k = 0; k < operands.size(); ++k) {
        const ChainOperand& o = operands[k];
        const size_t lead = rank - o.shape.size();
        const int64_t s = d >= lead && o.shape[d - lead] != 1 ? o.strides[d - lead] : 0;
        if (strides[k].back() != s * shape[d]) return false;
      }
      return true;
    }();
    for (size_t k = 0; k < operands.size(); ++k) {
      const ChainOperand& o = operands[k];
      const size_t lead = rank - o.shape.size();
      const int64_t s = d >= lead && o.shape[d - lead] != 1 ? o.strides[d - lead] : 0;
      if (merge) strides[k].back() = s;
      else strides[k].push_back(s);
    }
    if (merge) dims.back() *= shape[d];
    else dims.push_back(shape[d]);
  }
  if (dims.empty()) {  // one element
    dims.push_back(1);
    for (auto& s : strides) s.push_back(0);
  }
  const int64_t ndim = static_cast<int64_t>(dims.size()), cols = dims.back(), rows = count / cols;
  for (size_t k = 0; k < operands.size(); ++k) {
    strided[k].data = operands[k].data;
    std::copy(strides[k].begin(), strides[k].end(), strided[k].strides);
  }
  const int64_t chunks_per_row = (cols + kChunk - 1) / kChunk, chunks = rows * chunks_per_row;
  bool has_erf = false;
  for (const ChainStep& s : steps) has_erf = has_erf || s.op == ChainOp::kErf;
  const double chunk_ns = kChunk * (0.3 * static_cast<double>(steps.size()) + (has_erf ? 1.5 : 0.0));
  parallel_ranges(chunks, 16, tasks_worth_a_thread(16 * chunk_ns), [&](int64_t, int64_t c0, int64_t c1) {
    alignas(64) float scratch[kChunk];
    std::vector<float> gathered(operands.size() * kChunk);
    std::vector<const float*> rows_of(operands.size());
    std::vector<int64_t> steps_of(operands.size());
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t row = c / chunks_per_row, j0 = (c % chunks_per_row) * kChunk, n = std::min(kChunk, cols - j0);
      float* value = y + row * cols + j0;  // (the chain's value lives in the output)
      // each operand's chunk: in place where its elements are consecutive or one repeated (step 0), else
      // gathered
      for (size_t k = 0; k < operands.size(); ++k) {
        int64_t offset = 0, rest = row;
        for (int64_t d = ndim - 2; d >= 0; --d) {
          offset += (rest % dims[d]) * strided[k].strides[d];
          rest /= dims[d];
        }
        const int64_t step = strided[k].strides[ndim - 1];
        const float* start = strided[k].data + offset + j0 * step;
        steps_of[k] = step == 0 ? 0 : 1;
        if (step == 0 || step == 1) {
          rows_of[k] = start;
          continue;
        }
        float* g = gathered.data() + k * kChunk;
        for (int64_t i = 0; i < n; ++i) g[i] = start[i * step];
        rows_of[k] = g;
      }
      // a source's elements and its step (0: one value repeated)
      auto source = [&](int32_t s) -> const float* { return s == kChainValue ? value : rows_of[s]; };
      auto step_of = [&](int32_t s) -> int64_t { return s == kChainValue ? 1 : steps_of[s]; };
      for (const ChainStep& s : steps) {
        const float* a = source(s.a);
        if (s.op == ChainOp::kErf || s.op == ChainOp::kSqrt || s.op == ChainOp::kNeg) {
          if (!step_of(s.a)) {  // (one value repeated: spread it first)
            std::fill(scratch, scratch + n, *a);
            a = scratch;
          } else if (a == value && s.op == ChainOp::kErf) {  // (the erf loops read x again after writing y)
            std::memcpy(scratch, value, static_cast<size_t>(n) * sizeof(float));
            a = scratch;
          }
        }
        switch (s.op) {
          case ChainOp::kErf: erf(a, n, value); break;
          case ChainOp::kSqrt:
            for (int64_t i = 0; i < n; ++i) value[i] = std::sqrt(a[i]);
            break;
          case ChainOp::kNeg:
            for (int64_t i = 0; i < n; ++i) value[i] = -a[i];
            break;
          default: binary(s.op, a, step_of(s.a), source(s.b), step_of(s.b), n, value);
        }
      }
    }
  });
}

void softmax_shift_rows(const float* x, int64_t rows, int64_t cols, float* y) {
  const int64_t task = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, cols));
  parallel_ranges(rows, task, tasks_worth_a_thread(static_cast<double>(task * cols) * 0.3),
                  [&](int64_t, int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const float* in = x + r * cols;
                      float* out = y + r * cols;
                      // numpy's maximum: the row's NaN where it holds one (the first)
                      float m = -std::numeric_limits<float>::infinity();
                      bool nan = false;
                      for (int64_t j = 0; j < cols; ++j) {
                        m = in[j] > m ? in[j] : m;
                        nan = nan || in[j] != in[j];
                      }
                      if (nan) m = *std::find_if(in, in + cols, [](float v) { return v != v; });
                      for (int64_t j = 0; j < cols; ++j) out[j] = in[j] - m;
                    }
                  });
}

void softmax_normalize_rows(float* y, int64_t rows, int64_t cols) {
  const int64_t task = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, cols));
  parallel_ranges(rows, task, tasks_worth_a_thread(static_cast<double>(task * cols) * 0.3),
                  [&](int64_t, int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      float* row = y + r * cols;
                      const float sum = numpy_sum(row, cols);
                      for (int64_t j = 0; j < cols; ++j) row[j] = row[j] / sum;
                    }
                  });
}

}  // namespace qmm
