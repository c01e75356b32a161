// bindings.cpp: the nanobind module quantmatmul._core; thin wrappers that release the GIL around the C++ core.
//
// Every function here trusts its caller (src/quantmatmul/qlinear.py), which validates dtypes,
// shapes and contiguity once at the public boundary.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "qlinear_matmul.h"

namespace nb = nanobind;

namespace {

// Any dtype and strides: the caller guarantees them. Inputs may be read-only (broadcast views).
using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

template <class T>
qmm::View3<T> view3(const In& x) {
  return {static_cast<const T*>(x.data()), x.stride(0), x.stride(1), x.stride(2)};
}

qmm::QGemmProblem problem(const In& a, bool a_signed, const In& a_index, const In& a_zp,
                          const In& b, bool b_signed, const In& b_index, const In& b_zp) {
  qmm::QGemmProblem p;
  p.batch = static_cast<int64_t>(a_index.shape(0));
  p.M = static_cast<int64_t>(a.shape(1));
  p.K = static_cast<int64_t>(a.shape(2));
  p.N = static_cast<int64_t>(b.shape(2));
  p.a = a.data();
  p.a_signed = a_signed;
  p.a_index = static_cast<const int64_t*>(a_index.data());
  p.a_zero_point = static_cast<const int32_t*>(a_zp.data());
  p.b = b.data();
  p.b_signed = b_signed;
  p.b_index = static_cast<const int64_t*>(b_index.data());
  p.b_zero_point = static_cast<const int32_t*>(b_zp.data());
  return p;
}

qmm::QOutput output(Out& y, bool y_signed, const In& y_zp) {
  return {y.data(), y_signed, view3<int32_t>(y_zp)};
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "quantmatmul's compiled core (private; use the quantmatmul package)";

  m.def("qlinear_matmul_onnxruntime",
        [](const In& a, bool a_signed, const In& a_index, const In& a_zp, const In& b,
           bool b_signed, const In& b_index, const In& b_zp, const In& multiplier, Out y,
           bool y_signed, const In& y_zp) {
          const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
          const auto out = output(y, y_signed, y_zp);
          const auto mult = view3<float>(multiplier);
          nb::gil_scoped_release release;
          qmm::qlinear_matmul_onnxruntime(p, mult, out);
        });

  m.def("qlinear_matmul_onnx_reference",
        [](const In& a, bool a_signed, const In& a_index, const In& a_zp, const In& b,
           bool b_signed, const In& b_index, const In& b_zp, const In& multiplier, Out y,
           bool y_signed, const In& y_zp) {
          const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
          const auto out = output(y, y_signed, y_zp);
          const auto mult = view3<double>(multiplier);
          nb::gil_scoped_release release;
          qmm::qlinear_matmul_onnx_reference(p, mult, out);
        });

  m.def("qlinear_matmul_exact",
        [](const In& a, bool a_signed, const In& a_index, const In& a_zp, const In& b,
           bool b_signed, const In& b_index, const In& b_zp, const In& a_scale,
           const In& b_scale, const In& y_scale, Out y, bool y_signed, const In& y_zp) {
          const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
          const auto out = output(y, y_signed, y_zp);
          const auto sa = view3<float>(a_scale), sb = view3<float>(b_scale), sy = view3<float>(y_scale);
          nb::gil_scoped_release release;
          qmm::qlinear_matmul_exact(p, sa, sb, sy, out);
        });

  m.def("matmul_f32_sequential",
        [](const In& a, const In& a_index, const In& b, const In& b_index, Out out) {
          const int64_t batch = static_cast<int64_t>(a_index.shape(0));
          const int64_t M = static_cast<int64_t>(a.shape(1)), K = static_cast<int64_t>(a.shape(2));
          const int64_t N = static_cast<int64_t>(b.shape(2));
          nb::gil_scoped_release release;
          qmm::matmul_f32_sequential(batch, M, N, K, static_cast<const float*>(a.data()),
                                     static_cast<const int64_t*>(a_index.data()),
                                     static_cast<const float*>(b.data()),
                                     static_cast<const int64_t*>(b_index.data()),
                                     static_cast<float*>(out.data()));
        });

  m.def("matmul_i64_exact128",
        [](const In& a, const In& a_index, const In& b, const In& b_index, Out out_hi,
           Out out_lo) {
          const int64_t batch = static_cast<int64_t>(a_index.shape(0));
          const int64_t M = static_cast<int64_t>(a.shape(1)), K = static_cast<int64_t>(a.shape(2));
          const int64_t N = static_cast<int64_t>(b.shape(2));
          nb::gil_scoped_release release;
          qmm::matmul_i64_exact128(batch, M, N, K, static_cast<const int64_t*>(a.data()),
                                   static_cast<const int64_t*>(a_index.data()),
                                   static_cast<const int64_t*>(b.data()),
                                   static_cast<const int64_t*>(b_index.data()),
                                   static_cast<int64_t*>(out_hi.data()),
                                   static_cast<uint64_t*>(out_lo.data()));
        });
}
