// conv.cpp: QLinearConv / ConvInteger's im2col over channels-last codes, depthwise sums and per-channel requantization, in tasks over the thread pool.
#include "conv.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "conv_field.h"
#include "dispatch.h"
#include "requantize.h"
#include "thread_pool.h"

namespace qmm {

namespace portable {  // conv_loops.inc, included at the end of this file
void depthwise_range(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w,
                     const DepthwiseSink& sink, int64_t r0, int64_t r1);
}  // namespace portable
#if QMM_CONV_AVX2
namespace avx2 {  // kernels/conv_avx2.cpp, and kernels/conv_depthwise_avx2.cpp (2-D)
void depthwise_range(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w,
                     const DepthwiseSink& sink, int64_t r0, int64_t r1);
QMM_DEPTHWISE_2D_DECLARATIONS
constexpr DepthwiseKernel2d kDepthwise2d{depthwise_2d_prepared_bytes, depthwise_2d_prepare, depthwise_2d_range};
}  // namespace avx2
#endif
#if QMM_CONV_AVX512
namespace avx512_vnni {  // kernels/conv_depthwise_avx512.cpp
QMM_DEPTHWISE_2D_DECLARATIONS
constexpr DepthwiseKernel2d kDepthwise2d{depthwise_2d_prepared_bytes, depthwise_2d_prepare, depthwise_2d_range};
}  // namespace avx512_vnni
#endif
#if QMM_CONV_AVX512_EMULATED
namespace avx512_vnni_emulated {  // the same source over SIMDe
QMM_DEPTHWISE_2D_DECLARATIONS
constexpr DepthwiseKernel2d kDepthwise2d{depthwise_2d_prepared_bytes, depthwise_2d_prepare, depthwise_2d_range};
}  // namespace avx512_vnni_emulated
#endif

int64_t ConvShape::positions() const {
  int64_t p = N;
  for (int64_t o : out) p *= o;
  return p;
}

int64_t ConvShape::taps() const {
  int64_t t = 1;
  for (int64_t k : kernel) t *= k;
  return t;
}

namespace {

// Rows per task: about 64 KB of columns (or of sums) each.
int64_t rows_per_task(int64_t row_bytes) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, row_bytes)); }

// ONNX Runtime's requantization (requantize.h's requantize_onnxruntime) in a form the compiler
// vectorizes without SSE4.1: after the clamp |v| <= 510, where adding and subtracting 1.5 * 2^23
// rounds half to even (the default rounding mode) exactly as nearbyint, and the float -> int
// conversion of the integer-valued result is exact. A NaN cannot arise (finite multiplier).
inline int32_t requantize_ort_vector(int32_t acc, float multiplier, int32_t zp, float lo, float hi) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  float v = static_cast<float>(acc) * multiplier;
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  v = (v + kRound) - kRound;
  return static_cast<int32_t>(v) + zp;
}

template <int Numerics, class Y>
void requantize_rows(const int32_t* acc, const int32_t* bias, int64_t r0, int64_t r1, int64_t cols,
                     const float* multiplier, float a_scale, const float* b_scale, float y_scale, int32_t zp, Y* y) {
  constexpr int32_t qmin = std::numeric_limits<Y>::min(), qmax = std::numeric_limits<Y>::max();
  const float lo = static_cast<float>(qmin - zp), hi = static_cast<float>(qmax - zp);
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* row = acc + r * cols;
    Y* out = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const int32_t v =
          bias ? static_cast<int32_t>(static_cast<uint32_t>(row[c]) + static_cast<uint32_t>(bias[c])) : row[c];
      int32_t q;
      if constexpr (Numerics == 0) {
        q = requantize_ort_vector(v, multiplier[c], zp, lo, hi);
      } else if constexpr (Numerics == 1) {
        q = requantize_onnx_reference(v, static_cast<double>(multiplier[c]), zp, qmin, qmax);
      } else {
        q = requantize_exact(v, a_scale, b_scale[c], y_scale, zp, qmin, qmax);
      }
      out[c] = static_cast<Y>(q);
    }
  }
}

