// conv_field.h: a convolution's receptive fields tap by tap (the offsets csrc/conv.cpp and the depthwise loops read).
#pragma once

#include <cstdint>
#include <vector>

#include "conv.h"

namespace qmm {
// An anonymous namespace: kernel files built with AVX2 flags include this header too, and an
// out-of-line copy with external linkage from such a file could be the one the linker keeps.
namespace {

// One output position's receptive field, tap by tap: for each tap, the element offset of its pixel
// in channels-last x (channels excluded), or -1 where the tap falls in the padding. Per axis, each
// output index's input coordinate per kernel index is tabled once (-1 outside x).
class Field {
 public:
  explicit Field(const ConvShape& s) : s_(s), nd_(s.in.size()), o_(nd_), coords_(nd_), offsets_(s.taps()) {
    for (size_t i = 0; i < nd_; ++i) {
      auto& table = coords_[i];
      table.resize(static_cast<size_t>(s.out[i] * s.kernel[i]));
      for (int64_t o = 0; o < s.out[i]; ++o) {
        for (int64_t k = 0; k < s.kernel[i]; ++k) {
          const int64_t c = o * s.strides[i] + k * s.dilations[i] - s.pad_begin[i];
          table[o * s.kernel[i] + k] = c >= 0 && c < s.in[i] ? c : -1;
        }
      }
    }
  }

  // The offsets for output position `row` (n and the output multi-index, row-major): built axis by
  // axis, each tap's partial offset times the axis' size plus its coordinate.
  const std::vector<int64_t>& at(int64_t row) {
    int64_t rest = row;
    for (size_t i = nd_; i-- > 0;) {
      o_[i] = rest % s_.out[i];
      rest /= s_.out[i];
    }
    offsets_[0] = rest;  // n
    int64_t count = 1;
    for (size_t i = 0; i < nd_; ++i) {
      const int64_t K = s_.kernel[i];
      const int64_t* coord = coords_[i].data() + o_[i] * K;
      for (int64_t j = count; j-- > 0;) {  // in place, from the back: tap j's partial -> taps j * K + k
        const int64_t partial = offsets_[j];
        for (int64_t k = K; k-- > 0;) {
          offsets_[j * K + k] = partial < 0 || coord[k] < 0 ? -1 : partial * s_.in[i] + coord[k];
        }
      }
      count *= K;
    }
    return offsets_;
  }

 private:
  const ConvShape& s_;
  size_t nd_;
  std::vector<int64_t> o_;
  std::vector<std::vector<int64_t>> coords_;
  std::vector<int64_t> offsets_;
};

}  // namespace
}  // namespace qmm
