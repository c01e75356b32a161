// conv_depthwise_avx512.cpp: 2-D depthwise convolution sums on AVX-512 VNNI (32 channels a step, two taps per vpdpwssd), handed on as int32 or requantized in registers as ONNX Runtime does; picked at run time by conv.cpp.
//
// Per output position and block of 32 channels, the sum over taps of (x - x_zp) * w is formed as
//
//   init + sum over every tap t of x_t * w_t,   init = bias - x_zp * sum_t w_t   (int32, wrapping)
//
// with a tap in the padding reading a row of x_zp bytes: it adds x_zp * w_t, which init takes away
// again, so the padding adds nothing, as the spec's sum, and the taps need no test in the loop. The
// same value modulo 2^32 as the portable loop's (every step an int32 addition). x's bytes widen to
// int16 (zero- or sign-extended), taps 2p and 2p + 1 interleave as int16 pairs (vpunpck[lh]wd), and
// vpdpwssd adds x_a * w_a + x_b * w_b to each int32 lane: |x| <= 255, |w| <= 255 (w minus its zero
// point), so each product and pair is exact, and the instruction's int32 addition wraps (no
// saturation). The unpacks work within 128-bit lanes: `lo` holds channels 0-3, 8-11, 16-19, 24-27
// of a block and `hi` 4-7, 12-15, 20-23, 28-31; init, the multipliers and the weights are laid out
// in that order once per task, and the output puts the channels back in order.
//
// Built in the avx512_vnni build (natively and over SIMDe, QMM_EMULATED, for the tests).
#include "avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "conv.h"

namespace qmm {
namespace QMM_KERNEL_NS {
// csrc/conv.h's DepthwiseKernel2d
int64_t depthwise_2d_prepared_bytes(const DepthwiseGeometry& g);
void depthwise_2d_prepare(const DepthwiseGeometry& g, int32_t x_zp, const int16_t* w,
                          const DepthwiseRequantization* requantization, void* prepared);
void depthwise_2d_range(const void* x, bool x_signed, const DepthwiseGeometry& g, const void* prepared,
                        const DepthwiseSink& sink, const DepthwiseRequantization* requantization, int64_t r0,
                        int64_t r1);
}  // namespace QMM_KERNEL_NS

namespace {

constexpr int kBlock = 32;  // channels a step

// The channel of int32 lane i (0-15) of lo (half 0) or hi (half 1) within a block.
constexpr int lane_channel(int half, int i) { return 8 * (i / 4) + 4 * half + i % 4; }

// 32 bytes of x widened to int16: `count` (1-32) of them from p, the rest 0 (never read past p + count);
// Full: count is 32.
template <bool Signed, bool Full>
inline __m512i widened(const uint8_t* p, int count) {
  __m256i bytes;
  if (Full) {
    bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
#if defined(QMM_EMULATED)  // (SIMDe has no masked byte loads)
    alignas(32) uint8_t buffer[kBlock] = {};
    std::memcpy(buffer, p, static_cast<size_t>(count));
    bytes = _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
#else
    bytes = _mm256_maskz_loadu_epi8(static_cast<__mmask32>((uint64_t{1} << count) - 1), p);
#endif
  }
#if defined(QMM_EMULATED)  // (SIMDe lacks _mm512_cvtepu8_epi16)
  const __m512i words = _mm512_cvtepi8_epi16(bytes);
  return Signed ? words : _mm512_and_si512(words, _mm512_set1_epi16(0xFF));
#else
  return Signed ? _mm512_cvtepi8_epi16(bytes) : _mm512_cvtepu8_epi16(bytes);
#endif
}

// acc + each lane's pair of int16 products (vpdpwssd), wrapping.
inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) { return _mm512_dpwssd_epi32(acc, a, b); }

// The low bytes of 16 lanes holding values of the output's type.
inline __m128i low_bytes(__m512i q, bool y_signed) {
#if defined(QMM_EMULATED)  // SIMDe lacks _mm512_cvtepi32_epi8: through int16
  const __m256i words = _mm512_cvtsepi32_epi16(q);
  const __m128i w0 = _mm256_castsi256_si128(words), w1 = _mm256_extracti128_si256(words, 1);
  return y_signed ? _mm_packs_epi16(w0, w1) : _mm_packus_epi16(w0, w1);
#else
  (void)y_signed;
  return _mm512_cvtepi32_epi8(q);
#endif
}

// `count` (1-32) bytes of `from` (32) to p.
inline void store_bytes(uint8_t* p, __m256i from, int count) {
  if (count == kBlock) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), from);
    return;
  }
  alignas(32) uint8_t buffer[kBlock];
  _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), from);
  std::memcpy(p, buffer, static_cast<size_t>(count));
}