template <int Numerics>
void requantize_task(const int32_t* acc, const int32_t* bias, int64_t r0, int64_t r1, int64_t cols,
                     const float* multiplier, float a_scale, const float* b_scale, float y_scale, int32_t zp,
                     bool y_signed, void* y) {
  if (y_signed) {
    requantize_rows<Numerics>(acc, bias, r0, r1, cols, multiplier, a_scale, b_scale, y_scale, zp,
                              static_cast<int8_t*>(y));
  } else {
    requantize_rows<Numerics>(acc, bias, r0, r1, cols, multiplier, a_scale, b_scale, y_scale, zp,
                              static_cast<uint8_t*>(y));
  }
}

#if defined(__SSE2__)
// out (16 rows of `out_stride` bytes) = the transpose of in's 16 x 16 bytes (rows `in_stride` apart),
// in four rounds of interleaving: bytes of row pairs, then 2-, 4- and 8-byte units.
inline void transpose16x16(const uint8_t* in, int64_t in_stride, uint8_t* out, int64_t out_stride) {
  __m128i r[16], a[8], b[8], q[4][4];
  for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * in_stride));
  for (int k = 0; k < 8; ++k) {  // a: columns 0-7, b: 8-15, each of rows 2k, 2k + 1 (byte pairs)
    a[k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
    b[k] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
  }
  for (int m = 0; m < 4; ++m) {  // q[x][m]: columns 4x .. 4x + 3 of rows 4m .. 4m + 3
    q[0][m] = _mm_unpacklo_epi16(a[2 * m], a[2 * m + 1]);
    q[1][m] = _mm_unpackhi_epi16(a[2 * m], a[2 * m + 1]);
    q[2][m] = _mm_unpacklo_epi16(b[2 * m], b[2 * m + 1]);
    q[3][m] = _mm_unpackhi_epi16(b[2 * m], b[2 * m + 1]);
  }
  for (int x = 0; x < 4; ++x) {
    const __m128i g0 = _mm_unpacklo_epi32(q[x][0], q[x][1]);  // columns 4x, 4x + 1 of rows 0-7
    const __m128i g1 = _mm_unpackhi_epi32(q[x][0], q[x][1]);  // columns 4x + 2, 4x + 3 of rows 0-7
    const __m128i h0 = _mm_unpacklo_epi32(q[x][2], q[x][3]);  // the same of rows 8-15
    const __m128i h1 = _mm_unpackhi_epi32(q[x][2], q[x][3]);
    auto* o = out + 4 * x * out_stride;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_unpacklo_epi64(g0, h0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + out_stride), _mm_unpackhi_epi64(g0, h0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * out_stride), _mm_unpacklo_epi64(g1, h1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 3 * out_stride), _mm_unpackhi_epi64(g1, h1));
  }
}
#endif

// [rows, cols] -> [cols, rows] for a few rows (an image's 1-4 channels to channels-last): each
// column's R values written together from R row pointers, no per-element index arithmetic.
template <int R, class T>
void transpose_few_rows(const T* in, int64_t cols, int64_t c0, int64_t c1, T* out) {
  const T* row[R];
  for (int r = 0; r < R; ++r) row[r] = in + r * cols;
  for (int64_t c = c0; c < c1; ++c)
    for (int r = 0; r < R; ++r) out[c * R + r] = row[r][c];
}

