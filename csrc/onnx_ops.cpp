// onnx_ops.cpp: the ONNX session's Erf, DynamicQuantizeLinear, QLinearAdd / Mul / Softmax and code-table lookups (elementwise loops in tasks over the thread pool) and its heap settings.
#include "onnx_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cpu_features.h"
#include "dispatch.h"
#include "quantize_linear.h"
#include "thread_pool.h"

namespace qmm {

// QLinearAdd / QLinearMul's loops (qlinear_binary_loops.inc): portable (included at the end of this
// file) and the avx2 build's.
#define QMM_BINARY_DECLARATIONS                                                                                        \
  void qlinear_add_range(const void* x, const void* y, int64_t i0, int64_t i1, bool is_signed, float rx, float ry,     \
                         float k, void* out);                                                                          \
  void qlinear_mul_range(const void* x, const void* y, int64_t i0, int64_t i1, bool is_signed, int32_t zx, int32_t zy, \
                         float r, float zc, void* out);                                                                \
  void qlinear_softmax_range(const void* x, bool is_signed, int64_t r0, int64_t r1, int64_t D, const float* table,     \
                             double yd, int32_t y_zp, void* out);
namespace portable {
QMM_BINARY_DECLARATIONS
}  // namespace portable
#if QMM_BINARY_AVX2
namespace avx2 {
QMM_BINARY_DECLARATIONS
}  // namespace avx2
#endif
#undef QMM_BINARY_DECLARATIONS

#if QMM_ERF_AVX512
namespace avx512f {  // kernels/erf_avx512.cpp
void erf_f32_range(const float* x, int64_t count, float* y);
}  // namespace avx512f
#endif
#if QMM_ERF_AVX512_EMULATED
namespace avx512f_emulated {
void erf_f32_range(const float* x, int64_t count, float* y);
}  // namespace avx512f_emulated
#endif
#if QMM_LOOKUP_VBMI
namespace avx512vbmi {  // kernels/lookup_avx512vbmi.cpp
void lookup_bytes(const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out);
}  // namespace avx512vbmi
#endif
#if QMM_LOOKUP_VBMI_EMULATED
namespace avx512vbmi_emulated {
void lookup_bytes(const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out);
}  // namespace avx512vbmi_emulated
#endif

namespace {

// Elements [0, count) in tasks of `task` elements, each worth about task_ns nanoseconds.
template <class Range>
void over_tasks(int64_t count, int64_t task, double task_ns, Range&& range) {
  parallel_ranges(count, task, tasks_worth_a_thread(task_ns), range);
}

void erf_libm_range(const float* x, int64_t count, float* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = static_cast<float>(std::erf(static_cast<double>(x[i])));
}

template <class T>
void erf_libm(const T* x, int64_t count, float* y) {
  // About 17 ns per element (glibc 2.36, Zen 4): tasks of 4096 take about 70 us.
  over_tasks(count, 4096, 4096 * 17.0, [&](int64_t, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = static_cast<float>(std::erf(static_cast<double>(x[i])));
  });
}

// A vector loop over tasks of 16 K elements (about 1.5 ns each natively, Zen 4).
void erf_vector(ErfRange range, const float* x, int64_t count, float* y) {
  constexpr int64_t kTask = 16384;
  over_tasks(count, kTask, kTask * 1.5, [&](int64_t, int64_t i0, int64_t i1) { range(x + i0, i1 - i0, y + i0); });
}

#if QMM_ERF_AVX512
// Whether the CPU runs the avx512f build (hidden features aside: a path named explicitly runs).
bool has_avx512() { return (usable_features() & kAvx512Features) == kAvx512Features; }
#endif

bool erf_avx512_usable() {
#if QMM_ERF_AVX512
  return active_isa() >= Isa::kAvx512Vnni && has_avx512() && (hidden_features() & kAvx512Features) == 0;
#else
  return false;
#endif
}

// min and max of x[i0, i1) without NaN: a comparison with NaN is false, so NaN never replaces a bound.
void min_max_range(const float* x, int64_t i0, int64_t i1, float& lo, float& hi) {
  float l = std::numeric_limits<float>::infinity(), h = -l;
  int64_t i = i0;
#if defined(__SSE2__)
  // minps / maxps return their second operand when either is NaN: the bound, so a NaN x is skipped.
  // Four chains each (a chain's minps waits for its last one): 16 values per step.
  __m128 l4[4], h4[4];
  for (int u = 0; u < 4; ++u) l4[u] = _mm_set1_ps(l), h4[u] = _mm_set1_ps(h);
  for (; i + 16 <= i1; i += 16)
    for (int u = 0; u < 4; ++u) {
      const __m128 v = _mm_loadu_ps(x + i + 4 * u);
      l4[u] = _mm_min_ps(v, l4[u]);
      h4[u] = _mm_max_ps(v, h4[u]);
    }
  alignas(16) float lanes[2][4];
  _mm_store_ps(lanes[0], _mm_min_ps(_mm_min_ps(l4[0], l4[1]), _mm_min_ps(l4[2], l4[3])));
  _mm_store_ps(lanes[1], _mm_max_ps(_mm_max_ps(h4[0], h4[1]), _mm_max_ps(h4[2], h4[3])));
  for (int j = 0; j < 4; ++j) {
    l = lanes[0][j] < l ? lanes[0][j] : l;
    h = lanes[1][j] > h ? lanes[1][j] : h;
  }
#endif
  for (; i < i1; ++i) {
    l = x[i] < l ? x[i] : l;
    h = x[i] > h ? x[i] : h;
  }
  lo = l, hi = h;
}

// The smallest and largest non-NaN values of x[0 .. count) (+inf and -inf where there is none).
void min_max_f32(const float* x, int64_t count, float& lo, float& hi) {
  constexpr int64_t kTask = 1 << 16;  // 256 KB of x: some microseconds
  std::vector<float> los(static_cast<size_t>((count + kTask - 1) / kTask)), his(los.size());
  over_tasks(count, kTask, kTask * 0.1,
             [&](int64_t t, int64_t i0, int64_t i1) { min_max_range(x, i0, i1, los[t], his[t]); });
  lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (size_t t = 0; t < los.size(); ++t) {
    lo = los[t] < lo ? los[t] : lo;
    hi = his[t] > hi ? his[t] : hi;
  }
}

}  // namespace

const char* erf_path() { return erf_avx512_usable() ? "avx512" : "libm"; }

std::vector<std::string> erf_paths() {
  std::vector<std::string> paths{"libm"};
#if QMM_ERF_AVX512
  if (has_avx512()) paths.emplace_back("avx512");
#endif
#if QMM_ERF_AVX512_EMULATED
  paths.emplace_back("avx512-emulated");
#endif
  return paths;
}

ErfRange erf_range(const char* path) {
  const std::string name = *path ? path : erf_path();
  if (name == "libm") return erf_libm_range;
#if QMM_ERF_AVX512
  if (name == "avx512" && has_avx512()) return avx512f::erf_f32_range;
#endif
#if QMM_ERF_AVX512_EMULATED
  if (name == "avx512-emulated") return avx512f_emulated::erf_f32_range;
#endif
  return nullptr;
}

bool erf_f32(const float* x, int64_t count, float* y, const char* path) {
  const ErfRange range = erf_range(path);
  if (!range) return false;
  if (range == erf_libm_range) erf_libm(x, count, y);  // (its own task size: 17 ns a value)
  else erf_vector(range, x, count, y);
  return true;
}

void erf_f32(const double* x, int64_t count, float* y) { erf_libm(x, count, y); }

DynamicQuantization dynamic_quantization(const float* x, int64_t count) {
  float lo, hi;
  min_max_f32(x, count, lo, hi);  // no value (empty, all NaN): +inf, -inf, and the range below is [0, 0]
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  const float initial = 0.0f - lo / scale;
  const float clamped = std::max(0.0f, std::min(255.0f, initial));  // NaN: std::min returns 255
  return {scale, static_cast<uint8_t>(std::nearbyint(clamped))};  // round half to even (default rounding mode)
}

DynamicQuantization dynamic_quantize_linear(const float* x, int64_t count, uint8_t* y) {
  const DynamicQuantization q = dynamic_quantization(x, count);
  const int32_t zero_point = q.zero_point;
  quantize_linear_f32(x, LinearShape{count, 1, std::max<int64_t>(count, 1)}, &q.scale, &zero_point, IntType::kUInt8, y);
  return q;
}

namespace {

// One image's channel sums of x, [S, C] (channels_last) or [C, S], into sums [C] (int64: exact).
template <class T>
void channel_sums(const T* x, int64_t S, int64_t C, bool channels_last, int64_t* sums) {
  // int32 partial sums over runs of at most 2^23 values (|value| <= 255: no overflow), each added
  // into the int64 totals: int32 lanes vectorize, int64 ones hardly (7x7x1280 codes: 8 -> 2 us, Zen 4)
  constexpr int64_t kRun = int64_t{1} << 23;
  std::fill(sums, sums + C, int64_t{0});
  if (channels_last) {
    std::vector<int32_t> part(static_cast<size_t>(C));
    for (int64_t s0 = 0; s0 < S; s0 += kRun) {
      std::fill(part.begin(), part.end(), 0);
      int32_t* const p = part.data();
      for (int64_t s = s0; s < std::min(S, s0 + kRun); ++s) {
        const T* row = x + s * C;
        for (int64_t c = 0; c < C; ++c) p[c] += row[c];
      }
      for (int64_t c = 0; c < C; ++c) sums[c] += p[c];
    }
  } else {
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s0 = 0; s0 < S; s0 += kRun) {
        int32_t part = 0;
        for (int64_t s = s0; s < std::min(S, s0 + kRun); ++s) part += x[c * S + s];
        sums[c] += part;
      }
  }
}

}  // namespace