// `count` (1-16) int32 of `from` to p.
inline void store_ints(int32_t* p, __m512i from, int count) {
  if (count >= 16) {
    _mm512_storeu_si512(p, from);
    return;
  }
  if (count <= 0) return;
  alignas(64) int32_t buffer[16];
  _mm512_store_si512(buffer, from);
  std::memcpy(p, buffer, static_cast<size_t>(count) * sizeof(int32_t));
}

// count (0-16) int32 from p, the rest 0 (never read past p + count).
inline __m512i load_ints(const void* p, int count) {
  if (count >= 16) return _mm512_loadu_si512(p);
  alignas(64) int32_t buffer[16] = {};
  if (count > 0) std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int32_t));
  return _mm512_load_si512(buffer);
}

// count (1-32) int16 from p, the rest 0.
inline __m512i load_words(const int16_t* p, int count) {
  if (count == kBlock) return _mm512_loadu_si512(p);
  alignas(64) int16_t buffer[kBlock] = {};
  std::memcpy(buffer, p, static_cast<size_t>(count) * sizeof(int16_t));
  return _mm512_load_si512(buffer);
}

// A call's weights and constants, formed once (prepare) in memory its caller owns (64-byte aligned,
// prepared_bytes): per block b of 32 channels, init lo / hi, the multipliers lo / hi (requantizing
// only), then per tap pair p the interleaved weights lo / hi (w_a, w_b unpacked as x's bytes are: the
// lanes line up), each 64 bytes; then x_zp's byte in every channel of the blocks (the padding's pixel).
// Channels past C have weight 0.
class Prepared {
 public:
  Prepared(const DepthwiseGeometry& g, void* data)
      : blocks_((g.C + kBlock - 1) / kBlock),
        pairs_((g.KH * g.KW + 1) / 2),
        per_block_(4 + 2 * pairs_),
        data_(static_cast<__m512i*>(data)) {}

  static int64_t bytes(const DepthwiseGeometry& g) {
    const Prepared layout(g, nullptr);
    return layout.blocks_ * layout.per_block_ * 64 + layout.blocks_ * kBlock;
  }

  void prepare(const DepthwiseGeometry& g, int32_t x_zp, const int16_t* w, const DepthwiseRequantization* rq) {
    const int64_t C = g.C, taps = g.KH * g.KW;
    // natural channel order (two vectors of 16 int32) -> lo's lanes, hi's
    const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i to_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i ones = _mm512_set1_epi16(1), zp = _mm512_set1_epi32(x_zp);
    for (int64_t b = 0; b < blocks_; ++b) {
      __m512i* block = data_ + b * per_block_;
      const int count = static_cast<int>(C - b * kBlock < kBlock ? C - b * kBlock : kBlock);
      __m512i sum_lo = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();  // sum_t w_t, lanes as lo / hi
      for (int64_t p = 0; p < pairs_; ++p) {
        const __m512i wa = load_words(w + 2 * p * C + b * kBlock, count);
        const __m512i wb = 2 * p + 1 < taps ? load_words(w + (2 * p + 1) * C + b * kBlock, count) : _mm512_setzero_si512();
        block[4 + 2 * p] = _mm512_unpacklo_epi16(wa, wb);
        block[5 + 2 * p] = _mm512_unpackhi_epi16(wa, wb);
        sum_lo = dpwssd(sum_lo, block[4 + 2 * p], ones);
        sum_hi = dpwssd(sum_hi, block[5 + 2 * p], ones);
      }
      __m512i bias_lo = _mm512_setzero_si512(), bias_hi = bias_lo;
      if (rq && rq->bias) {
        const __m512i b0 = load_ints(rq->bias + b * kBlock, count), b1 = load_ints(rq->bias + b * kBlock + 16, count - 16);
        bias_lo = _mm512_permutex2var_epi32(b0, to_lo, b1);
        bias_hi = _mm512_permutex2var_epi32(b0, to_hi, b1);
      }
      block[0] = _mm512_sub_epi32(bias_lo, _mm512_mullo_epi32(zp, sum_lo));  // wrapping
      block[1] = _mm512_sub_epi32(bias_hi, _mm512_mullo_epi32(zp, sum_hi));
      block[2] = block[3] = _mm512_setzero_si512();
      if (rq) {
        const __m512i m0 = load_ints(rq->multiplier + b * kBlock, count);
        const __m512i m1 = load_ints(rq->multiplier + b * kBlock + 16, count - 16);
        block[2] = _mm512_permutex2var_epi32(m0, to_lo, m1);
        block[3] = _mm512_permutex2var_epi32(m0, to_hi, m1);
      }
    }
    std::memset(zp_row(), static_cast<uint8_t>(x_zp), static_cast<size_t>(blocks_ * kBlock));
  }