template <class T>
void transpose_planes(const T* src, int64_t batch, int64_t rows, int64_t cols, T* dst) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return;
  if (rows <= 4) {  // (columns in tasks of 16 K)
    constexpr int64_t kColumns = 16384;
    const int64_t per_batch = (cols + kColumns - 1) / kColumns;
    parallel_for(
        batch * per_batch,
        [&](int64_t t) {
          const int64_t b = t / per_batch, c0 = t % per_batch * kColumns, c1 = std::min(cols, c0 + kColumns);
          const T* in = src + b * rows * cols;
          T* out = dst + b * rows * cols;
          switch (rows) {
            case 1: return transpose_few_rows<1>(in, cols, c0, c1, out);
            case 2: return transpose_few_rows<2>(in, cols, c0, c1, out);
            case 3: return transpose_few_rows<3>(in, cols, c0, c1, out);
            default: return transpose_few_rows<4>(in, cols, c0, c1, out);
          }
        },
        tasks_worth_a_thread(static_cast<double>(kColumns * rows) * 0.5));
    return;
  }
  constexpr int64_t kTile = 64;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
  parallel_for(
      tiles,
      [&](int64_t t) {
        const int64_t b = t / (row_tiles * col_tiles), rt = t / col_tiles % row_tiles, ct = t % col_tiles;
        const int64_t r0 = rt * kTile, r1 = std::min(rows, r0 + kTile);
        const int64_t c0 = ct * kTile, c1 = std::min(cols, c0 + kTile);
        const T* in = src + b * rows * cols;
        T* out = dst + b * rows * cols;
#if defined(__SSE2__)
        if constexpr (sizeof(T) == 1) {  // whole 16 x 16 blocks with SSE2, the edges below
          const int64_t r16 = r0 + (r1 - r0) / 16 * 16, c16 = c0 + (c1 - c0) / 16 * 16;
          for (int64_t r = r0; r < r16; r += 16) {
            for (int64_t c = c0; c < c16; c += 16) transpose16x16(in + r * cols + c, cols, out + c * rows + r, rows);
          }
          for (int64_t c = c0; c < c1; ++c) {
            for (int64_t r = c < c16 ? r16 : r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
          }
          return;
        }
#endif
        for (int64_t c = c0; c < c1; ++c) {
          for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
        }
      },
      tasks_worth_a_thread(sizeof(T) == 1 ? 1000.0 : 4000.0));  // about 0.25 / 1 ns per element
}

}  // namespace

void transpose_planes(const void* src, int64_t element_bytes, int64_t batch, int64_t rows, int64_t cols, void* dst) {
  if (element_bytes == 1) {
    transpose_planes(static_cast<const uint8_t*>(src), batch, rows, cols, static_cast<uint8_t*>(dst));
  } else {
    transpose_planes(static_cast<const uint32_t*>(src), batch, rows, cols, static_cast<uint32_t*>(dst));
  }
}

void max_pool_bytes(const uint8_t* x, bool x_signed, const ConvShape& s, uint8_t* y) {
  const int64_t positions = s.positions(), C = s.C;
  // int8 codes compare as uint8 once their sign bit is flipped (x ^ 0x80 = x + 128), flipped back after
  const uint8_t flip = x_signed ? 0x80 : 0;
  const int64_t task = rows_per_task(C * std::max<int64_t>(1, s.taps()));
  const double task_ns = 0.1 * static_cast<double>(task * C * s.taps());  // about 0.1 ns per tap and channel
  parallel_ranges(positions, task, tasks_worth_a_thread(task_ns), [&](int64_t, int64_t r0, int64_t r1) {
    std::vector<const uint8_t*> taps(static_cast<size_t>(std::max<int64_t>(1, s.taps())));
    const bool planar = s.in.size() == 2;  // 2-D: the taps from the output's coordinates, no Field
    std::optional<Field> field;
    if (!planar) field.emplace(s);
    int64_t image = 0, oh = 0, ow = 0;  // (planar) row r0's output coordinates, then counted along
    if (planar) image = r0 / (s.out[0] * s.out[1]), oh = r0 / s.out[1] % s.out[0], ow = r0 % s.out[1];
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* out = y + r * C;
      int64_t n = 0;  // the window's taps inside x (padding never counts)
      if (planar) {
        const int64_t H = s.in[0], W = s.in[1];
        for (int64_t kh = 0; kh < s.kernel[0]; ++kh) {
          const int64_t ih = oh * s.strides[0] + kh * s.dilations[0] - s.pad_begin[0];
          if (ih < 0 || ih >= H) continue;
          for (int64_t kw = 0; kw < s.kernel[1]; ++kw) {
            const int64_t iw = ow * s.strides[1] + kw * s.dilations[1] - s.pad_begin[1];
            if (iw >= 0 && iw < W) taps[static_cast<size_t>(n++)] = x + ((image * H + ih) * W + iw) * C;
          }
        }
        if (++ow == s.out[1]) {
          ow = 0;
          if (++oh == s.out[0]) oh = 0, ++image;
        }
      } else {
        for (const int64_t offset : field->at(r))
          if (offset >= 0) taps[static_cast<size_t>(n++)] = x + offset * C;
      }
      // each block of channels' maximum over the taps in registers, stored once (the lowest code, 0
      // after the flip, where a window is all padding); four blocks at a time, four chains of maxima
      int64_t c = 0;
#if defined(__SSE2__)
      const __m128i vflip = _mm_set1_epi8(static_cast<char>(flip));
      const auto load = [&](int64_t t, int64_t at) {
        return _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(taps[t] + at)), vflip);
      };
      const auto store = [&](int64_t at, __m128i m) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + at), _mm_xor_si128(m, vflip));
      };
      for (; c + 64 <= C; c += 64) {
        __m128i m0 = _mm_setzero_si128(), m1 = m0, m2 = m0, m3 = m0;
        for (int64_t t = 0; t < n; ++t) {
          m0 = _mm_max_epu8(m0, load(t, c));
          m1 = _mm_max_epu8(m1, load(t, c + 16));
          m2 = _mm_max_epu8(m2, load(t, c + 32));
          m3 = _mm_max_epu8(m3, load(t, c + 48));
        }
        store(c, m0), store(c + 16, m1), store(c + 32, m2), store(c + 48, m3);
      }
      for (; c + 16 <= C; c += 16) {
        __m128i m = _mm_setzero_si128();
        for (int64_t t = 0; t < n; ++t) m = _mm_max_epu8(m, load(t, c));
        store(c, m);
      }