void qlinear_global_average_pool_codes(const void* x, bool is_signed, int64_t N, int64_t S, int64_t C,
                                       bool channels_last, int32_t x_zp, float scale, int32_t y_zp, void* y) {
  const float lo = static_cast<float>((is_signed ? -128 : 0) - y_zp),
              hi = static_cast<float>((is_signed ? 127 : 255) - y_zp);
  std::vector<int64_t> sums(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    if (is_signed) channel_sums(static_cast<const int8_t*>(x) + n * S * C, S, C, channels_last, sums.data());
    else channel_sums(static_cast<const uint8_t*>(x) + n * S * C, S, C, channels_last, sums.data());
    for (int64_t c = 0; c < C; ++c) {
      // MLAS's int32 accumulator: the sum less x_zp * S, wrapped to 32 bits
      const auto acc = static_cast<int32_t>(static_cast<uint32_t>(sums[c] - int64_t{x_zp} * S));
      float v = static_cast<float>(acc) * scale;
      if (std::isnan(v) || v < lo) v = lo;
      if (v > hi) v = hi;
      // half to even (the default rounding) without a libm call: |v| <= 510 here, and adding 1.5 * 2^23
      // leaves no fraction bits
      const int32_t q = static_cast<int32_t>((v + 0x1.8p23f) - 0x1.8p23f) + y_zp;
      if (is_signed) static_cast<int8_t*>(y)[n * C + c] = static_cast<int8_t>(q);
      else static_cast<uint8_t*>(y)[n * C + c] = static_cast<uint8_t>(q);
    }
  }
}

