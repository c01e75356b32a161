// erf_avx512.cpp: onnx.reference's Erf, float32(erf(double(x))), 16 values at a time: a double polynomial per half unit of |x|, the C library's erf wherever rounding to float32 could tell them apart.
//
// erf(x) for |x| in [i/2, (i+1)/2), i = 0 .. 7, is a degree-12 polynomial: in u = x^2 times |x| for
// i = 0 (erf(x) / x is even), in t = |x| - (i/2 + 1/4) otherwise; the coefficients are the
// Chebyshev interpolants of math.erf (double) on each interval, in the power basis (the script
// tests/erf_fit.py prints them). Their relative error is below 2^-48 (double Horner, FMAs); the
// C library's erf is within an ulp of double. So the double result y and the C library's round to
// the same float32 unless y lies within 2^-40 |y| of a midpoint between two float32 values: the
// lanes that might (near_midpoint: within 2^-40 to 2^-39 |y|, about 3 in 10^5), and NaN, and
// 0 < |x| < 2^-20 take std::erf itself (+-0 gives +-0). |x| >= kSaturate gives
// +-1, the C library's float32 result there. Checked against std::erf on all 2^32 float32 bit patterns
// (docs/onnx.md) and by tests/test_onnx_api.py on samples of each path.
//
// Built in the avx512f build (natively and over SIMDe, QMM_EMULATED, for the tests); onnx_ops.cpp
// picks it where the CPU has AVX-512 and the kernel level is avx512_vnni or higher.
#include "avx512_intrinsics.h"

#include <cmath>
#include <cstdint>

namespace qmm {
namespace QMM_KERNEL_NS {
void erf_f32_range(const float* x, int64_t count, float* y);
}  // namespace QMM_KERNEL_NS

namespace {

// kCoefficients[k][i]: the coefficient of degree k for interval i.
alignas(64) constexpr double kCoefficients[13][8] = {
    {0x1.20dd750429b68p+0, 0x1.6c1c9759d0e63p-1, 0x1.d8865d98abe05p-1, 0x1.f92d077f8d573p-1, 0x1.ff404760319bap-1,
     0x1.fff2cfb0453dfp-1, 0x1.ffff6f9f67e5cp-1, 0x1.fffffc2f171e8p-1},
    {-0x1.812746b03a072p-2, 0x1.492e42d78d32bp-1, 0x1.e4652fadcb4eap-3, 0x1.b05530322133ap-5, 0x1.d4143a9dff17dp-8,
     0x1.3360ccd238175p-11, 0x1.e9b5e8d06e638p-16, 0x1.d9371e4102734p-21},
    {0x1.ce2f21ab9eed1p-4, -0x1.edc5644356028p-2, -0x1.2ebf3dcca22bcp-2, -0x1.7a4a8a2bea2f9p-4, -0x1.074b60f9108aap-6,
     -0x1.a6a519a429b52p-10, -0x1.8de3cd682ff18p-14, -0x1.bba3b23dec1d2p-19},
    {-0x1.b82cf205ccb58p-6, 0x1.b6e8591ddb9fbp-6, 0x1.571d01c5f328ep-3, 0x1.7148c3d55aa9bp-4, 0x1.63ef61e7f57cap-6,
     0x1.69cf466e5dbe3p-9, 0x1.9aa489d3d96a1p-13, 0x1.0b6a7a5eabcd1p-17},
    {0x1.56653820ed7f4p-8, 0x1.349b5eadd4bc0p-3, -0x1.93a9a7165e70cp-8, -0x1.8a0da52d3f96dp-5, -0x1.38a982fed626ap-6,
     -0x1.ab0c25f158eabp-9, -0x1.2c7d524d77809p-12, -0x1.d06e1a28e5be7p-17},
    {-0x1.c6fe1ebfd8330p-11, -0x1.b42a1829211a7p-5, -0x1.8281ce631a713p-5, 0x1.b22258c4aa61cp-8, 0x1.5d3b17dd3f409p-7,
     0x1.6935957347949p-9, 0x1.490a4fa5c8effp-12, 0x1.3436cd09b1725p-16},
    {0x1.443325c61d0f6p-12, -0x1.b84781ed3296dp-6, 0x1.5cfff802e4139p-6, 0x1.25b3606da25b3p-7, -0x1.7cae6945889bap-9,
     -0x1.b27615a49a490p-10, -0x1.1457e6ac6a247p-12, -0x1.4384889f80ba2p-16},
    {-0x1.da02bf6db6f76p-10, 0x1.2e0acd3e171b0p-6, 0x1.db44ef490109ap-9, -0x1.8d1129f3462b5p-8, -0x1.5f8365082ccf4p-11,
     0x1.52b68a01800ecp-11, 0x1.647ec73ac7c1ep-13, 0x1.110c96e5b6b19p-16},
    {0x1.73e9a675fb424p-7, 0x1.2dbbbfdf0a1ebp-9, -0x1.75617023bb92dp-8, 0x1.7ef18d7c3ededp-11, 0x1.0619aefe6e7aap-10,
     -0x1.73e9bad14afe3p-14, -0x1.54bd714620ca4p-14, -0x1.6a61f7d18c396p-17},
    {-0x1.8432e9c9491d6p-5, -0x1.03fce04c84292p-8, 0x1.cbaa125a59c3bp-11, 0x1.d4f4c266128fdp-11, -0x1.8346a0c1bbd2ep-12,
     -0x1.2aff13fd09e3ap-14, 0x1.b31c32957f9b3p-16, 0x1.9a27b51305698p-18},
    {0x1.00e329218ff28p-3, 0x1.7e3421648c4c0p-13, 0x1.9d7c4002b68c8p-11, -0x1.d58a06b188b5bp-12, -0x1.1260881a2bd81p-16,
     0x1.a49ece4e3a99bp-15, -0x1.1127a9aa3b12cp-17, -0x1.e858a16f6ef3ap-18},
    {-0x1.868a08f638be8p-3, 0x1.3f3a9200abc57p-11, -0x1.47cee2725fb52p-12, -0x1.2e39e38530f35p-17,
     0x1.0f763812f0b1dp-14, -0x1.fd4a3c2146939p-17, -0x1.97205efc66d50p-19, 0x1.9825fe3ea7866p-21},
    {0x1.03b9628471136p-3, -0x1.5ec3bcf1ca482p-14, -0x1.ccb0b8203f10cp-16, 0x1.8d84e14d388c2p-14, 0x1.e8f8fcd0330e2p-19,
     0x1.9b575f8360e9cp-16, 0x1.116ea64959631p-15, 0x1.9c4fbbf62da2ap-16}};
// float32(erf(x)) is 1 for every float32 x at or above this (the C library's erf; the smallest such float32).
constexpr float kSaturate = 0x1.f5a88ap+1f;  // 3.9192059

// float32 <-> double, 8 lanes (SIMDe lacks the 512-bit conversions: two 256-bit ones there).
inline __m512d widen(__m256 x) {
#if defined(QMM_EMULATED)
  return _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_cvtps_pd(_mm256_castps256_ps128(x))),
                            _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), 1);