#endif
      for (; c < C; ++c) {
        uint8_t m = 0;
        for (int64_t t = 0; t < n; ++t) {
          const auto v = static_cast<uint8_t>(taps[t][c] ^ flip);
          m = v > m ? v : m;
        }
        out[c] = static_cast<uint8_t>(m ^ flip);
      }
    }
  });
}

namespace {

// n bytes from src to dst without a call for short runs (a 7 x 7 stem over 3 channels copies 21 bytes at
// a time): two possibly overlapping loads and stores, both inside [0, n).
inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n) {
  if (n >= 8 && n <= 16) {
    uint64_t head, tail;
    std::memcpy(&head, src, 8);
    std::memcpy(&tail, src + n - 8, 8);
    std::memcpy(dst, &head, 8);
    std::memcpy(dst + n - 8, &tail, 8);
#if defined(__SSE2__)
  } else if (n > 16 && n <= 32) {
    const __m128i head = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i tail = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + n - 16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), head);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + n - 16), tail);
#endif
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n));
  }
}

// Rows [r0, r1) of the im2col of a 2-D convolution with one group and undilated kernel columns: each
// kernel row's taps are consecutive pixels of one input row, so each is one run of up to kw * C bytes
// (padding where the input row, or columns at the edges, fall outside x), no per-tap offsets.
void columns_2d(const uint8_t* x, const ConvShape& s, uint8_t pad, int64_t row_bytes, uint8_t* columns, int64_t r0,
                int64_t r1) {
  const int64_t H = s.in[0], W = s.in[1], OH = s.out[0], OW = s.out[1], KH = s.kernel[0], KW = s.kernel[1], C = s.C;
  const int64_t kw_bytes = KW * C, tail = row_bytes - KH * kw_bytes;
  int64_t n = r0 / (OH * OW), oh = r0 / OW % OH, ow = r0 % OW;  // then counted along, not divided per row
  for (int64_t r = r0; r < r1;
       ++r, ow = ow + 1 < OW ? ow + 1 : 0, oh = ow ? oh : (oh + 1 < OH ? oh + 1 : 0), n = ow || oh ? n : n + 1) {
    const int64_t iw0 = ow * s.strides[1] - s.pad_begin[1];  // the input column of kernel column 0
    const int64_t lo = std::max<int64_t>(0, -iw0), hi = std::min<int64_t>(KW, W - iw0);  // columns inside x
    uint8_t* out = columns + r * row_bytes;
    for (int64_t kh = 0; kh < KH; ++kh, out += kw_bytes) {
      const int64_t ih = oh * s.strides[0] + kh * s.dilations[0] - s.pad_begin[0];
      if (ih < 0 || ih >= H || hi <= lo) {
        std::memset(out, pad, static_cast<size_t>(kw_bytes));
        continue;
      }
      if (lo > 0) std::memset(out, pad, static_cast<size_t>(lo * C));
      copy_bytes(out + lo * C, x + ((n * H + ih) * W + iw0 + lo) * C, (hi - lo) * C);
      if (hi < KW) std::memset(out + hi * C, pad, static_cast<size_t>((KW - hi) * C));
    }
    for (int64_t i = 0; i < tail; ++i) out[i] = pad;  // the row's padding to row_bytes (a few bytes)
  }
}

}  // namespace