  const __m512i* block(int64_t b) const { return data_ + b * per_block_; }
  const uint8_t* zp_row() const { return reinterpret_cast<const uint8_t*>(data_ + blocks_ * per_block_); }
  int64_t blocks() const { return blocks_; }
  int64_t pairs() const { return pairs_; }

 private:
  uint8_t* zp_row() { return reinterpret_cast<uint8_t*>(data_ + blocks_ * per_block_); }

  int64_t blocks_, pairs_, per_block_;
  __m512i* data_;
};

// The sums of one output position's block (taps: 2 * pairs pointers to its pixels' channels, from
// `offset`; `count` channels, all 32 where Full), as lo / hi. Pairs > 0: that many pairs (unrolled);
// 0: `pairs`.
template <bool Signed, bool Full, int Pairs>
inline void block_sums(const uint8_t* const* taps, int64_t pairs, int64_t offset, int count, const __m512i* block,
                       __m512i& lo, __m512i& hi) {
  lo = block[0];
  hi = block[1];
  const int64_t n = Pairs > 0 ? Pairs : pairs;
  for (int64_t p = 0; p < n; ++p) {
    const __m512i a = widened<Signed, Full>(taps[2 * p] + offset, count);
    const __m512i b = widened<Signed, Full>(taps[2 * p + 1] + offset, count);
    lo = dpwssd(lo, _mm512_unpacklo_epi16(a, b), block[4 + 2 * p]);
    hi = dpwssd(hi, _mm512_unpackhi_epi16(a, b), block[5 + 2 * p]);
  }
}

// A task's loop over output positions: the prepared constants and the requantization's, formed once.
template <bool Signed>
class Positions {
 public:
  Positions(const Prepared& prep, int64_t C, const DepthwiseRequantization* rq) : prep_(prep), C_(C), rq_(rq) {
    const int32_t zp = rq ? rq->zp : 0, qmin = rq && rq->y_signed ? -128 : 0, qmax = rq && rq->y_signed ? 127 : 255;
    lo_bound_ = _mm512_set1_ps(static_cast<float>(qmin - zp));
    hi_bound_ = _mm512_set1_ps(static_cast<float>(qmax - zp));
    zp_ = _mm512_set1_epi32(zp);
  }

  // One position's C channels (its taps at `taps`): its int32 sums to `sums`, or requantized to `y`.
  void operator()(const uint8_t* const* taps, int32_t* sums, uint8_t* y) const {
    if (prep_.pairs() == 5) run<5>(taps, sums, y);  // 3 x 3
    else run<0>(taps, sums, y);
  }

 private:
  template <int Pairs>
  void run(const uint8_t* const* taps, int32_t* sums, uint8_t* y) const {
    // int32 lanes back in channel order: channels 0-15 from lo / hi's lanes 0-7, 16-31 from 8-15
    const __m512i order0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i order1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t b = 0; b < prep_.blocks(); ++b) {
      const int count = static_cast<int>(C_ - b * kBlock < kBlock ? C_ - b * kBlock : kBlock);
      const __m512i* block = prep_.block(b);
      __m512i lo, hi;
      if (count == kBlock) block_sums<Signed, true, Pairs>(taps, prep_.pairs(), b * kBlock, count, block, lo, hi);
      else block_sums<Signed, false, Pairs>(taps, prep_.pairs(), b * kBlock, count, block, lo, hi);
      if (!rq_) {
        store_ints(sums + b * kBlock, _mm512_permutex2var_epi32(lo, order0, hi), count);
        store_ints(sums + b * kBlock + 16, _mm512_permutex2var_epi32(lo, order1, hi), count - 16);
        continue;
      }
      // 4-byte groups: lo has channels 0-3, 8-11, 16-19, 24-27, hi the groups between
      const __m128i bytes_lo = requantized(lo, block[2]), bytes_hi = requantized(hi, block[3]);
      store_bytes(y + b * kBlock,
                  _mm256_setr_m128i(_mm_unpacklo_epi32(bytes_lo, bytes_hi), _mm_unpackhi_epi32(bytes_lo, bytes_hi)),
                  count);
    }
  }

  // ONNX Runtime's requantization (csrc/requantize.h): f32(acc) * multiplier, clamped (max, then min,
  // as MLAS), rounded half to even (the default MXCSR), plus the zero point; the low bytes.
  __m128i requantized(__m512i acc, __m512i multiplier) const {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_castsi512_ps(multiplier));
    v = _mm512_min_ps(_mm512_max_ps(v, lo_bound_), hi_bound_);
    return low_bytes(_mm512_add_epi32(_mm512_cvtps_epi32(v), zp_), rq_->y_signed);
  }

  const Prepared& prep_;
  int64_t C_;
  const DepthwiseRequantization* rq_;
  __m512 lo_bound_, hi_bound_;
  __m512i zp_;
};

