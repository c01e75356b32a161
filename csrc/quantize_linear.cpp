// quantize_linear.cpp: quantize_linear's driver: tasks of elements over the thread pool, the choice of loop build.
#include "quantize_linear.h"

#include "dispatch.h"
#include "thread_pool.h"

// The baseline build of the loops.
#define QMM_QUANTIZE_NS portable
#include "quantize_linear_loops.inc"
#undef QMM_QUANTIZE_NS

namespace qmm {

#if QMM_QUANTIZE_AVX2
namespace avx2 {  // kernels/quantize_linear_avx2.cpp
void quantize_linear_range(const float* x, const LinearShape& s, const float* scale, const int32_t* zero_point,
                           IntType type, void* y, int64_t i0, int64_t i1);
void dequantize_linear_range(const void* x, IntType type, const LinearShape& s, const float* scale,
                             const int32_t* zero_point, float* y, int64_t i0, int64_t i1);
}  // namespace avx2
#endif

namespace {

// Tasks of 64 K elements (a few tens of microseconds each), at least 4 per thread woken.
template <class Range>
void over_tasks(int64_t count, Range&& range) {
  parallel_ranges(count, 65536, 4, [&](int64_t, int64_t i0, int64_t i1) { range(i0, i1); });
}

}  // namespace

void quantize_linear_f32(const float* x, const LinearShape& shape, const float* scale, const int32_t* zero_point,
                         IntType type, void* y) {
  auto* range = portable::quantize_linear_range;
#if QMM_QUANTIZE_AVX2
  if (avx2_loops_usable()) range = avx2::quantize_linear_range;
#endif
  over_tasks(shape.count, [&](int64_t i0, int64_t i1) { range(x, shape, scale, zero_point, type, y, i0, i1); });
}

void dequantize_linear_f32(const void* x, IntType type, const LinearShape& shape, const float* scale,
                           const int32_t* zero_point, float* y) {
  auto* range = portable::dequantize_linear_range;
#if QMM_QUANTIZE_AVX2
  if (avx2_loops_usable()) range = avx2::dequantize_linear_range;
#endif
  over_tasks(shape.count, [&](int64_t i0, int64_t i1) { range(x, type, shape, scale, zero_point, y, i0, i1); });
}

const char* quantize_linear_path() { return avx2_loops_usable() ? "avx2" : "portable"; }

}  // namespace qmm