void conv_offsets(const ConvShape& s, int32_t* offsets) {
  const int64_t positions = s.positions(), taps = s.taps(), C = s.C;
  const int64_t task = rows_per_task(taps * 4);
  parallel_ranges(positions, task, tasks_worth_a_thread(static_cast<double>(task * taps) * 2.0),
                  [&](int64_t, int64_t r0, int64_t r1) {
                    Field field(s);
                    for (int64_t r = r0; r < r1; ++r) {
                      const auto& pixel = field.at(r);
                      for (int64_t t = 0; t < taps; ++t)
                        offsets[r * taps + t] = pixel[t] < 0 ? -1 : static_cast<int32_t>(pixel[t] * C);
                    }
                  });
}

void conv_columns(const uint8_t* x, const ConvShape& s, uint8_t pad, int64_t row_bytes, uint8_t* columns) {
  const int64_t positions = s.positions(), taps = s.taps(), Cg = s.C / s.group;
  const int64_t task = rows_per_task(row_bytes * s.group);
  // about 0.12 ns per byte copied and 2 ns per tap placed (Zen 4)
  const double task_ns = static_cast<double>(task) * (0.12 * static_cast<double>(row_bytes * s.group) + 2.0 * taps);
  if (s.in.size() == 2 && s.group == 1 && s.dilations[1] == 1) {
    parallel_ranges(positions, task, tasks_worth_a_thread(task_ns),
                    [&](int64_t, int64_t r0, int64_t r1) { columns_2d(x, s, pad, row_bytes, columns, r0, r1); });
    return;
  }
  parallel_ranges(positions, task, tasks_worth_a_thread(task_ns), [&](int64_t, int64_t r0, int64_t r1) {
    Field field(s);
    for (int64_t r = r0; r < r1; ++r) {
      const auto& offsets = field.at(r);
      for (int64_t g = 0; g < s.group; ++g) {
        uint8_t* out = columns + (g * positions + r) * row_bytes;
        for (int64_t t = 0; t < taps;) {
          // a run of taps on consecutive pixels (with one group, consecutive bytes of x), or of padding
          int64_t run = 1;
          if (offsets[t] < 0) {
            while (t + run < taps && offsets[t + run] < 0) ++run;
            std::memset(out, pad, static_cast<size_t>(run * Cg));
          } else {
            if (s.group == 1) {
              while (t + run < taps && offsets[t + run] == offsets[t] + run) ++run;
            }
            std::memcpy(out, x + offsets[t] * s.C + g * Cg, static_cast<size_t>(run * Cg));
          }
          t += run;
          out += run * Cg;
        }
        std::memset(out, pad, static_cast<size_t>(row_bytes - taps * Cg));  // the row's padding to row_bytes
      }
    }
  });
}

namespace {

// A 2-D depthwise kernel, its name and its time per product (one thread, 3 x 3 taps, Zen 4).
struct Depthwise2dChoice {
  const DepthwiseKernel2d* kernel = nullptr;  // null: none
  const char* name = nullptr;
  double product_ns = 0.0;
};

// The 2-D depthwise kernel for the kernel level in use: the AVX-512 one at avx512_vnni and above (the
// emulated one under an emulated level), else the AVX2 one where the avx2 loops run.
Depthwise2dChoice depthwise_2d_kernel() {
  if (active_isa() >= Isa::kAvx512Vnni && active_emulated()) {
#if QMM_CONV_AVX512_EMULATED
    return {&avx512_vnni_emulated::kDepthwise2d, "avx512_vnni-emulated", 0.05};
#endif
  }
#if QMM_CONV_AVX512
  constexpr Features kNeeds = kAvx512Features | kFeatAvx512vnni;
  if (active_isa() >= Isa::kAvx512Vnni && !active_emulated() &&
      (usable_features() & ~hidden_features() & kNeeds) == kNeeds)
    return {&avx512_vnni::kDepthwise2d, "avx512_vnni", 0.05};
#endif
#if QMM_CONV_AVX2
  if (avx2_loops_usable()) return {&avx2::kDepthwise2d, "avx2", 0.08};
#endif
  return {};
}

}  // namespace

