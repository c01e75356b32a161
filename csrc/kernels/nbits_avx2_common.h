// nbits_avx2_common.h: internals shared by the AVX2 kernel files (and the AVX-512 ones on the quads x16 layout): scratch buffers, min/max/fill, and MatMulNBits helpers.
//
// Included by nbits_f32_avx2.cpp, nbits_int8_avx2.cpp and qgemm_avx2.cpp, all compiled with
// -mavx2 -mfma -mf16c -mbmi2. Everything here has internal linkage (an anonymous namespace): an
// inline function, template or STL instantiation with external linkage emitted by such a file is a
// weak symbol that the linker may keep for the portable code too, and a CPU without AVX2 would then
// die on an illegal instruction. So these files use no std::vector or <algorithm> either: the
// scratch buffers, min/max and zero_floats below stand in for them.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#include "matmul_nbits.h"

namespace qmm {
namespace {

inline int64_t min_i64(int64_t a, int64_t b) { return b < a ? b : a; }
inline int64_t max_i64(int64_t a, int64_t b) { return a < b ? b : a; }
// x[0 .. count) = 0.0f.
inline void zero_floats(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = 0.0f;
}

// A growable scratch buffer, usually thread_local in a kernel: get<T>(count) returns room for at
// least count T, 64-byte aligned. It only grows (to the largest size asked so far); growing drops
// the old contents, and new memory is uninitialized, so callers write before they read (as they
// did with std::vector, whose zeroed growth none of them relied on). Allocation failure throws
// std::bad_alloc, as std::vector does.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release(); }

  template <typename T>
  T* get(int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    if (bytes > capacity_) {
      release();
      data_ = ::operator new(bytes, std::align_val_t{kAlignment});
      capacity_ = bytes;
    }
    return static_cast<T*>(data_);
  }

 private:
  static constexpr size_t kAlignment = 64;
  void release() {
    if (data_) ::operator delete(data_, std::align_val_t{kAlignment});
    data_ = nullptr;
    capacity_ = 0;
  }
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Levels 0/1 on the "quads x16" layout (nbits_packed_avx2.cpp, nbits_packed_f32_avx512.cpp): A's
// rows padded with zeros to k_blocks * block_size (A itself where K fills its blocks, else a copy
// in `padded`; codes past K meet +0), and into asum [M][k_blocks] each block's sum of A in order
// of k from +0, the blocks side by side.
inline const float* padded_rows_and_block_sums(const float* A, int64_t M, const NBitsWeight& w, Scratch& padded,
                                               float* asum) {
  const int64_t K = w.K, kb = w.k_blocks, bs = w.block_size, row = kb * bs;
  const float* rows = A;
  if (row != K) {
    float* const copy = padded.get<float>(M * row);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) copy[m * row + k] = A[m * K + k];
      zero_floats(copy + m * row + K, row - K);
    }
    rows = copy;
  }
  for (int64_t m = 0; m < M; ++m) {
    float* const sums = asum + m * kb;
    const float* const a = rows + m * row;
    zero_floats(sums, kb);
    for (int64_t i = 0; i < bs; ++i)
      for (int64_t b = 0; b < kb; ++b) sums[b] += a[b * bs + i];
  }
  return rows;
}