template <bool Signed>
void rows(const uint8_t* x, const DepthwiseGeometry& g, const Prepared& prep, const DepthwiseSink& sink,
          const DepthwiseRequantization* rq, int64_t r0, int64_t r1) {
  const int64_t C = g.C, KH = g.KH, KW = g.KW, taps = KH * KW;
  const uint8_t* const zp_row = prep.zp_row();
  const Positions<Signed> position(prep, C, rq);
  // Each tap's offset from its window's first pixel (kh = kw = 0), and the output columns whose
  // windows lie inside x's width: [ow_in0, ow_in1).
  int64_t offset[kDepthwiseMaxTaps];
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) offset[kh * KW + kw] = (kh * g.dh * g.W + kw * g.dw) * C;
  const int64_t ow_in0 = (g.pw + g.sw - 1) / g.sw, last_iw = (KW - 1) * g.dw - g.pw;  // iw of kw = KW - 1 at ow 0
  const int64_t ow_in1 = g.W - 1 - last_iw < 0 ? 0 : (g.W - 1 - last_iw) / g.sw + 1;
  const uint8_t* tap[kDepthwiseMaxTaps + 1];
  const uint8_t* row_at[kDepthwiseMaxTaps];  // per kh: x's input row (pixel 0), or null outside x
  int64_t n = r0 / (g.OH * g.OW), oh = r0 / g.OW % g.OH, ow = r0 % g.OW;
  int64_t b0 = r0;  // the first row at sink.acc
  bool new_row = true, rows_inside = false;
  for (int64_t r = r0; r < r1; ++r) {
    if (new_row) {
      rows_inside = true;
      for (int64_t kh = 0; kh < KH; ++kh) {
        const int64_t ih = oh * g.sh + kh * g.dh - g.ph;
        row_at[kh] = ih >= 0 && ih < g.H ? x + (n * g.H + ih) * g.W * C : nullptr;
        rows_inside = rows_inside && row_at[kh];
      }
      new_row = false;
    }
    const int64_t iw0 = ow * g.sw - g.pw;
    if (rows_inside && ow >= ow_in0 && ow < ow_in1) {  // the window inside x
      const uint8_t* first = row_at[0] + iw0 * C;
      for (int64_t t = 0; t < taps; ++t) tap[t] = first + offset[t];
    } else {
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          const int64_t iw = iw0 + kw * g.dw;
          tap[kh * KW + kw] = row_at[kh] && iw >= 0 && iw < g.W ? row_at[kh] + iw * C : zp_row;
        }
    }
    tap[taps] = tap[taps - 1];  // an odd count's last pair: its second weight is 0
    if (rq) {
      position(tap, nullptr, rq->y + r * C);
    } else {
      position(tap, sink.acc + (r - b0) * C, nullptr);
      if (sink.done && (r + 1 - b0 == sink.block || r + 1 == r1)) {
        sink.done(sink.context, sink.acc, b0, r + 1);
        b0 = r + 1;
      }
    }
    if (++ow == g.OW) {
      ow = 0, new_row = true;
      if (++oh == g.OH) oh = 0, ++n;
    }
  }
}

}  // namespace

namespace QMM_KERNEL_NS {

int64_t depthwise_2d_prepared_bytes(const DepthwiseGeometry& g) { return Prepared::bytes(g); }

void depthwise_2d_prepare(const DepthwiseGeometry& g, int32_t x_zp, const int16_t* w,
                          const DepthwiseRequantization* requantization, void* prepared) {
  Prepared(g, prepared).prepare(g, x_zp, w, requantization);
}

void depthwise_2d_range(const void* x, bool x_signed, const DepthwiseGeometry& g, const void* prepared,
                        const DepthwiseSink& sink, const DepthwiseRequantization* requantization, int64_t r0,
                        int64_t r1) {
  if (r0 >= r1 || g.C <= 0) return;
  const Prepared prep(g, const_cast<void*>(prepared));
  const auto* bytes = static_cast<const uint8_t*>(x);
  if (x_signed) rows<true>(bytes, g, prep, sink, requantization, r0, r1);
  else rows<false>(bytes, g, prep, sink, requantization, r0, r1);
}

}  // namespace QMM_KERNEL_NS
}  // namespace qmm