const char* conv_depthwise_path() {
  const char* name = depthwise_2d_kernel().name;
  return name ? name : "portable";
}

namespace {

// The depthwise loop of the build in use, with its rows per task and a task's time: the 2-D kernel
// (kernel2d, AVX2 or AVX-512, with the geometry as numbers) for a 1- or 2-D convolution of up to
// kDepthwiseMaxTaps taps where there is one; the avx2 or portable loop (range) otherwise.
struct DepthwiseLoop {
  void (*range)(const void*, bool, const ConvShape&, int32_t, const int16_t*, const DepthwiseSink&, int64_t, int64_t);
  const DepthwiseKernel2d* kernel2d;
  DepthwiseGeometry g;
  int64_t task;
  double task_ns;
};

DepthwiseLoop depthwise_loop(const ConvShape& s) {
  DepthwiseLoop loop{
      portable::depthwise_range, nullptr, {}, rows_per_task(s.C * 4 * std::max<int64_t>(1, s.taps() / 4)), 0.0};
#if QMM_CONV_AVX2
  if (avx2_loops_usable()) loop.range = avx2::depthwise_range;
#endif
  loop.task_ns = 0.3 * static_cast<double>(loop.task * s.C * s.taps());  // about 0.3 ns per product
  const size_t nd = s.in.size();
  const Depthwise2dChoice kernel2d = depthwise_2d_kernel();
  if (kernel2d.kernel && (nd == 1 || nd == 2) && s.taps() <= kDepthwiseMaxTaps) {
    const bool one = nd == 1;  // a 1-D convolution: 2-D of height 1
    auto first = [&](const std::vector<int64_t>& v, int64_t height) { return one ? height : v[0]; };
    auto last = [&](const std::vector<int64_t>& v) { return v[nd - 1]; };
    loop.kernel2d = kernel2d.kernel;
    loop.g = DepthwiseGeometry{s.N,
                               s.C,
                               first(s.in, 1),
                               last(s.in),
                               first(s.out, 1),
                               last(s.out),
                               first(s.kernel, 1),
                               last(s.kernel),
                               first(s.strides, 1),
                               last(s.strides),
                               first(s.dilations, 1),
                               last(s.dilations),
                               first(s.pad_begin, 0),
                               last(s.pad_begin)};
    // tasks of about 16 K products (the constants are formed once per call)
    loop.task = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.C * s.taps()));
    loop.task_ns = kernel2d.product_ns * static_cast<double>(loop.task * s.C * s.taps());
  }
  return loop;
}

// The 2-D kernel's constants for one call, 64-byte aligned.
class Prepared2d {
 public:
  Prepared2d(const DepthwiseLoop& loop, int32_t x_zp, const int16_t* w, const DepthwiseRequantization* requantization)
      : bytes_(static_cast<size_t>(loop.kernel2d->prepared_bytes(loop.g)) + 63) {
    loop.kernel2d->prepare(loop.g, x_zp, w, requantization, data());
  }
  void* data() { return bytes_.data() + (64 - reinterpret_cast<uintptr_t>(bytes_.data()) % 64) % 64; }

 private:
  std::vector<uint8_t> bytes_;
};

// Rows [r0, r1) of acc requantized into y (rows from r0) in one of requantize_columns' numerics.
void requantize_range(int numerics, const int32_t* acc, const int32_t* bias, int64_t r0, int64_t r1, int64_t cols,
                      const float* m, float a_scale, const float* b_scale, float y_scale, int32_t zp, bool y_signed,
                      void* y) {
  if (numerics == 0) requantize_task<0>(acc, bias, r0, r1, cols, m, a_scale, b_scale, y_scale, zp, y_signed, y);
  else if (numerics == 1) requantize_task<1>(acc, bias, r0, r1, cols, m, a_scale, b_scale, y_scale, zp, y_signed, y);
  else requantize_task<2>(acc, bias, r0, r1, cols, m, a_scale, b_scale, y_scale, zp, y_signed, y);
}

}  // namespace