// The levels-0/1 few-row driver of the "quads x16" kernels (nbits_packed_avx2.cpp, AVX-512's
// nbits_packed_f32_avx512.cpp): A's rows padded and their block sums, then
// kernel(S, Signed8, rows, asum, p0, p1, panel_of) over the panels [p0, p1) of columns [n0, n1) (n0
// a multiple of 16), S and Signed8 as std::integral_constant, panel_of(p, slot) panel p: the packed
// weight's, or (codes as they are) one built into slot `slot` (< slots) by build (avx2::nbits_rows_panel's
// signature: 4-bit storage for 3- and 4-bit codes, a byte per code for the others).
template <class Build, class Kernel>
inline void quads_rows_f32(const float* A, int64_t M, const NBitsWeight& w, int64_t n0, int64_t n1, int slots,
                           Build build, Kernel kernel) {
  using Eight = std::integral_constant<int, 8>;
  const int64_t kb = w.k_blocks, padded = kb * w.block_size, panel = kQuadsPanel;
  const int64_t p0 = n0 / panel, p1 = (n1 + panel - 1) / panel;
  thread_local Scratch asum_storage, padded_storage;
  float* const asum = asum_storage.get<float>(M * kb);
  const float* rows = padded_rows_and_block_sums(A, M, w, padded_storage, asum);
  if (w.packed) {
    auto packed = [&](int64_t p, int) { return quads_panel(w, p); };
    if (w.bits == 8) return kernel(Eight{}, std::true_type{}, rows, asum, p0, p1, packed);
    switch (quads_storage_bits(w.bits)) {
      case 2: return kernel(std::integral_constant<int, 2>{}, std::false_type{}, rows, asum, p0, p1, packed);
      case 4: return kernel(std::integral_constant<int, 4>{}, std::false_type{}, rows, asum, p0, p1, packed);
      default: return kernel(Eight{}, std::false_type{}, rows, asum, p0, p1, packed);
    }
  }
  thread_local Scratch columns_storage, codes_storage, floats_storage;
  const int64_t stride = padded + 32;  // the builder writes up to 16 past a row
  uint8_t* const columns = columns_storage.get<uint8_t>(panel * stride);
  uint8_t* const codes = codes_storage.get<uint8_t>(slots * panel * padded);
  float* const floats = floats_storage.get<float>(2 * slots * panel * kb);
  auto built = [&](int64_t p, int slot) {
    uint8_t* c = codes + slot * panel * padded;
    float *scales = floats + 2 * slot * panel * kb, *zero_points = scales + panel * kb;
    build(w, p * panel, columns, stride, c, scales, zero_points);
    return QuadsPanel{c, scales, zero_points, nullptr};
  };
  if (w.bits == 4 || w.bits == 3)
    return kernel(std::integral_constant<int, 4>{}, std::false_type{}, rows, asum, p0, p1, built);
  kernel(Eight{}, std::false_type{}, rows, asum, p0, p1, built);
}

inline float horizontal_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// Level 4: from this many rows of A the unpacked kernels take the int8 GEMM (below it the per-row
// kernel, codes unpacked once per 4 rows, wins), and the float32 order is the GEMM's
// (docs/matmul_nbits.md), which the packed few-row kernel then follows too.
constexpr int64_t kInt8GemmMinRows = 8;

// The packed few-row kernels' loop (AVX2 and AVX-512 VNNI): panels [p0, p1) x rows [0, M) in passes
// of up to 4 rows (up to InOrderRows rows from kInt8GemmMinRows rows of M), body(mr, in_order, p,
// m0) with the pass's rows mr and in_order (from kInt8GemmMinRows rows of M: the GEMM's float32
// order) as compile-time constants.
template <int InOrderRows = 4, class Body>
inline void quads_row_passes(int64_t M, int64_t p0, int64_t p1, Body body) {
  auto pass = [&](auto in_order, auto rows) {
    constexpr int R = decltype(rows)::value;
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t m0 = 0; m0 < M; m0 += R) {
        const int64_t mr = min_i64(R, M - m0);
        [&]<int... I>(std::integer_sequence<int, I...>) {
          ((mr == I + 1 ? (body(std::integral_constant<int, I + 1>{}, in_order, p, m0), 0) : 0), ...);
        }(std::make_integer_sequence<int, R>{});
      }
  };
  if (M >= kInt8GemmMinRows) pass(std::true_type{}, std::integral_constant<int, InOrderRows>{});
  else pass(std::false_type{}, std::integral_constant<int, 4>{});
}