namespace {

// The build's loop `name` (qlinear_binary_loops.inc): the avx2 one where it runs now, else the portable one.
#if QMM_BINARY_AVX2
#define QMM_BINARY_RANGE(name) (avx2_loops_usable() ? avx2::name : portable::name)
#else
#define QMM_BINARY_RANGE(name) portable::name
#endif

// Elements [0, count) of x and y into out through range(x, y, i0, i1, params..., out), in tasks of 64 K
// (about 0.1 ns per element in AVX2; the baseline's libm fmaf takes a few ns). An operand of fewer
// elements (x_count or y_count below count, dividing it; not both) repeats: element i reads it at
// i % its count, the loops run over each repetition (one of fewer than 4 K bytes copied repeated
// first, so that the runs are long).
template <class Range, class... Params>
void over_codes(Range range, const void* x, int64_t x_count, const void* y, int64_t y_count, int64_t count, void* out,
                Params... params) {
  std::vector<uint8_t> repeated;
  const bool x_repeats = x_count < count, y_repeats = y_count < count;
  int64_t period = x_repeats ? x_count : y_count;
  if ((x_repeats || y_repeats) && period < 4096) {
    const auto* bytes = static_cast<const uint8_t*>(x_repeats ? x : y);
    const int64_t times = (4096 + period - 1) / period;
    repeated.resize(static_cast<size_t>(period * times));
    for (int64_t t = 0; t < times; ++t) std::copy(bytes, bytes + period, repeated.data() + t * period);
    (x_repeats ? x : y) = repeated.data();
    period *= times;
  }
  constexpr int64_t kTask = 65536;
  over_tasks(count, kTask, kTask * 0.1, [&](int64_t, int64_t i0, int64_t i1) {
    if (!x_repeats && !y_repeats) return range(x, y, i0, i1, params..., out);
    for (int64_t i = i0; i < i1;) {  // each repetition's part of [i0, i1), indexed from its start
      const int64_t start = i / period * period, end = std::min(i1, start + period);
      const auto at = [&](const void* p, bool repeats) {
        return static_cast<const uint8_t*>(p) + (repeats ? 0 : start);
      };
      range(at(x, x_repeats), at(y, y_repeats), i - start, end - start, params..., static_cast<uint8_t*>(out) + start);
      i = end;
    }
  });
}

}  // namespace