#else
  return _mm512_cvtps_pd(x);
#endif
}
inline __m256 narrow(__m512d y) {  // nearest even
#if defined(QMM_EMULATED)
  return _mm256_set_m128(_mm256_cvtpd_ps(_mm512_extractf64x4_pd(y, 1)), _mm256_cvtpd_ps(_mm512_castpd512_pd256(y)));
#else
  return _mm512_cvtpd_ps(y);
#endif
}

// Each interval's center (interval 0's unused: its polynomial is in x^2).
alignas(64) constexpr double kCenters[8] = {0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25, 3.75};

// 8 lanes of |x| (double, below kSaturate, at least 2^-20) and their intervals (the low 3 bits of
// each 64-bit lane): the polynomial's erf.
inline __m512d polynomial(__m512d ax, __m512i index) {
  const __mmask8 first = _mm512_cmp_pd_mask(ax, _mm512_set1_pd(0.5), _CMP_LT_OQ);
  const __m512d center = _mm512_permutexvar_pd(index, _mm512_load_pd(kCenters));
  const __m512d v = _mm512_mask_blend_pd(first, _mm512_sub_pd(ax, center), _mm512_mul_pd(ax, ax));
  __m512d p = _mm512_permutexvar_pd(index, _mm512_load_pd(kCoefficients[12]));
  for (int k = 11; k >= 0; --k)
    p = _mm512_fmadd_pd(p, v, _mm512_permutexvar_pd(index, _mm512_load_pd(kCoefficients[k])));
  return _mm512_mask_blend_pd(first, p, _mm512_mul_pd(p, ax));
}

// Lanes where y (double, positive, normal) may lie too near a midpoint between float32 values: the
// 29 bits of its significand below float32's, as an integer, within 2^13 of 2^28 (the midpoint's).
// In y's binade [2^e, 2^(e+1)) that is within 2^(e-39) of a midpoint, at least 2^-40 y: no lane that
// the first form (|midpoint - y| <= 2^-40 y, in double; checked on every float32) let through goes
// to std::erf now that did not, and the test is 3 integer operations, not 3 conversions and 8 of
// double arithmetic. (A midpoint at a binade's bottom, between 2^e and the float32 below it, lies in
// the binade below, whose low bits read the same way.)
inline __mmask8 near_midpoint(__m512d y) {
  const __m512i low = _mm512_and_si512(_mm512_castpd_si512(y), _mm512_set1_epi64((int64_t{1} << 29) - 1));
  const __m512i off = _mm512_abs_epi64(_mm512_sub_epi64(low, _mm512_set1_epi64(int64_t{1} << 28)));
  return _mm512_cmp_epi64_mask(off, _mm512_set1_epi64(int64_t{1} << 13), _MM_CMPINT_LE);
}

