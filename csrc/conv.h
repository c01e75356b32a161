// conv.h: QLinearConv / ConvInteger's own steps around the int8 GEMM (the im2col of channels-last codes, the depthwise sums, the requantization per output channel) and MaxPool of 8-bit codes.
#pragma once

#include <cstdint>
#include <vector>

namespace qmm {

// The geometry of an N-D convolution over channels-last x [N, D1, ..., Dn, C] with `group` groups
// (C / group channels each): the kernel's extent per axis, strides, dilations, the padding before
// each axis and the output's spatial shape.
struct ConvShape {
  int64_t N = 0, C = 0, group = 1;
  std::vector<int64_t> in, out, kernel, strides, dilations, pad_begin;
  int64_t positions() const;  // N * prod(out)
  int64_t taps() const;  // prod(kernel)
};

// The im2col of 8-bit codes: columns [group, positions, row_bytes] (row-major), each row the receptive
// field of one output position (taps, then C / group channels innermost), then `pad` up to row_bytes
// (>= taps * C / group); a tap outside x (padding) is `pad` too (x's zero point: a real 0). Over the
// thread pool.
void conv_columns(const uint8_t* x, const ConvShape& s, uint8_t pad, int64_t row_bytes, uint8_t* columns);
// The receptive fields as a table, for a GEMM that reads x in place (QGemmProblem::a_offsets; one
// group): offsets [positions, taps] (int32), each tap's byte offset in x of its pixel's C channels,
// or -1 where it falls in the padding. x must be under 2 GiB (the caller checks). Over the thread pool.
void conv_offsets(const ConvShape& s, int32_t* offsets);

// Depthwise sums (C / group == 1, one output channel per group): acc [positions, C] (int32, wrapping)
// = sum over taps of (x - x_zp) * w[tap, c], w [taps, C] already minus its zero point (int16). Taps
// in the padding add nothing ((x_zp - x_zp) * w). x int8 (x_signed) or uint8. Over the thread pool.
void conv_depthwise(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w, int32_t* acc);
// Where the depthwise loop (csrc/conv_loops.inc, both builds) puts a range of rows' sums: all of rows
// [r0, r1) at acc (row r at acc + (r - r0) * C); or, with done set, blocks of up to `block` rows at acc,
// each handed to done(context, acc, b0, b1) as soon as it is formed (then acc holds block rows).
struct DepthwiseSink {
  int32_t* acc;
  int64_t block = 0;
  void (*done)(void* context, const int32_t* sums, int64_t b0, int64_t b1) = nullptr;
  void* context = nullptr;
};
// A 2-D depthwise convolution's geometry as plain numbers (a 1-D one as 2-D of height 1), for the
// AVX-512 kernel build (kernels/conv_depthwise_avx512.cpp), which takes no std::vector.
struct DepthwiseGeometry {
  int64_t N, C, H, W, OH, OW, KH, KW, sh, sw, dh, dw, ph, pw;
};
// ONNX Runtime's requantization (requantize.h's requantize_onnxruntime) of the sums plus bias (may be
// null), into y [positions, C] (row r at y + r * C).
struct DepthwiseRequantization {
  const int32_t* bias;
  const float* multiplier;
  int32_t zp;
  bool y_signed;
  uint8_t* y;
};
constexpr int64_t kDepthwiseMaxTaps = 64;  // the most taps the AVX-512 kernel takes
// The AVX-512 kernel of 2-D depthwise convolutions (up to kDepthwiseMaxTaps taps): prepare forms a
// call's constants (prepared_bytes of them, 64-byte aligned: the weights laid out as the kernel reads
// them, with the bias and multipliers where requantization is given), then range sums rows [r0, r1)
// into sink as depthwise_range does, or, with requantization set (the one prepare was given), writes
// them requantized into its y. range runs on any thread; prepared is only read.
struct DepthwiseKernel2d {
  int64_t (*prepared_bytes)(const DepthwiseGeometry& g);
  void (*prepare)(const DepthwiseGeometry& g, int32_t x_zp, const int16_t* w,
                  const DepthwiseRequantization* requantization, void* prepared);
  void (*range)(const void* x, bool x_signed, const DepthwiseGeometry& g, const void* prepared,
                const DepthwiseSink& sink, const DepthwiseRequantization* requantization, int64_t r0, int64_t r1);
};
// The functions a kernel build exports for it (kernels/conv_depthwise.inc), declared in its namespace.
#define QMM_DEPTHWISE_2D_DECLARATIONS                                                                           \
  int64_t depthwise_2d_prepared_bytes(const DepthwiseGeometry& g);                                              \
  void depthwise_2d_prepare(const DepthwiseGeometry& g, int32_t x_zp, const int16_t* w,                         \
                            const DepthwiseRequantization* requantization, void* prepared);                     \
  void depthwise_2d_range(const void* x, bool x_signed, const DepthwiseGeometry& g, const void* prepared,       \
                          const DepthwiseSink& sink, const DepthwiseRequantization* requantization, int64_t r0, \
                          int64_t r1);
// The same sums requantized as requantize_columns does (bias, multiplier, scales, zp, numerics as there)
// into y [positions, C] (8-bit), a block of rows at a time while its sums are in cache: no int32
// array of the whole output, no second pass. Over the thread pool.
void conv_depthwise_requantized(const void* x, bool x_signed, const ConvShape& s, int32_t x_zp, const int16_t* w,
                                const int32_t* bias, const float* multiplier, float a_scale, const float* b_scale,
                                float y_scale, int32_t zp, bool y_signed, void* y, int numerics);
// The depthwise loop conv_depthwise runs now for a 1- or 2-D convolution of up to kDepthwiseMaxTaps
// taps: "avx512_vnni" (kernels/conv_depthwise_avx512.cpp, where its build is there, the CPU has
// AVX-512 VNNI and the kernel level is avx512_vnni or higher), "avx512_vnni-emulated" (the same
// source over SIMDe, under an emulated level of avx512_vnni or higher), "avx2"
// (kernels/conv_depthwise_avx2.cpp, where the avx2 build is there, the CPU has AVX2 and the kernel
// level is avx2 or higher) or "portable" (csrc/conv_loops.inc). Other convolutions (3-D and up, more
// taps) run conv_loops.inc's loop: its avx2 build (kernels/conv_avx2.cpp) where "avx2" or above.
const char* conv_depthwise_path();

// MaxPool of channels-last 8-bit codes: y [positions, C] = the maximum over each window's taps inside x
// (padding never counts; a window with none, impossible with pads below the kernel, gives the type's
// minimum), int8 (x_signed) or uint8. group is 1. Over the thread pool.
void max_pool_bytes(const uint8_t* x, bool x_signed, const ConvShape& s, uint8_t* y);

// dst [batch, cols, rows] = src [batch, rows, cols] transposed plane by plane, elements of 1 or 4
// bytes (channels-last <-> channels-first). Over the thread pool.
void transpose_planes(const void* src, int64_t element_bytes, int64_t batch, int64_t rows, int64_t cols, void* dst);

// The 8-bit output of int32 sums with a bias per column (rows are output positions, columns output
// channels): acc [rows, cols] (row-major) plus bias[c] (none where null; int32 addition wraps, as the
// spec's 32-bit accumulation), requantized with the scale a_scale * b_scale[c] / y_scale and zero
// point zp to int8 (y_signed) or uint8 y [rows, cols], in one of requantize.h's numerics: 0 ONNX
// Runtime's (multiplier[c], the caller's float32 f32(f32(a_scale * b_scale[c]) / y_scale)), 1
// onnx.reference's (that multiplier applied in double), 2 exact (from the scales; multiplier unread,
// may be null). Over the thread pool.
void requantize_columns(const int32_t* acc, const int32_t* bias, int64_t rows, int64_t cols, const float* multiplier,
                        float a_scale, const float* b_scale, float y_scale, int32_t zp, bool y_signed, void* y,
                        int numerics);

}  // namespace qmm
