// float8.h: float32 to float8 conversion (round to nearest even, saturating), for the float path's outputs.
#pragma once

#include <cstdint>

namespace qmm {

enum class Float8 { kE4M3FN = 0, kE4M3FNUZ = 1, kE5M2 = 2, kE5M2FNUZ = 3 };

// out[i] = x[i] converted to the float8 type: clipped to +-max finite (infinities too), rounded to
// nearest even (subnormals included), NaN to the type's NaN (sign kept where the type has one);
// the same bits as numpy.clip(x, -max, max).astype(<ml_dtypes float8 type>). The fnuz types have
// no negative zero: -0 (and a negative value rounding to 0) gives 0x00.
void float32_to_float8(const float* x, int64_t count, Float8 type, uint8_t* out);

}  // namespace qmm