const char* qlinear_binary_path() {
  return QMM_BINARY_RANGE(qlinear_add_range) == portable::qlinear_add_range ? "portable" : "avx2";
}

void qlinear_add_codes(const void* x, int64_t x_count, const void* y, int64_t y_count, int64_t count, bool is_signed,
                       float rx, float ry, float k, void* out) {
  over_codes(QMM_BINARY_RANGE(qlinear_add_range), x, x_count, y, y_count, count, out, is_signed, rx, ry, k);
}

void qlinear_add_span(const void* x, const void* y, int64_t count, bool is_signed, float rx, float ry, float k,
                      void* out) {
  QMM_BINARY_RANGE(qlinear_add_range)(x, y, 0, count, is_signed, rx, ry, k, out);
}

void qlinear_mul_codes(const void* x, int64_t x_count, const void* y, int64_t y_count, int64_t count, bool is_signed,
                       int32_t zx, int32_t zy, float r, float zc, void* out) {
  over_codes(QMM_BINARY_RANGE(qlinear_mul_range), x, x_count, y, y_count, count, out, is_signed, zx, zy, r, zc);
}
void qlinear_softmax_rows(const void* x, bool is_signed, int64_t rows, int64_t D, const float* table, double yd,
                          int32_t y_zp, void* out) {
  // About 2 ns per element (a double division each): tasks of about 8 K elements.
  const int64_t task = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D));
  over_tasks(rows, task, static_cast<double>(task * D) * 2.0, [&](int64_t, int64_t r0, int64_t r1) {
    QMM_BINARY_RANGE(qlinear_softmax_range)(x, is_signed, r0, r1, D, table, yd, y_zp, out);
  });
}

#undef QMM_BINARY_RANGE