// 16 values from x (all of them readable): the result, and in exact the lanes std::erf must redo.
inline __m512 erf16(const float* x, __mmask16& exact) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 v = _mm512_loadu_ps(x);
  const __m512 ax = _mm512_and_ps(v, abs_mask);
  // lanes for std::erf: NaN, 0 < |x| < 2^-20 (denormals included); +-0 gives itself (below): a
  // quantized model's zero point dequantizes to 0, 2-8 % of an erf-GELU's inputs in MiniLM, where
  // std::erf per lane had the node take 1.7x the polynomial's time; saturated lanes: +-1
  const __mmask16 zero = _mm512_cmp_ps_mask(ax, _mm512_setzero_ps(), _CMP_EQ_OQ);
  exact = static_cast<__mmask16>(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0x1p-20f), _CMP_NGE_UQ) & ~zero);
  const __mmask16 saturated = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(kSaturate), _CMP_GE_OQ);
  const __m512 clamped = _mm512_min_ps(ax, _mm512_set1_ps(kSaturate));  // finite in every lane (NaN too)
  // interval floor(2 |x|), 0 .. 7 (SIMDe has no int32 -> int64 widening: a permute puts lane j
  // into the low half of 64-bit lane j, which is all vpermpd reads)
  const __m512i interval = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(clamped, clamped)), _mm512_set1_epi32(7));
  __m512 result = _mm512_set1_ps(1.0f);
  for (int h = 0; h < 2; ++h) {
    const __m256 part = h == 0 ? _mm512_castps512_ps256(clamped) : _mm512_extractf32x8_ps(clamped, 1);
    const __m512i index =
        _mm512_permutexvar_epi32(_mm512_set_epi32(0, 8 * h + 7, 0, 8 * h + 6, 0, 8 * h + 5, 0, 8 * h + 4, 0, 8 * h + 3,
                                                  0, 8 * h + 2, 0, 8 * h + 1, 0, 8 * h),
                                 interval);
    const __m512d e = polynomial(_mm512_max_pd(widen(part), _mm512_set1_pd(0x1p-20)), index);
    const __mmask8 near = near_midpoint(e);
    exact = static_cast<__mmask16>(exact | (static_cast<unsigned>(near) << (8 * h)));
    const __m256 rounded = narrow(e);
    result = h == 0 ? _mm512_insertf32x8(result, rounded, 0) : _mm512_insertf32x8(result, rounded, 1);
  }
  result = _mm512_mask_blend_ps(saturated, result, _mm512_set1_ps(1.0f));
  result = _mm512_mask_blend_ps(zero, result, _mm512_setzero_ps());
  exact = static_cast<__mmask16>(exact & ~saturated);
  return _mm512_or_ps(result, _mm512_andnot_ps(abs_mask, v));  // erf is odd: x's sign
}

// The lanes of y's 16 values at x that exact names, from std::erf.
inline void redo(const float* x, __mmask16 exact, float* y) {
  while (exact) {
    const int lane = __builtin_ctz(exact);
    exact = static_cast<__mmask16>(exact & (exact - 1));
    y[lane] = static_cast<float>(std::erf(static_cast<double>(x[lane])));
  }
}

}  // namespace

void QMM_KERNEL_NS::erf_f32_range(const float* x, int64_t count, float* y) {
  int64_t i = 0;
  // 32 values a step: two blocks' polynomials (four chains of 13 dependent FMAs) in flight together
  for (; i + 32 <= count; i += 32) {
    __mmask16 exact0, exact1;
    const __m512 r0 = erf16(x + i, exact0), r1 = erf16(x + i + 16, exact1);
    _mm512_storeu_ps(y + i, r0);
    _mm512_storeu_ps(y + i + 16, r1);
    redo(x + i, exact0, y + i);
    redo(x + i + 16, exact1, y + i + 16);
  }
  for (; i + 16 <= count; i += 16) {
    __mmask16 exact;
    _mm512_storeu_ps(y + i, erf16(x + i, exact));
    redo(x + i, exact, y + i);
  }
  for (; i < count; ++i) y[i] = static_cast<float>(std::erf(static_cast<double>(x[i])));
}

}  // namespace qmm