void conv_depthwise(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w, int32_t* acc) {
  const DepthwiseLoop loop = depthwise_loop(s);
  if (loop.kernel2d) {
    Prepared2d prepared(loop, x_zp, w, nullptr);
    parallel_ranges(s.positions(), loop.task, tasks_worth_a_thread(loop.task_ns), [&](int64_t, int64_t r0, int64_t r1) {
      loop.kernel2d->range(x, x_signed, loop.g, prepared.data(), DepthwiseSink{acc + r0 * s.C}, nullptr, r0, r1);
    });
    return;
  }
  parallel_ranges(s.positions(), loop.task, tasks_worth_a_thread(loop.task_ns), [&](int64_t, int64_t r0, int64_t r1) {
    loop.range(x, x_signed, s, x_zp, w, DepthwiseSink{acc + r0 * s.C}, r0, r1);
  });
}

void conv_depthwise_requantized(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w,
                                const int32_t* bias, const float* multiplier, float a_scale, const float* b_scale,
                                float y_scale, int32_t zp, bool y_signed, void* y, int numerics) {
  const int64_t C = s.C;
  if (s.positions() == 0 || C == 0) return;
  const DepthwiseLoop loop = depthwise_loop(s);
  // The loop hands over blocks of about 16 KB of int32 sums, requantized while they are in L1 (its
  // per-task setup, the weights' interleaving and the taps' placement, once per task, not per block).
  struct Requantize {
    const int32_t* bias;
    const float *multiplier, *b_scale;
    float a_scale, y_scale;
    int32_t zp, numerics;
    int64_t C;
    bool y_signed;
    void* y;
  } params{bias, multiplier, b_scale, a_scale, y_scale, zp, numerics, C, y_signed, y};
  auto done = [](void* context, const int32_t* sums, int64_t b0, int64_t b1) {
    const auto& p = *static_cast<const Requantize*>(context);
    void* out = static_cast<uint8_t*>(p.y) + b0 * p.C;  // (one byte per output)
    requantize_range(p.numerics, sums, p.bias, 0, b1 - b0, p.C, p.multiplier, p.a_scale, p.b_scale, p.y_scale, p.zp,
                     p.y_signed, out);
  };
  const int64_t block = std::max<int64_t>(1, 4096 / C);
  // The 2-D kernel: ONNX Runtime's numerics in its registers, the others' through the blocks
  const DepthwiseRequantization in_registers{bias, multiplier, zp, y_signed, static_cast<uint8_t*>(y)};
  const DepthwiseRequantization* requantization = numerics == 0 ? &in_registers : nullptr;
  Prepared2d* prepared = nullptr;
  std::optional<Prepared2d> kernel_constants;
  if (loop.kernel2d) prepared = &kernel_constants.emplace(loop, x_zp, w, requantization);
  parallel_ranges(s.positions(), loop.task, tasks_worth_a_thread(loop.task_ns), [&](int64_t, int64_t r0, int64_t r1) {
    if (prepared && requantization) {
      loop.kernel2d->range(x, x_signed, loop.g, prepared->data(), DepthwiseSink{nullptr}, requantization, r0, r1);
      return;
    }
    thread_local std::vector<int32_t> sums;
    sums.resize(static_cast<size_t>(std::min(block, r1 - r0) * C));
    const DepthwiseSink sink{sums.data(), block, done, &params};
    if (prepared) loop.kernel2d->range(x, x_signed, loop.g, prepared->data(), sink, nullptr, r0, r1);
    else loop.range(x, x_signed, s, x_zp, w, sink, r0, r1);
  });
}

void requantize_columns(const int32_t* acc, const int32_t* bias, int64_t rows, int64_t cols, const float* multiplier,
                        float a_scale, const float* b_scale, float y_scale, int32_t zp, bool y_signed, void* y,
                        int numerics) {
  if (rows == 0 || cols == 0) return;
  // The exact numerics' 128-bit arithmetic takes about 20x the float path's time per element.
  const int64_t task = rows_per_task(cols * (numerics == 2 ? 80 : 4));
  // about 0.7 ns per element (the exact numerics' 128-bit arithmetic: 40)
  const double task_ns = static_cast<double>(task * cols) * (numerics == 2 ? 40.0 : 0.7);
  parallel_ranges(rows, task, tasks_worth_a_thread(task_ns), [&](int64_t, int64_t r0, int64_t r1) {
    requantize_range(numerics, acc, bias, r0, r1, cols, multiplier, a_scale, b_scale, y_scale, zp, y_signed, y);
  });
}

}  // namespace qmm

#define QMM_CONV_NS portable
#include "conv_loops.inc"