// The few-row kernels on the "quads x16" layout (AVX2 and AVX-512 VNNI) prefetch a panel's codes,
// scales and zero points ahead, for 2- and 4-bit storage, when the weight's codes exceed
// kQuadsPrefetchAbove: a weight that size streams from memory between calls in a model. Zen 4,
// level 4, K = N = 4096, interleaved with ONNX Runtime (whose runs evict ours), 1-2 threads, 4 KB
// ahead into L1: VNNI kernel M = 1-16 1.09-1.42x (even: M = 64, N = 11008 with blocks of 32, M = 2
// at 1 thread), the AVX2 kernel on the same CPU M = 1-8 1.02-1.35x; the same weight back to back
// from cache 0.86-1.0x, weights of 0.5-2 MB 0.81-0.88x (hence the floor); 8-bit storage 0.87-0.91x
// even from memory, so not there. How far and into which cache is the kernel's (QuadsPrefetch's
// parameters): the VNNI kernel prefetches 16 KB ahead into L2 (QuadsPrefetchL2), the AVX2 kernel
// 4 KB ahead into L1 (QuadsPrefetchL1); measured on Zen 4 in one process, weights streaming from
// L3 (two 8 MB weights in turn) or from memory (256 MB of them), M = 1, 4-bit blocks of 32 / 128 /
// N = 11008: VNNI 16 KB into L2 over 4 KB into L1 1 thread L3 1.04-1.14 / 0.99-1.15 / 1.06-1.23,
// memory 1.05-1.09 / 1.00 / 0.97-0.99; 2 threads L3 0.97-1.05 / 0.94-1.00 / 1.05-1.13, memory
// 0.95-1.00 / 1.02-1.05 / 1.00-1.04 (nothing at all: 0.73-0.88 from L3, even from memory); the
// AVX2 kernel 0.96-0.98 (one 1.04), so it keeps L1.
constexpr int64_t kQuadsPrefetchAbove = int64_t{2} << 20;
// prefetch(panel, b): block b's data Distance bytes ahead in the panel's codes into L1 (Hint
// _MM_HINT_T0) or L2 (_MM_HINT_T1; no other), or nothing where w does not qualify. The addresses are integers: past the
// panel's last block they point nowhere, and a prefetch never faults. Always inlined: GCC 12 finds a function whose
// only effect is a prefetch free of side effects and drops its calls (out of line, the kernels had no prefetch
// instruction left).
template <int64_t Distance, int Hint>
class QuadsPrefetch {
 public:
  explicit QuadsPrefetch(const NBitsWeight& w) : block_bytes_(quads_block_bytes(w)) {
    const int64_t codes = (w.N + kQuadsPanel - 1) / kQuadsPanel * w.k_blocks * block_bytes_;
    if (quads_storage_bits(w.bits) < 8 && codes > kQuadsPrefetchAbove) {
      distance_ = Distance;
      blocks_ahead_ = distance_ / block_bytes_ > 0 ? distance_ / block_bytes_ : 1;
    }
  }
  [[gnu::always_inline]] void operator()(const QuadsPanel& panel, int64_t b) const {
    if (distance_ == 0) return;
    for (int64_t off = 0; off < block_bytes_; off += 64) fetch(at(panel.codes, b * block_bytes_ + distance_ + off));
    const int64_t next = (b + blocks_ahead_) * kQuadsPanel;
    fetch(at(panel.scales, next * 4));
    fetch(panel.zero_points ? at(panel.zero_points, next) : at(panel.float_zero_points, next * 4));
  }

 private:
  [[gnu::always_inline]] static void fetch(const char* p) {
    if constexpr (Hint == _MM_HINT_T1) _mm_prefetch(p, _MM_HINT_T1);
    else _mm_prefetch(p, _MM_HINT_T0);
  }
  [[gnu::always_inline]] static const char* at(const void* base, int64_t offset) {
    return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset));
  }
  int64_t block_bytes_, distance_ = 0, blocks_ahead_ = 0;
};
using QuadsPrefetchL1 = QuadsPrefetch<4096, _MM_HINT_T0>;
using QuadsPrefetchL2 = QuadsPrefetch<16384, _MM_HINT_T1>;

// How many vpmaddubsw results (u8 codes of `bits` bits x s8 qa, |qa| <= 127: pair sums of at most
// 2 * 127 * (2^bits - 1)) add up in int16 without overflow: 8 for 4-bit codes, 43 for 2-bit, 1 for 7-bit.
constexpr int64_t int16_steps(int64_t bits) { return 32767 / (254 * ((int64_t{1} << bits) - 1)); }

// The zero points of blocks index .. index+7 (index = n * k_blocks + b) as float32.
inline __m256 zero_points8(const NBitsWeight& w, int64_t index) {
  if (!w.zero_points_u8) return _mm256_loadu_ps(w.zero_points + index);
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zero_points_u8 + index))));
}

}  // namespace
}  // namespace qmm