namespace {
// GCC's straight-line vectorizer assembles a step's byte values into a vector register with shifts
// and ors, three instructions a byte (0.65 ns per element): off here, each value stored as loaded.
#if defined(__GNUC__) && !defined(__clang__)
#define QMM_SCALAR_LOOP __attribute__((optimize("no-tree-vectorize", "no-tree-slp-vectorize")))
#else
#define QMM_SCALAR_LOOP
#endif
template <class T>
QMM_SCALAR_LOOP void lookup_step(const uint8_t* codes, int64_t n, const T* table, T* out) {
  // every code of the step read before its values are stored: a uint8 out (a char type: it may
  // alias the codes and the table) and codes at the same offset in their pages (4 K aliasing)
  // otherwise have each load wait for the store before it
  uint8_t step[64];
  std::memcpy(step, codes, static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[j] = table[step[j]];
}
#undef QMM_SCALAR_LOOP

template <class T>
void lookup_range(const uint8_t* codes, int64_t count, const T* table, T* out) {
  // A load of the code and one of the table each: 0.7-0.9 ns per byte entry measured on Zen 4 in
  // calls of 4-16 K (0.28 was assumed before): tasks of 16 K, steps of 64. Bytes on AVX-512 VBMI take
  // lookup_vector instead.
  constexpr int64_t kTask = 16384, kStep = 64;
  over_tasks(count, kTask, kTask * 0.8, [&](int64_t, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += kStep) lookup_step(codes + i, i1 - i < kStep ? i1 - i : kStep, table, out + i);
  });
}

using LookupBytes = void (*)(const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out);

// A vector loop over tasks of 256 K codes (about 0.02 ns each natively, Zen 4: a call of tens of
// thousands takes a microsecond or two, less than a helper's hand-off).
void lookup_vector(LookupBytes range, const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out) {
  constexpr int64_t kTask = 262144;
  over_tasks(count, kTask, kTask * 0.02,
             [&](int64_t, int64_t i0, int64_t i1) { range(codes + i0, i1 - i0, table, out + i0); });
}

#if QMM_LOOKUP_VBMI
bool has_vbmi() {
  constexpr Features kVbmi = kAvx512Features | kFeatAvx512vbmi;
  return (usable_features() & kVbmi) == kVbmi;
}
#endif

bool lookup_vbmi_usable() {
#if QMM_LOOKUP_VBMI
  return active_isa() >= Isa::kAvx512Vnni && has_vbmi() &&
         (hidden_features() & (kAvx512Features | kFeatAvx512vbmi)) == 0;
#else
  return false;
#endif
}

// The byte table through `path` (lookup_codes'); false where that path is not there.
bool lookup_bytes(const uint8_t* codes, int64_t count, const uint8_t* table, uint8_t* out, const char* path) {
  const std::string name = *path ? path : lookup_path();
  if (name == "scalar") {
    lookup_range(codes, count, table, out);
    return true;
  }
#if QMM_LOOKUP_VBMI
  if (name == "avx512vbmi" && has_vbmi()) {
    lookup_vector(avx512vbmi::lookup_bytes, codes, count, table, out);
    return true;
  }
#endif
#if QMM_LOOKUP_VBMI_EMULATED
  if (name == "avx512vbmi-emulated") {
    lookup_vector(avx512vbmi_emulated::lookup_bytes, codes, count, table, out);
    return true;
  }
#endif
  return false;
}
}  // namespace

const char* lookup_path() { return lookup_vbmi_usable() ? "avx512vbmi" : "scalar"; }

std::vector<std::string> lookup_paths() {
  std::vector<std::string> paths{"scalar"};
#if QMM_LOOKUP_VBMI
  if (has_vbmi()) paths.emplace_back("avx512vbmi");
#endif
#if QMM_LOOKUP_VBMI_EMULATED
  paths.emplace_back("avx512vbmi-emulated");
#endif
  return paths;
}

bool lookup_codes(const uint8_t* codes, int64_t count, const void* table, int element_bytes, void* out,
                  const char* path) {
  switch (element_bytes) {
    case 1: return lookup_bytes(codes, count, static_cast<const uint8_t*>(table), static_cast<uint8_t*>(out), path);
    case 2: lookup_range(codes, count, static_cast<const uint16_t*>(table), static_cast<uint16_t*>(out)); return true;
    case 4: lookup_range(codes, count, static_cast<const uint32_t*>(table), static_cast<uint32_t*>(out)); return true;
    case 8: lookup_range(codes, count, static_cast<const uint64_t*>(table), static_cast<uint64_t*>(out)); return true;
    default: return false;
  }
}

bool keep_heap(int64_t top_pad, int64_t mmap_threshold) {
  constexpr int64_t kMost = int64_t{1} << 30;
  if (top_pad < 0 || top_pad > kMost || mmap_threshold < 0 || mmap_threshold > kMost) return false;
#if defined(__GLIBC__)
  return mallopt(M_TOP_PAD, static_cast<int>(top_pad)) == 1 &&
         mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1;
#else
  return false;
#endif
}

}  // namespace qmm

#define QMM_BINARY_NS portable
#include "qlinear_binary_loops.inc"
