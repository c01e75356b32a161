// requantize.cpp: exact round-half-to-even requantization (numerics="exact") with 128-bit integers.
#include "requantize.h"

#include <cstdlib>

namespace qmm {
namespace {

using u128 = unsigned __int128;

// x = mantissa * 2^exponent with an integer mantissa of at most 24 bits (exact for any float32,
// subnormals included, because the conversion to double normalizes them).
struct Dyadic {
  uint64_t mantissa;
  int exponent;
  bool negative;
};

Dyadic decompose(float x) {
  int e = 0;
  const double f = std::frexp(static_cast<double>(x), &e);  // |f| in [0.5, 1)
  const double m = std::ldexp(std::fabs(f), 24);             // an integer below 2^24
  return {static_cast<uint64_t>(m), e - 24, x < 0};
}

// Rounds the non-negative rational X * 2^E / Y to the nearest integer, ties to even, where
// X < 2^112, 1 <= Y < 2^24, and the caller has checked that the result is below 2^13.
int64_t round_half_even(u128 X, int E, uint64_t Y) {
  u128 quotient, remainder;
  bool half_bit = false, sticky = false;  // the bits of X * 2^E below the binary point
  if (E >= 0) {
    const u128 Z = X << E;  // below 2^13 * 2^24: no overflow
    quotient = Z / Y;
    remainder = Z % Y;
  } else {
    const int s = -E;
    if (s >= 120) return 0;  // X * 2^E < 2^-8: rounds to 0 whatever Y is
    const u128 integer_part = X >> s;
    half_bit = (X >> (s - 1)) & 1;
    sticky = s > 1 && (X & ((u128(1) << (s - 1)) - 1)) != 0;
    quotient = integer_part / Y;
    remainder = integer_part % Y;
  }
  // Compare the fractional part (remainder + fraction) / Y with 1/2, i.e. 2*remainder + 2*fraction
  // with Y, where 2*fraction = half_bit + (sticky ? something in (0,1) : 0).
  const u128 twice = 2 * remainder + (half_bit ? 1 : 0);
  bool up;
  if (twice != Y) {
    up = twice > Y;
  } else {
    up = sticky || (quotient & 1);
  }
  return static_cast<int64_t>(quotient) + (up ? 1 : 0);
}

}  // namespace

int32_t requantize_exact(int64_t acc, float a_scale, float b_scale, float y_scale, int32_t zp, int32_t qmin,
                         int32_t qmax) {
  if (acc == 0) return zp < qmin ? qmin : (zp > qmax ? qmax : zp);
  const Dyadic sa = decompose(a_scale), sb = decompose(b_scale), sy = decompose(y_scale);
  const bool negative = (acc < 0) ^ sa.negative ^ sb.negative ^ sy.negative;
  const uint64_t magnitude = acc < 0 ? 0 - static_cast<uint64_t>(acc) : static_cast<uint64_t>(acc);

  // A cheap float estimate decides saturation: beyond 4096 the exact result saturates whatever the
  // zero point (|qmax - qmin| < 2^9 and |zp| < 2^9 for 8-bit types), and the estimate is accurate
  // to far better than a factor of 2.
  const long double estimate =
      static_cast<long double>(magnitude) * std::fabs(a_scale) * std::fabs(b_scale) / std::fabs(y_scale);
  int64_t rounded;
  if (estimate > 4096.0L) {
    rounded = 8192;
  } else {
    const u128 X = u128(magnitude) * sa.mantissa * sb.mantissa;  // < 2^64 * 2^48: fits
    rounded = round_half_even(X, sa.exponent + sb.exponent - sy.exponent, sy.mantissa);
  }
  const int64_t q = (negative ? -rounded : rounded) + zp;
  return static_cast<int32_t>(q < qmin ? qmin : (q > qmax ? qmax : q));
}

}  // namespace qmm
