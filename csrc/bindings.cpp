// bindings.cpp: the nanobind module quantmatmul._core; thin wrappers that release the GIL around the C++ core.
//
// Every function here trusts its caller (src/quantmatmul/qlinear.py), which validates dtypes,
// shapes and contiguity once at the public boundary.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "buffer.h"
#include "conv.h"
#include "cpu_features.h"
#include "dispatch.h"
#include "float8.h"
#include "float8_gemm.h"
#include "matmul_nbits.h"
#include "onnx_ops.h"
#include "peak.h"
#include "qlinear_matmul.h"
#include "quantize_linear.h"
#include "quantize_nbits.h"
#include "thread_pool.h"

namespace nb = nanobind;

namespace {

// Any dtype and strides: the caller guarantees them. Inputs may be read-only (broadcast views).
using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

// Whether a's elements lie in C order one after another (strides in elements; a dimension of one aside, and
// an empty array's strides).
template <class A>
bool contiguous(const A& a) {
  if (a.size() == 0) return true;
  int64_t expected = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(d));
  }
  return true;
}

template <class T>
qmm::View3<T> view3(const In& x) {
  return {static_cast<const T*>(x.data()), x.stride(0), x.stride(1), x.stride(2)};
}

// An entry as cpu_info() names it: "avx2", "amx-emulated", ...
std::string entry_name(const qmm::EntryInfo& info) {
  return std::string(info.name) + (info.emulated ? "-emulated" : "");
}

// b is a PackedB (a constant weight) or a contiguous [Bb, K, N] 8-bit array packed per call.
qmm::QGemmProblem problem(const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b, bool b_signed,
                          const In& b_index, const In& b_zp) {
  qmm::QGemmProblem p;
  p.batch = static_cast<int64_t>(a_index.shape(0));
  p.M = static_cast<int64_t>(a.shape(1));
  p.K = static_cast<int64_t>(a.shape(2));
  if (nb::isinstance<qmm::PackedB>(b)) {
    p.b_packed = nb::inst_ptr<qmm::PackedB>(b);
    p.b_raw = nullptr;
    p.N = p.b_packed->N;
  } else {
    const In raw = nb::cast<In>(b);
    p.b_packed = nullptr;
    p.b_raw = raw.data();
    p.N = static_cast<int64_t>(raw.shape(2));
  }
  p.b_signed = b_signed;
  p.a = a.data();
  p.a_signed = a_signed;
  p.a_index = static_cast<const int64_t*>(a_index.data());
  p.a_zero_point = static_cast<const int32_t*>(a_zp.data());
  p.b_index = static_cast<const int64_t*>(b_index.data());
  p.b_zero_point = static_cast<const int32_t*>(b_zp.data());
  return p;
}

qmm::QOutput output(Out& y, bool y_signed, const In& y_zp) { return {y.data(), y_signed, view3<int32_t>(y_zp)}; }

// The QLinearAdd stage of a product with M output rows and N columns (qmm::QLinearAddStage) from a
// binding's add_codes (None; or contiguous 8-bit codes, [N]: a row for every row, or [M, N]),
// add_product_first and add_rx_ry_k; nullopt for None.
std::optional<qmm::QLinearAddStage> add_stage(const char* fn, const std::optional<In>& codes, bool product_first,
                                              const std::array<float, 3>& rx_ry_k, int64_t M, int64_t N) {
  if (!codes) return std::nullopt;
  const int64_t n = codes->ndim();
  const bool row = n == 1 && static_cast<int64_t>(codes->shape(0)) == N && codes->stride(0) == 1;
  const bool matrix = n == 2 && static_cast<int64_t>(codes->shape(0)) == M &&
                      static_cast<int64_t>(codes->shape(1)) == N && codes->stride(1) == 1 &&
                      codes->stride(0) == static_cast<int64_t>(N);
  if (codes->itemsize() != 1 || !(row || matrix))
    throw std::invalid_argument(std::string(fn) + ": add_codes [N] or [M, N] contiguous 8-bit codes expected");
  return qmm::QLinearAddStage{codes->data(), product_first, rx_ry_k[0], rx_ry_k[1], rx_ry_k[2], matrix ? N : 0};
}

// A binding's three keyword arguments of an add stage (add_stage above), named prefix_codes (default
// None), prefix_product_first and prefix_rx_ry_k.
#define QMM_ADD_STAGE_ARGS(prefix)                                                  \
  nb::arg(#prefix "_codes") = nb::none(), nb::arg(#prefix "_product_first") = true, \
                  nb::arg(#prefix "_rx_ry_k") = std::array<float, 3>{0, 0, 0}

// qlinear_matmul_onnxruntime of p into y with the binding's add stage (add_stage above), the GIL released.
void onnxruntime_with_add(const char* fn, const qmm::QGemmProblem& p, const In& multiplier, Out& y, bool y_signed,
                          const In& y_zp, const std::optional<In>& add_codes, bool add_product_first,
                          const std::array<float, 3>& add_rx_ry_k) {
  auto out = output(y, y_signed, y_zp);
  const auto add = add_stage(fn, add_codes, add_product_first, add_rx_ry_k, p.M, p.N);
  out.add = add ? &*add : nullptr;
  const auto mult = view3<float>(multiplier);
  nb::gil_scoped_release release;
  qmm::qlinear_matmul_onnxruntime(p, mult, out);
}

// QLinearMatMul with a multiplier view of type T (float32 for "onnxruntime", float64 for
// "onnx-reference"), writing into y.
template <class T, void (*product)(const qmm::QGemmProblem&, qmm::View3<T>, qmm::QOutput)>
void qlinear_binding(const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b, bool b_signed,
                     const In& b_index, const In& b_zp, const In& multiplier, Out y, bool y_signed, const In& y_zp) {
  const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
  const auto out = output(y, y_signed, y_zp);
  const auto mult = view3<T>(multiplier);
  nb::gil_scoped_release release;
  product(p, mult, out);
}

// A new numpy array that C++ fills (with the GIL released) and Python then owns: the one way this
// module returns arrays. Zero-size arrays still get one element of storage.
template <class T>
class NewArray {
 public:
  explicit NewArray(std::initializer_list<int64_t> dims) : NewArray(std::vector<int64_t>(dims)) {}
  explicit NewArray(const std::vector<int64_t>& dims) {
    size_t count = 1;
    for (int64_t d : dims) {
      shape_.push_back(static_cast<size_t>(d));
      count *= static_cast<size_t>(d);
    }
    data_ = new T[std::max<size_t>(count, 1)];
    owner_ = nb::capsule(data_, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  }
  T* data() { return data_; }
  // The array, as dtype (by default T's own: int8 results are written through uint8 storage).
  nb::ndarray<nb::numpy> array(nb::dlpack::dtype dtype = nb::dtype<T>()) {
    return nb::ndarray<nb::numpy>(data_, shape_.size(), shape_.data(), owner_, nullptr, dtype);
  }

 private:
  T* data_;
  nb::capsule owner_;
  std::vector<size_t> shape_;
};

// The weight's arrays as the kernels take them (no copies: they must outlive its use).
qmm::NBitsWeight nbits_weight(const In& codes, int64_t K, int64_t bits, int64_t block_size, const In& scales,
                              const In& zero_points, int operands, const std::optional<In>& g_idx) {
  const bool integer_zero_points = zero_points.dtype() == nb::dtype<uint8_t>();
  return qmm::NBitsWeight{static_cast<const uint8_t*>(codes.data()),
                          static_cast<int64_t>(codes.shape(0)),
                          K,
                          bits,
                          block_size,
                          static_cast<int64_t>(scales.shape(1)),
                          static_cast<int64_t>(codes.shape(1)),
                          static_cast<const float*>(scales.data()),
                          integer_zero_points ? nullptr : static_cast<const float*>(zero_points.data()),
                          integer_zero_points ? static_cast<const uint8_t*>(zero_points.data()) : nullptr,
                          static_cast<qmm::NBitsOperands>(operands),
                          g_idx ? static_cast<const int32_t*>(g_idx->data()) : nullptr};
}

using NBitsProduct = void (*)(const qmm::NBitsDispatch&, const float*, int64_t, const qmm::NBitsWeight&, const float*,
                              float*);

// codes, scales and zero_points may be None where packed is given and the entry in use reads its
// layout at this level: its kernels then read only the packed form (a MatMulNBits at levels 0, 1
// and 4 holds nothing else).
template <NBitsProduct product, bool level4>
nb::ndarray<nb::numpy> matmul_nbits_binding(const In& A, std::optional<In> codes, int64_t K, int64_t bits,
                                            int64_t block_size, std::optional<In> scales, std::optional<In> zero_points,
                                            std::optional<In> bias, int operands, std::optional<In> g_idx,
                                            const qmm::PackedNBits* packed) {
  const int level = level4 ? 4 : operands == 0 ? 0 : 2;  // levels 0 and 1 compute alike; so do 2 and 3 here
  // One entry for the check and the call: the one in use, unless only the packed form is given and
  // that entry does not read its layout but the one that packed it does (another thread's set_isa
  // between the caller's choice of the weight and this call): then that one.
  const qmm::NBitsDispatch& now = qmm::nbits_kernels();
  const bool packer = !codes && packed && packed->entry && packed->layout != qmm::nbits_layout(now, level) &&
                      packed->layout == qmm::nbits_layout(*packed->entry, level);
  const qmm::NBitsDispatch& entry = packer ? *packed->entry : now;
  const bool use_packed = packed && packed->layout && packed->layout == qmm::nbits_layout(entry, level) && !g_idx;
  if (!codes && !use_packed)
    throw nb::value_error("matmul_nbits: the codes are needed: the kernels in use do not read the packed weight");
  if (codes && (!scales || !zero_points))
    throw nb::value_error("matmul_nbits: the codes come with their scales and zero points");
  const int64_t M = static_cast<int64_t>(A.shape(0));
  const qmm::NBitsPacked view = use_packed ? packed->view() : qmm::NBitsPacked{};
  qmm::NBitsWeight w{};
  if (codes) {
    w = nbits_weight(*codes, K, bits, block_size, *scales, *zero_points, operands, g_idx);
    if (use_packed) w.packed = &view;
  } else {  // only the packed form (scales and zero points given are not read)
    w = qmm::packed_nbits_weight(*packed, view);
    w.operands = static_cast<qmm::NBitsOperands>(operands);
  }
  NewArray<float> y({M, w.N});
  {
    nb::gil_scoped_release release;
    product(entry, static_cast<const float*>(A.data()), M, w, bias ? static_cast<const float*>(bias->data()) : nullptr,
            y.data());
  }
  return y.array();
}

// CPU features, the kernel entries (levels, self-test) and threads.
void bind_runtime(nb::module_& m) {
  m.def("measure_peak_gops", [](double seconds) {
    nb::gil_scoped_release release;
    return qmm::measure_peak_gops(seconds);
  });
  m.def("get_num_threads", &qmm::get_num_threads);
  m.def("set_num_threads", &qmm::set_num_threads);
  m.def("cgroup_cpu_quota", &qmm::cgroup_cpu_quota, nb::arg("root") = "");
  m.def("pool_spins", &qmm::pool_spins);
  // A ParallelRegion (csrc/thread_pool.h) as a context manager: the pool's helpers stay awake between
  // the jobs of the calls made inside it (a session's nodes), and sleep again when it ends.
  struct Region {
    std::optional<qmm::ParallelRegion> region;
  };
  nb::class_<Region>(m, "ParallelRegion")
      .def(nb::init<>())
      .def(
          "__enter__",
          [](Region& r) {
            nb::gil_scoped_release release;  // (waits for a job another thread is running)
            if (!r.region) r.region.emplace(qmm::get_num_threads());
            return &r;
          },
          nb::rv_policy::reference)
      .def("__exit__", [](Region& r, nb::args) {
        nb::gil_scoped_release release;
        r.region.reset();
      });
  // Kernel levels by name: "portable", "avx2", "avx512_vnni", "amx", each also with "-emulated"
  // (the emulated entries of that level, for tests).
  auto parse_level = [](const std::string& name, qmm::Isa* isa, bool* emulated) {
    const std::string suffix = "-emulated";
    *emulated = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    return qmm::parse_isa(*emulated ? name.substr(0, name.size() - suffix.size()) : name, isa);
  };
  m.def("best_isa", [] { return std::string(qmm::isa_name(qmm::best_isa())); });
  m.def("active_isa",
        [] { return std::string(qmm::isa_name(qmm::active_isa())) + (qmm::active_emulated() ? "-emulated" : ""); });
  m.def("isa_available", [parse_level](const std::string& name) {
    qmm::Isa isa;
    bool emulated;
    return parse_level(name, &isa, &emulated) && qmm::isa_available(isa, emulated);
  });
  m.def("set_isa", [parse_level](const std::string& name) {
    qmm::Isa isa;
    bool emulated;
    return parse_level(name, &isa, &emulated) && qmm::set_isa(isa, emulated);
  });
  m.def("kernels", [] {  // the entry each family uses now
    const auto label = entry_name;
    nb::dict d;
    d["qgemm"] = label(qmm::qgemm_kernels().info);
    d["qgemm_layout"] = std::string(qmm::qgemm_kernels().layout->name);
    d["nbits"] = label(qmm::nbits_kernels().info);
    d["float8"] = label(qmm::float8_kernels().info);
    return d;
  });
  m.def("kernel_levels", [] {  // the level of the entry each family uses now (an entry's name need not be a level)
    auto level = [](const qmm::EntryInfo& info) { return std::string(qmm::isa_name(info.isa)); };
    nb::dict d;
    d["qgemm"] = level(qmm::qgemm_kernels().info);
    d["nbits"] = level(qmm::nbits_kernels().info);
    d["float8"] = level(qmm::float8_kernels().info);
    return d;
  });
  m.def("float8_pair_order", []() -> nb::object {  // the float8 entry's pair table's order, None if it has none
    const char* order = qmm::float8_kernels().pair_rows ? qmm::float8_kernels().pair_order : nullptr;
    return order ? nb::object(nb::str(order)) : nb::none();
  });
  // For tests: selection as if this CPU lacked the named features (cpu_features' names); [] undoes it.
  m.def("hide_features", [](const std::vector<std::string>& names) {
    static const std::pair<const char*, qmm::Feature> bits[] = {{"avx2", qmm::kFeatAvx2},
                                                                {"fma", qmm::kFeatFma},
                                                                {"f16c", qmm::kFeatF16c},
                                                                {"bmi2", qmm::kFeatBmi2},
                                                                {"avx512f", qmm::kFeatAvx512f},
                                                                {"avx512bw", qmm::kFeatAvx512bw},
                                                                {"avx512vl", qmm::kFeatAvx512vl},
                                                                {"avx512dq", qmm::kFeatAvx512dq},
                                                                {"avx512_vnni", qmm::kFeatAvx512vnni},
                                                                {"avx512_bf16", qmm::kFeatAvx512bf16},
                                                                {"avx512_vbmi", qmm::kFeatAvx512vbmi},
                                                                {"avx_vnni", qmm::kFeatAvxVnni},
                                                                {"amx_tile", qmm::kFeatAmxTile},
                                                                {"amx_int8", qmm::kFeatAmxInt8},
                                                                {"amx_bf16", qmm::kFeatAmxBf16}};
    qmm::Features hidden = 0;
    for (const std::string& name : names) {
      bool known = false;
      for (const auto& [n, bit] : bits)
        if (name == n) hidden |= bit, known = true;
      if (!known) throw nb::value_error(("hide_features: unknown feature " + name).c_str());
    }
    qmm::hide_features(hidden);
  });
  m.def("qgemm_layout", [] { return static_cast<int>(qmm::qgemm_kernels().layout->id); });
  m.def("kernel_entries", &qmm::kernel_entries);
  m.def("self_test_report", &qmm::self_test_report);
  m.def("run_self_tests", &qmm::run_self_tests);
  // Tests only: whether the AVX2 code decoders use pdep (default: the CPU's pdep is fast), and set it.
  m.def("pdep_preferred", &qmm::pdep_preferred);
  m.def("set_pdep_preferred", &qmm::set_pdep_preferred);  // tests only: every entry through its self-test now
  // Benchmarks and tests: the QLinearMatMul driver's blocking (QGemmBlocking, qlinear_matmul.h): 0
  // keeps a field's default; call it with no arguments to restore them all. Set it only between calls.
  m.def(
      "set_qgemm_blocking",
      [](int64_t task_rows, int64_t task_panel_bytes, int64_t k_block, int64_t tasks_per_thread) {
        constexpr int64_t kMax = int64_t{1} << 40;  // far past any product, and no overflow in the driver's sums
        for (int64_t v : {task_rows, task_panel_bytes, k_block, tasks_per_thread})
          if (v < 0 || v > kMax)
            throw nb::value_error("set_qgemm_blocking: expected fields in [0, 2**40] (0: the default)");
        qmm::set_qgemm_blocking({task_rows, task_panel_bytes, k_block, tasks_per_thread});
      },
      nb::arg("task_rows") = 0, nb::arg("task_panel_bytes") = 0, nb::arg("k_block") = 0,
      nb::arg("tasks_per_thread") = 0);
  // The blocking the next call uses with the int8 entry in use: its layout's defaults where no field
  // is set.
  m.def("qgemm_blocking", [] {
    const qmm::QGemmLayout& L = *qmm::qgemm_kernels().layout;
    const qmm::QGemmBlocking b = qmm::qgemm_blocking(L);
    nb::dict d;
    d["layout"] = std::string(L.name);
    d["task_rows"] = b.task_rows;
    d["task_panel_bytes"] = b.task_panel_bytes;
    d["k_block"] = b.k_block;
    d["tasks_per_thread"] = b.tasks_per_thread;
    return d;
  });
  m.def("cpu_features", [] {
    const qmm::CpuFeatures& f = qmm::cpu_features();
    nb::dict d;
    d["vendor"] = f.vendor;
    d["brand"] = f.brand;
    const std::pair<const char*, bool> flags[] = {{"avx2", f.avx2},
                                                  {"fma", f.fma},
                                                  {"f16c", f.f16c},
                                                  {"bmi2", f.bmi2},
                                                  {"avx512f", f.avx512f},
                                                  {"avx512bw", f.avx512bw},
                                                  {"avx512dq", f.avx512dq},
                                                  {"avx512vl", f.avx512vl},
                                                  {"avx512_vnni", f.avx512vnni},
                                                  {"avx512_vbmi", f.avx512vbmi},
                                                  {"avx512_bf16", f.avx512bf16},
                                                  {"avx_vnni", f.avx_vnni},
                                                  {"amx_tile", f.amx_tile},
                                                  {"amx_int8", f.amx_int8},
                                                  {"amx_bf16", f.amx_bf16},
                                                  {"os_avx", f.os_avx},
                                                  {"os_avx512", f.os_avx512},
                                                  {"os_amx", f.os_amx},
                                                  {"pdep_fast", f.pdep_fast}};
    for (const auto& [name, value] : flags) d[name] = value;
    d["family"] = f.family;
    return d;
  });
}

// The 2-D ONNX Runtime call behind qlinear_matmul_2d_onnxruntime / _per_tensor: b_zp and
// multiplier one value (per tensor) or N (per column).
nb::ndarray<nb::numpy> qlinear_matmul_2d(const In& a, bool a_signed, int32_t a_zp, nb::handle b, bool b_signed,
                                         const int32_t* b_zp, bool b_zp_per_tensor, const float* multiplier,
                                         bool multiplier_per_tensor, int32_t y_zp, bool y_signed,
                                         const std::optional<In>& add_codes, bool add_product_first,
                                         const std::array<float, 3>& add_rx_ry_k, const std::optional<In>& add2_codes,
                                         bool add2_product_first, const std::array<float, 3>& add2_rx_ry_k) {
  const int64_t M = static_cast<int64_t>(a.shape(0)), K = static_cast<int64_t>(a.shape(1));
  const qmm::PackedB* packed = nb::isinstance<qmm::PackedB>(b) ? nb::inst_ptr<qmm::PackedB>(b) : nullptr;
  In raw_b;
  if (!packed) raw_b = nb::cast<In>(b);  // a contiguous [K, N] array
  const int64_t N = packed ? packed->N : static_cast<int64_t>(raw_b.shape(1));
  auto add = add_stage("qlinear_matmul_2d", add_codes, add_product_first, add_rx_ry_k, M, N);
  const auto add2 = add_stage("qlinear_matmul_2d", add2_codes, add2_product_first, add2_rx_ry_k, M, N);
  if (add2 && !add) throw std::invalid_argument("qlinear_matmul_2d: add2_codes without add_codes");
  if (add2) add->next = &*add2;
  NewArray<uint8_t> y({M, N});
  {
    nb::gil_scoped_release release;
    const int64_t zero = 0;
    std::vector<int32_t> a_zps(static_cast<size_t>(M), a_zp), b_zps(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) b_zps[n] = b_zp_per_tensor ? b_zp[0] : b_zp[n];
    qmm::QGemmProblem p{1,           M,
                        N,           K,
                        a.data(),    a_signed,
                        &zero,       a_zps.data(),
                        packed,      packed ? nullptr : raw_b.data(),
                        b_signed,    &zero,
                        b_zps.data()};
    const qmm::View3<float> mult_view{multiplier, 0, 0, multiplier_per_tensor ? 0 : 1};
    const qmm::View3<int32_t> zp_view{&y_zp, 0, 0, 0};
    qmm::qlinear_matmul_onnxruntime(p, mult_view, {y.data(), y_signed, zp_view, add ? &*add : nullptr});
  }
  return y.array(y_signed ? nb::dtype<int8_t>() : nb::dtype<uint8_t>());
}

// QLinearMatMul: packed weights, the three integer numerics, the float8 path's helpers.
void bind_qlinear_matmul(nb::module_& m) {
  nb::class_<qmm::PackedB>(m, "PackedB", "8-bit [K, N] matrices packed for the active kernels, with column sums")
      .def_ro("count", &qmm::PackedB::count)
      .def_ro("K", &qmm::PackedB::K)
      .def_ro("N", &qmm::PackedB::N)
      .def_ro("is_signed", &qmm::PackedB::is_signed)
      .def_prop_ro("layout", [](const qmm::PackedB& p) { return static_cast<int>(p.layout->id); })
      // Whether products with it can read a convolution's x in place (QGemmDispatch::kernel_taps): the
      // entry that packed it, or one of the same layout, has a kernel over receptive fields.
      .def_prop_ro("reads_receptive_fields",
                   [](const qmm::PackedB& p) { return p.entry != nullptr && p.entry->kernel_taps != nullptr; })
      .def_prop_ro("nbytes", &qmm::PackedB::bytes);

  // for_receptive_fields: a convolution's weight, packed for the entry whose kernel reads x through its
  // receptive fields (qgemm_taps_kernels, dispatch.h).
  m.def(
      "pack_b",
      [](const In& b, bool is_signed, bool for_receptive_fields) {
        const int64_t count = static_cast<int64_t>(b.shape(0)), K = static_cast<int64_t>(b.shape(1));
        const int64_t N = static_cast<int64_t>(b.shape(2));
        const void* data = b.data();
        nb::gil_scoped_release release;
        return qmm::pack_b_matrices(data, is_signed, count, K, N, for_receptive_fields);
      },
      nb::arg("b"), nb::arg("is_signed"), nb::arg("for_receptive_fields") = false);

  m.def("qlinear_matmul_onnxruntime", qlinear_binding<float, qmm::qlinear_matmul_onnxruntime>);
  // The same with a bias per column of each b matrix (int32 [b count, N], contiguous) added to the sums
  // before the epilogue: QLinearConv's GEMM (onnx/_qconv.py).
  // add_codes (or None), add_product_first, add_rx_ry_k: a QLinearAdd after it (add_stage above; a single
  // product: batch 1), QLinearConv -> QLinearAdd in the session.
  m.def(
      "qlinear_matmul_onnxruntime_bias",
      [](const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b, bool b_signed, const In& b_index,
         const In& b_zp, const In& bias, const In& multiplier, Out y, bool y_signed, const In& y_zp,
         const std::optional<In>& add_codes, bool add_product_first, const std::array<float, 3>& add_rx_ry_k) {
        auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
        p.column_bias = static_cast<const int32_t*>(bias.data());
        if (add_codes && p.batch != 1)
          throw std::invalid_argument("qlinear_matmul_onnxruntime_bias: an add stage on one product only");
        onnxruntime_with_add("qlinear_matmul_onnxruntime_bias", p, multiplier, y, y_signed, y_zp, add_codes,
                             add_product_first, add_rx_ry_k);
      },
      nb::arg("a"), nb::arg("a_signed"), nb::arg("a_index"), nb::arg("a_zp"), nb::arg("b"), nb::arg("b_signed"),
      nb::arg("b_index"), nb::arg("b_zp"), nb::arg("bias"), nb::arg("multiplier"), nb::arg("y"), nb::arg("y_signed"),
      nb::arg("y_zp"), QMM_ADD_STAGE_ARGS(add));
  // The same for a convolution read in place (QGemmProblem::a_offsets): x channels-last, its receptive
  // fields offsets [M, taps] (conv_offsets), pad x's zero point; a_zp [1, M]. False, computing nothing,
  // where the entry in use cannot read it (taps_usable): the caller forms an im2col instead.
  m.def(
      "qlinear_matmul_onnxruntime_taps",
      [](const In& x, const In& offsets, int pad, const In& a_zp, nb::handle b, bool b_signed, const In& b_index,
         const In& b_zp, const In& bias, const In& multiplier, Out y, bool y_signed, const In& y_zp,
         const std::optional<In>& add_codes, bool add_product_first, const std::array<float, 3>& add_rx_ry_k) {
        const int64_t M = static_cast<int64_t>(offsets.shape(0)), taps = static_cast<int64_t>(offsets.shape(1));
        qmm::QGemmProblem p;
        p.batch = 1;
        p.M = M;
        p.b_packed = nb::inst_ptr<qmm::PackedB>(b);
        p.b_raw = nullptr;
        p.N = p.b_packed->N;
        p.K = p.b_packed->K;
        p.a = x.data();
        p.a_signed = false;
        p.a_index = static_cast<const int64_t*>(b_index.data());  // (both [0])
        p.a_zero_point = static_cast<const int32_t*>(a_zp.data());
        p.b_signed = b_signed;
        p.b_index = static_cast<const int64_t*>(b_index.data());
        p.b_zero_point = static_cast<const int32_t*>(b_zp.data());
        p.column_bias = bias.size() ? static_cast<const int32_t*>(bias.data()) : nullptr;
        p.a_offsets = static_cast<const int32_t*>(offsets.data());
        p.a_taps = taps;
        // (the kernel reads x's channels four bytes at a time: an x not 4-byte aligned takes the im2col)
        if (!qmm::taps_usable(p) || reinterpret_cast<uintptr_t>(x.data()) % 4) return false;
        const std::vector<uint8_t> pad_row(static_cast<size_t>(p.K / taps), static_cast<uint8_t>(pad));
        p.a_pad = pad_row.data();
        onnxruntime_with_add("qlinear_matmul_onnxruntime_taps", p, multiplier, y, y_signed, y_zp, add_codes,
                             add_product_first, add_rx_ry_k);
        return true;
      },
      nb::arg("x"), nb::arg("offsets"), nb::arg("pad"), nb::arg("a_zp"), nb::arg("b"), nb::arg("b_signed"),
      nb::arg("b_index"), nb::arg("b_zp"), nb::arg("bias"), nb::arg("multiplier"), nb::arg("y"), nb::arg("y_signed"),
      nb::arg("y_zp"), QMM_ADD_STAGE_ARGS(add));
  m.def("qlinear_matmul_onnx_reference", qlinear_binding<double, qmm::qlinear_matmul_onnx_reference>);

  // MatMulInteger: (a - a_zp) x (b - b_zp) in wrapping int32, [batch, M, N]; the operands as the
  // products above take them (K >= 1).
  m.def("matmul_integer", [](const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b, bool b_signed,
                             const In& b_index, const In& b_zp) {
    const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
    NewArray<int32_t> y({p.batch, p.M, p.N});
    {
      nb::gil_scoped_release release;
      qmm::matmul_integer(p, y.data());
    }
    return y.array();
  });
  // The same sums as float32, scaled (scale: 1 or N float32 values) and with a bias ([N] float32, or None)
  // added, as quantize_dynamic's MatMulInteger -> Cast -> Mul (-> Add) nodes give them (onnx/_dynamic.py).
  m.def("matmul_integer_scaled",
        [](const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b, bool b_signed,
           const In& b_index, const In& b_zp, const In& scale, const std::optional<In>& bias) {
          const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
          const auto floats = [](const In& x, int64_t n) {
            return x.dtype() == nb::dtype<float>() && static_cast<int64_t>(x.size()) == n;
          };
          const bool per_column = floats(scale, p.N) && p.N != 1;
          if (!(per_column || floats(scale, 1)) || (bias && !floats(*bias, p.N)))
            throw std::invalid_argument("matmul_integer_scaled: scale of 1 or N float32 values, bias of N (or None)");
          NewArray<float> y({p.batch, p.M, p.N});
          {
            nb::gil_scoped_release release;
            qmm::matmul_integer_scaled(p, static_cast<const float*>(scale.data()), per_column,
                                       bias ? static_cast<const float*>(bias->data()) : nullptr, y.data());
          }
          return y.array();
        });

  // quantize_dynamic's product in one call from the nodes' own values (onnx/_dynamic.py's bound call): a int8 or
  // uint8 C-contiguous [..., K] (its leading dimensions folded into rows), a_zero_point None or one value of a's
  // type, b packed ([K, N]) with its zero points b_zp int32 [N], the scale f32(a_scale * b_scale[n]) (a_scale
  // one float32, b_scale 1 or N: numpy's product, as the Mul node's) and bias float32 [N] or None, as
  // matmul_integer_scaled gives them; float32 [..., N], or with widths (column counts summing to N: products
  // side by side in b) a tuple of float32 [..., width] arrays. ValueError for anything else.
  m.def(
      "matmul_integer_scaled_rows",
      [](const In& a, const std::optional<In>& a_zp, const qmm::PackedB& b, const In& b_zp, const In& a_scale,
         const In& b_scale, const std::optional<In>& bias,
         const std::optional<std::vector<int64_t>>& widths) -> nb::object {
        const char* fn = "matmul_integer_scaled_rows";
        const bool a_signed = a.dtype() == nb::dtype<int8_t>();
        if ((!a_signed && a.dtype() != nb::dtype<uint8_t>()) || a.ndim() < 2 || !contiguous(a) ||
            static_cast<int64_t>(a.shape(a.ndim() - 1)) != b.K || b.count != 1 || a.size() == 0)
          throw std::invalid_argument(std::string(fn) + ": a int8 or uint8 [..., K] C-contiguous expected");
        if (a_zp && (a_zp->dtype() != a.dtype() || a_zp->size() != 1))
          throw std::invalid_argument(std::string(fn) + ": a_zero_point of one value of a's type expected");
        const int64_t N = b.N, rows = static_cast<int64_t>(a.size()) / b.K;
        const auto floats = [](const In& x, int64_t n) {
          return x.dtype() == nb::dtype<float>() && static_cast<int64_t>(x.size()) == n;
        };
        if (b_zp.dtype() != nb::dtype<int32_t>() || static_cast<int64_t>(b_zp.size()) != N || !contiguous(b_zp) ||
            !floats(a_scale, 1) || !(floats(b_scale, 1) || floats(b_scale, N)) || !contiguous(b_scale) ||
            (bias && (!floats(*bias, N) || !contiguous(*bias))))
          throw std::invalid_argument(std::string(fn) +
                                      ": b_zp int32 [N], a_scale one float32, b_scale 1 or N, bias N");
        int32_t za = 0;
        if (a_zp)
          za = a_signed ? *static_cast<const int8_t*>(a_zp->data()) : *static_cast<const uint8_t*>(a_zp->data());
        // the outputs: one of N columns, or one per width (side by side in b, summing to N)
        const std::vector<int64_t> spans_of = widths ? *widths : std::vector<int64_t>{N};
        if (std::any_of(spans_of.begin(), spans_of.end(), [](int64_t w) { return w < 1; }) ||
            std::accumulate(spans_of.begin(), spans_of.end(), int64_t{0}) != N)
          throw std::invalid_argument(std::string(fn) + ": widths of at least 1 summing to N expected");
        std::vector<NewArray<float>> ys;
        std::vector<qmm::ColumnSpan> spans;
        for (int64_t w : spans_of) {
          std::vector<int64_t> dims;
          for (size_t d = 0; d + 1 < a.ndim(); ++d) dims.push_back(static_cast<int64_t>(a.shape(d)));
          dims.push_back(w);
          ys.emplace_back(dims);
          const int64_t begin = spans.empty() ? 0 : spans.back().end;
          spans.push_back({begin, begin + w, ys.back().data()});
        }
        {
          nb::gil_scoped_release release;
          static const int64_t kZero[1] = {0};
          const std::vector<int32_t> a_zero_points(static_cast<size_t>(rows), za);
          qmm::QGemmProblem p;
          p.batch = 1, p.M = rows, p.N = N, p.K = b.K;
          p.a = a.data(), p.a_signed = a_signed, p.a_index = kZero, p.a_zero_point = a_zero_points.data();
          p.b_packed = &b, p.b_raw = nullptr, p.b_signed = b.is_signed, p.b_index = kZero;
          p.b_zero_point = static_cast<const int32_t*>(b_zp.data());
          const float s = *static_cast<const float*>(a_scale.data());
          const auto* bs = static_cast<const float*>(b_scale.data());
          std::vector<float> scale(b_scale.size());
          for (size_t n = 0; n < scale.size(); ++n) scale[n] = s * bs[n];
          qmm::matmul_integer_scaled(p, scale.data(), scale.size() > 1,
                                     bias ? static_cast<const float*>(bias->data()) : nullptr, spans);
        }
        if (!widths) return nb::cast(ys[0].array());
        nb::list out;
        for (auto& y : ys) out.append(y.array());
        return nb::tuple(out);
      },
      nb::arg("a"), nb::arg("a_zero_point").none(), nb::arg("b"), nb::arg("b_zp"), nb::arg("a_scale"),
      nb::arg("b_scale"), nb::arg("bias").none(), nb::arg("widths").none() = nb::none());

  // The fast path of the common call: 2-D a, per-tensor a and y, per-tensor or per-column b,
  // numerics "onnxruntime". Allocates and returns y [M, N]; scales are already combined into the
  // float32 multiplier (length 1 or N), zero points are plain integers or an int32 vector.
  // QLinearMatMul's common case, 2-D a and b, per-tensor a and y parameters, b per tensor or per
  // column: the ONNX Runtime numerics with the multiplier(s) computed by the caller.
  // add_codes (or None), add_product_first, add_rx_ry_k: a QLinearAdd of the product and a row of codes
  // after it (qmm::QLinearAddStage; the session's QLinearMatMul -> QLinearAdd(bias) pairs); add2_*: a
  // second one on that add's output, of an [M, N] matrix of codes (a residual).
  m.def(
      "qlinear_matmul_2d_onnxruntime",
      [](const In& a, bool a_signed, int32_t a_zp, nb::handle b, bool b_signed, const In& b_zp, const In& multiplier,
         int32_t y_zp, bool y_signed, const std::optional<In>& add_codes, bool add_product_first,
         const std::array<float, 3>& add_rx_ry_k, const std::optional<In>& add2_codes, bool add2_product_first,
         const std::array<float, 3>& add2_rx_ry_k) {
        const bool per_tensor = multiplier.shape(0) == 1;
        return qlinear_matmul_2d(a, a_signed, a_zp, b, b_signed, static_cast<const int32_t*>(b_zp.data()),
                                 b_zp.shape(0) == 1, static_cast<const float*>(multiplier.data()), per_tensor, y_zp,
                                 y_signed, add_codes, add_product_first, add_rx_ry_k, add2_codes, add2_product_first,
                                 add2_rx_ry_k);
      },
      nb::arg("a"), nb::arg("a_signed"), nb::arg("a_zp"), nb::arg("b"), nb::arg("b_signed"), nb::arg("b_zp"),
      nb::arg("multiplier"), nb::arg("y_zp"), nb::arg("y_signed"), QMM_ADD_STAGE_ARGS(add), QMM_ADD_STAGE_ARGS(add2));
  // The same with per-tensor b parameters as Python numbers (no arrays to build for a small call).
  m.def(
      "qlinear_matmul_2d_per_tensor",
      [](const In& a, bool a_signed, int32_t a_zp, nb::handle b, bool b_signed, int32_t b_zp, float multiplier,
         int32_t y_zp, bool y_signed, const std::optional<In>& add_codes, bool add_product_first,
         const std::array<float, 3>& add_rx_ry_k, const std::optional<In>& add2_codes, bool add2_product_first,
         const std::array<float, 3>& add2_rx_ry_k) {
        return qlinear_matmul_2d(a, a_signed, a_zp, b, b_signed, &b_zp, true, &multiplier, true, y_zp, y_signed,
                                 add_codes, add_product_first, add_rx_ry_k, add2_codes, add2_product_first,
                                 add2_rx_ry_k);
      },
      nb::arg("a"), nb::arg("a_signed"), nb::arg("a_zp"), nb::arg("b"), nb::arg("b_signed"), nb::arg("b_zp"),
      nb::arg("multiplier"), nb::arg("y_zp"), nb::arg("y_signed"), QMM_ADD_STAGE_ARGS(add), QMM_ADD_STAGE_ARGS(add2));

  // Batches of products with every parameter per tensor, a [B, M, K] and b [B, K, N] contiguous
  // (attention's): y [B, M, N], the index maps and zero-point arrays built here, not in Python.
  m.def("qlinear_matmul_batched_per_tensor", [](const In& a, bool a_signed, int32_t a_zp, const In& b, bool b_signed,
                                                int32_t b_zp, float multiplier, int32_t y_zp, bool y_signed) {
    if (a.ndim() != 3 || b.ndim() != 3 || b.shape(0) != a.shape(0) || b.shape(1) != a.shape(2))
      throw std::invalid_argument("qlinear_matmul_batched_per_tensor: a [B, M, K] and b [B, K, N] expected");
    const int64_t B = static_cast<int64_t>(a.shape(0)), M = static_cast<int64_t>(a.shape(1));
    const int64_t K = static_cast<int64_t>(a.shape(2)), N = static_cast<int64_t>(b.shape(2));
    NewArray<uint8_t> y({B, M, N});
    {
      nb::gil_scoped_release release;
      std::vector<int64_t> index(static_cast<size_t>(B));
      std::iota(index.begin(), index.end(), int64_t{0});
      // one matrix's zero points, which every matrix shares (a_zero_point_ld, b_zero_point_ld 0)
      std::vector<int32_t> a_zps(static_cast<size_t>(M), a_zp), b_zps(static_cast<size_t>(N), b_zp);
      qmm::QGemmProblem p{B,
                          M,
                          N,
                          K,
                          a.data(),
                          a_signed,
                          index.data(),
                          a_zps.data(),
                          nullptr,
                          b.data(),
                          b_signed,
                          index.data(),
                          b_zps.data()};
      p.a_zero_point_ld = 0;
      p.b_zero_point_ld = 0;
      const qmm::View3<float> mult_view{&multiplier, 0, 0, 0};
      const qmm::View3<int32_t> zp_view{&y_zp, 0, 0, 0};
      qmm::qlinear_matmul_onnxruntime(p, mult_view, {y.data(), y_signed, zp_view});
    }
    return y.array(y_signed ? nb::dtype<int8_t>() : nb::dtype<uint8_t>());
  });

  m.def("qlinear_matmul_exact", [](const In& a, bool a_signed, const In& a_index, const In& a_zp, nb::handle b,
                                   bool b_signed, const In& b_index, const In& b_zp, const In& a_scale,
                                   const In& b_scale, const In& y_scale, Out y, bool y_signed, const In& y_zp) {
    const auto p = problem(a, a_signed, a_index, a_zp, b, b_signed, b_index, b_zp);
    const auto out = output(y, y_signed, y_zp);
    const auto sa = view3<float>(a_scale), sb = view3<float>(b_scale), sy = view3<float>(y_scale);
    nb::gil_scoped_release release;
    qmm::qlinear_matmul_exact(p, sa, sb, sy, out);
  });

  // float32 [n] contiguous -> float8 bytes [n] (type 0..3: e4m3fn, e4m3fnuz, e5m2, e5m2fnuz),
  // saturating, round to nearest even: numpy.clip(x, -max, max).astype(type), faster. The
  // conversion float8_output ends with; the tests check it against ml_dtypes on every boundary.
  m.def("float32_to_float8", [](const In& x, int type) {
    const int64_t count = static_cast<int64_t>(x.size());
    NewArray<uint8_t> out({count});
    {
      nb::gil_scoped_release release;
      qmm::float32_to_float8(static_cast<const float*>(x.data()), count, static_cast<qmm::Float8>(type), out.data());
    }
    return out.array();
  });

  // The float path's output step for a float8 output (qmm::float8_output): d float32 [B, M, N]
  // contiguous, the parameters float32 [B, M, N] views (any strides, zero where broadcast).
  m.def("float8_output",
        [](const In& d, const In& a_scale, const In& b_scale, const In& y_scale, const In& y_zp, int type) {
          const int64_t B = static_cast<int64_t>(d.shape(0)), M = static_cast<int64_t>(d.shape(1)),
                        N = static_cast<int64_t>(d.shape(2));
          auto params = [](const In& x) {
            return qmm::Float8OutputParams{static_cast<const float*>(x.data()), x.stride(0), x.stride(1), x.stride(2)};
          };
          NewArray<uint8_t> out({B, M, N});
          {
            nb::gil_scoped_release release;
            qmm::float8_output(static_cast<const float*>(d.data()), B, M, N, params(a_scale), params(b_scale),
                               params(y_scale), params(y_zp), static_cast<qmm::Float8>(type), out.data());
          }
          return out.array();
        });

  // out[i] = table[q[i]]: uint8 [n] contiguous through a float32 [256] table (an 8-bit type as float32).
  m.def("lookup_float32", [](const In& q, const In& table) {
    const int64_t count = static_cast<int64_t>(q.size());
    NewArray<float> out({count});
    {
      nb::gil_scoped_release release;
      qmm::lookup_float32(static_cast<const uint8_t*>(q.data()), count, static_cast<const float*>(table.data()),
                          out.data());
    }
    return out.array();
  });

  nb::class_<qmm::PackedF32>(m, "PackedF32", "float32 [K, N] matrices packed for the float8 path's kernels")
      .def_ro("count", &qmm::PackedF32::count)
      .def_ro("K", &qmm::PackedF32::K)
      .def_ro("N", &qmm::PackedF32::N)
      .def_prop_ro("entry", [](const qmm::PackedF32& p) { return p.entry ? entry_name(p.entry->info) : std::string(); })
      .def_prop_ro("nbytes", &qmm::PackedF32::bytes);

  m.def("pack_f32", [](const In& b) {
    const int64_t count = static_cast<int64_t>(b.shape(0)), K = static_cast<int64_t>(b.shape(1));
    const int64_t N = static_cast<int64_t>(b.shape(2));
    const auto* data = static_cast<const float*>(b.data());
    nb::gil_scoped_release release;
    return qmm::pack_f32(data, count, K, N);
  });
  // The float8 entry in use (its name), for repacking a PackedF32 made under another one.
  m.def("float8_entry", [] { return entry_name(qmm::float8_kernels().info); });

  // b: a PackedF32 or contiguous float32 [Bb, K, N] (packed for this call). a: contiguous float32
  // [Ba, M, K], or with a_table (float32 [256]) 8-bit codes [Ba, M, K] whose values a_table holds:
  // looked up here into a buffer the calling thread keeps for its next call, up to 64 MiB (no
  // float32 copy of a made, and page-faulted, per call).
  m.def(
      "matmul_f32_sequential",
      [](const In& a, const In& a_index, nb::handle b, const In& b_index, Out out, std::optional<In> a_table) {
        const int64_t batch = static_cast<int64_t>(a_index.shape(0));
        const int64_t M = static_cast<int64_t>(a.shape(1)), K = static_cast<int64_t>(a.shape(2));
        const auto* ai = static_cast<const int64_t*>(a_index.data());
        const auto* bi = static_cast<const int64_t*>(b_index.data());
        auto* y = static_cast<float*>(out.data());
        const qmm::PackedF32* packed = nullptr;
        qmm::PackedF32 own;  // b given as float32 matrices: packed for this call
        if (nb::isinstance<qmm::PackedF32>(b)) {
          packed = nb::inst_ptr<qmm::PackedF32>(b);
        } else {
          const In raw = nb::cast<In>(b);
          const int64_t count = static_cast<int64_t>(raw.shape(0)), N = static_cast<int64_t>(raw.shape(2));
          const auto* b_data = static_cast<const float*>(raw.data());
          nb::gil_scoped_release release;
          own = qmm::pack_f32(b_data, count, K, N);
          packed = &own;
        }
        if (!a_table) {
          nb::gil_scoped_release release;
          qmm::matmul_f32_sequential(batch, M, K, static_cast<const float*>(a.data()), ai, *packed, bi, y);
          return;
        }
        // a as codes: a's float32 values (where the pair table does not run) looked up into a buffer
        // the calling thread keeps for its next call, up to 64 MiB.
        const size_t count = a.size();
        const auto* codes = static_cast<const uint8_t*>(a.data());
        const auto* table = static_cast<const float*>(a_table->data());
        qmm::Buffer<float> once;  // a's values past 64 MiB: not kept
        auto values = [&]() -> const float* {
          thread_local qmm::Buffer<float> kept;
          thread_local size_t kept_size = 0;
          float* v;
          if (count <= kept_size) {
            v = kept.get();
          } else if (count * sizeof(float) <= (size_t{64} << 20)) {
            kept = qmm::alloc_buffer<float>(count);
            kept_size = count;
            v = kept.get();
          } else {
            once = qmm::alloc_buffer<float>(count);
            v = once.get();
          }
          qmm::lookup_float32(codes, static_cast<int64_t>(count), table, v);
          return v;
        };
        nb::gil_scoped_release release;
        qmm::matmul_f32_codes(batch, M, K, codes, table, values, ai, *packed, bi, y);
      },
      nb::arg("a"), nb::arg("a_index"), nb::arg("b"), nb::arg("b_index"), nb::arg("out"),
      nb::arg("a_table") = nb::none());

  m.def("matmul_i64_exact128",
        [](const In& a, const In& a_index, const In& b, const In& b_index, Out out_hi, Out out_lo) {
          const int64_t batch = static_cast<int64_t>(a_index.shape(0));
          const int64_t M = static_cast<int64_t>(a.shape(1)), K = static_cast<int64_t>(a.shape(2));
          const int64_t N = static_cast<int64_t>(b.shape(2));
          nb::gil_scoped_release release;
          qmm::matmul_i64_exact128(batch, M, N, K, static_cast<const int64_t*>(a.data()),
                                   static_cast<const int64_t*>(a_index.data()), static_cast<const int64_t*>(b.data()),
                                   static_cast<const int64_t*>(b_index.data()), static_cast<int64_t*>(out_hi.data()),
                                   static_cast<uint64_t*>(out_lo.data()));
        });
}

// MatMulNBits: the products per accuracy level and the code decoder.
void bind_matmul_nbits(nb::module_& m) {
  // MatMulNBits: A float32 [M, K] contiguous, codes uint8 [N, row_bytes], scales float32 and zero
  // points uint8 or float32 [N, k_blocks], bias float32 [N] or None; returns Y float32 [M, N]. Levels 0/1 in
  // float32, level 4 with A quantized to int8 per block as ONNX Runtime does.
  // operands (matmul_nbits_f32): 0 float32 (levels 0/1), 1 float16, 2 bfloat16 (levels 2/3: A and W
  // are rounded here).
  m.def("matmul_nbits_f32", matmul_nbits_binding<qmm::matmul_nbits_f32, false>, nb::arg("A"), nb::arg("codes").none(),
        nb::arg("K"), nb::arg("bits"), nb::arg("block_size"), nb::arg("scales").none(), nb::arg("zero_points").none(),
        nb::arg("bias").none(), nb::arg("operands") = 0, nb::arg("g_idx").none() = nb::none(),
        nb::arg("packed").none() = nb::none());
  // packed: the weight packed by pack_nbits_weight (the kernels of an entry with its layout read it).
  m.def("matmul_nbits_int8", matmul_nbits_binding<qmm::matmul_nbits_int8, true>, nb::arg("A"), nb::arg("codes").none(),
        nb::arg("K"), nb::arg("bits"), nb::arg("block_size"), nb::arg("scales").none(), nb::arg("zero_points").none(),
        nb::arg("bias").none(), nb::arg("operands") = 0, nb::arg("g_idx").none() = nb::none(),
        nb::arg("packed").none() = nb::none());

  // A constant weight packed for the entry in use at an accuracy level (its layout for that level:
  // nbits_layout, dispatch.h), or None where that entry has no layout there or its layout does not
  // take this weight (g_idx, block sizes above 4096).
  nb::class_<qmm::PackedNBits>(m, "PackedNBits",
                               "A MatMulNBits weight packed for one kernel entry's kernels at a level")
      .def_prop_ro("layout", [](const qmm::PackedNBits& p) { return std::string(p.layout->name); })
      .def_prop_ro("nbytes", &qmm::PackedNBits::bytes);
  // The scales (float32) and zero points (uint8, or float32 for float ones) [N, k_blocks] of a packed
  // weight, exactly as they were given to pack_nbits_weight.
  m.def("unpack_nbits_floats", [](const qmm::PackedNBits& packed) {
    auto unpack = [&](auto zero_points) {
      NewArray<float> scales({packed.N, packed.k_blocks});
      {
        nb::gil_scoped_release release;
        qmm::unpack_nbits_floats(packed, scales.data(), zero_points.data());
      }
      return nb::make_tuple(scales.array(), zero_points.array());
    };
    if (packed.u8_zero_points) return unpack(NewArray<uint8_t>({packed.N, packed.k_blocks}));
    return unpack(NewArray<float>({packed.N, packed.k_blocks}));
  });
  // The codes [N, row_bytes] of a packed weight, as they were given to pack_nbits_weight.
  m.def("unpack_nbits_weight", [](const qmm::PackedNBits& packed) {
    NewArray<uint8_t> codes({packed.N, packed.row_bytes});
    {
      nb::gil_scoped_release release;
      qmm::unpack_nbits_weight(packed, codes.data());
    }
    return codes.array();
  });
  m.def(
      "nbits_weight_layout",
      [](int level) -> std::optional<std::string> {
        const qmm::NBitsLayout* layout = qmm::nbits_layout(qmm::nbits_kernels(), level);
        return layout ? std::optional<std::string>(layout->name) : std::nullopt;
      },
      nb::arg("level"));
  m.def(
      "pack_nbits_weight",
      [](const In& codes, int64_t K, int64_t bits, int64_t block_size, const In& scales, const In& zero_points,
         int level) -> std::optional<qmm::PackedNBits> {
        const qmm::NBitsWeight w = nbits_weight(codes, K, bits, block_size, scales, zero_points, 0, std::nullopt);
        qmm::PackedNBits packed;
        const qmm::NBitsDispatch& entry = qmm::nbits_kernels();
        {
          nb::gil_scoped_release release;
          packed = qmm::pack_nbits_weight(qmm::nbits_layout(entry, level), w);
        }
        packed.entry = &entry;
        if (!packed.layout) return std::nullopt;
        return packed;
      },
      nb::arg("codes"), nb::arg("K"), nb::arg("bits"), nb::arg("block_size"), nb::arg("scales"), nb::arg("zero_points"),
      nb::arg("level"));

  // The first `count` codes of each row of a contiguous uint8 [rows, bytes] array of LSB-first bitstreams.
  m.def("decode_nbits", [](const In& data, int64_t bits, int64_t count) {
    const int64_t rows = static_cast<int64_t>(data.shape(0)), bytes = static_cast<int64_t>(data.shape(1));
    NewArray<uint8_t> out({rows, count});
    {
      nb::gil_scoped_release release;
      const auto* in = static_cast<const uint8_t*>(data.data());
      for (int64_t r = 0; r < rows; ++r) qmm::decode_nbits(in + r * bytes, bits, count, out.data() + r * count);
    }
    return out.array();
  });
}

// quantize_linear.py's common case (float32 x or y, an 8- or 16-bit integer type: 0 int8, 1 uint8,
// 2 int16, 3 uint16; per tensor or per axis). The caller ensures it all: x and y contiguous with
// the same number of elements, scale float32 and zero_point int32 contiguous with one value per
// channel, inner the elements per channel run.
void bind_quantize_linear(nb::module_& m) {
  m.def("quantize_linear_f32", [](const In& x, const In& scale, const In& zero_point, int64_t inner, int type, Out y) {
    const qmm::LinearShape shape{static_cast<int64_t>(x.size()), static_cast<int64_t>(scale.size()), inner};
    nb::gil_scoped_release release;
    qmm::quantize_linear_f32(static_cast<const float*>(x.data()), shape, static_cast<const float*>(scale.data()),
                             static_cast<const int32_t*>(zero_point.data()), static_cast<qmm::IntType>(type), y.data());
  });
  m.def("dequantize_linear_f32",
        [](const In& x, int type, const In& scale, const In& zero_point, int64_t inner, Out y) {
          const qmm::LinearShape shape{static_cast<int64_t>(x.size()), static_cast<int64_t>(scale.size()), inner};
          nb::gil_scoped_release release;
          qmm::dequantize_linear_f32(x.data(), static_cast<qmm::IntType>(type), shape,
                                     static_cast<const float*>(scale.data()),
                                     static_cast<const int32_t*>(zero_point.data()), static_cast<float*>(y.data()));
        });
  m.def("quantize_linear_path", [] { return std::string(qmm::quantize_linear_path()); });
}

// The ONNX session's float operators (onnx/_session.py): Erf of a contiguous float32 or float64 x
// into float32 y of as many elements; DynamicQuantizeLinear of a contiguous float32 x into uint8
// y, returning (scale, zero point).
void bind_onnx_ops(nb::module_& m) {
  // path (float32 x only): "" the one erf_path() names, or one of erf_paths(); False if not there.
  m.def(
      "erf",
      [](const In& x, Out y, const std::string& path) {
        const auto count = static_cast<int64_t>(x.size());
        auto* out = static_cast<float*>(y.data());
        const bool is_double = x.dtype() == nb::dtype<double>();
        nb::gil_scoped_release release;
        if (!is_double) return qmm::erf_f32(static_cast<const float*>(x.data()), count, out, path.c_str());
        qmm::erf_f32(static_cast<const double*>(x.data()), count, out);
        return true;
      },
      nb::arg("x"), nb::arg("y"), nb::arg("path") = "");
  m.def("erf_path", [] { return std::string(qmm::erf_path()); });
  m.def("erf_paths", &qmm::erf_paths);
  m.def("keep_heap", &qmm::keep_heap);  // the session's heap settings (glibc)
  // out[i] = table[codes[i]] (onnx/_tables.py): codes uint8 contiguous, table 256 contiguous elements of
  // 1, 2, 4 or 8 bytes, out contiguous of codes' size and table's element size; False for another size,
  // or for a table of bytes and a path that is not there (lookup_paths()).
  using Contiguous = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
  m.def(
      "lookup_codes",
      [](const Contiguous& codes, const Contiguous& table, nb::ndarray<nb::c_contig, nb::device::cpu> out,
         const std::string& path) {
        const auto count = static_cast<int64_t>(codes.size());
        const auto bytes = static_cast<int>(table.itemsize());
        if (codes.dtype() != nb::dtype<uint8_t>() || table.size() != 256 || static_cast<int64_t>(out.size()) != count ||
            static_cast<int>(out.itemsize()) != bytes)
          throw std::invalid_argument(
              "lookup_codes: uint8 codes, a 256-entry table, out of codes' size and table's type");
        nb::gil_scoped_release release;
        return qmm::lookup_codes(static_cast<const uint8_t*>(codes.data()), count, table.data(), bytes, out.data(),
                                 path.c_str());
      },
      nb::arg("codes"), nb::arg("table"), nb::arg("out"), nb::arg("path") = "");
  m.def("lookup_path", [] { return std::string(qmm::lookup_path()); });
  m.def("lookup_paths", &qmm::lookup_paths);
  // QLinearAdd / QLinearMul (onnx/_qlinear_ops.py): x, y and out contiguous 8-bit codes of one size.
  // x and y of out's size, or one of them of a divisor of it (repeated: onnx_ops.h): (x, y, out) counts.
  const auto binary_counts = [](const char* fn, const In& x, const In& y, const Out& out) {
    const auto count = static_cast<int64_t>(out.size()), nx = static_cast<int64_t>(x.size()),
               ny = static_cast<int64_t>(y.size());
    const auto fits = [&](int64_t n) { return n == count || (n > 0 && count % n == 0); };
    if (!fits(nx) || !fits(ny) || (nx < count && ny < count))
      throw std::invalid_argument(std::string(fn) + ": x and y of out's size, or one of them of a divisor of it");
    return std::array<int64_t, 3>{nx, ny, count};
  };
  m.def("qlinear_add_codes",
        [binary_counts](const In& x, const In& y, bool is_signed, float rx, float ry, float k, Out out) {
          const auto n = binary_counts("qlinear_add_codes", x, y, out);
          nb::gil_scoped_release release;
          qmm::qlinear_add_codes(x.data(), n[0], y.data(), n[1], n[2], is_signed, rx, ry, k, out.data());
        });
  m.def("qlinear_mul_codes",
        [binary_counts](const In& x, const In& y, bool is_signed, int32_t zx, int32_t zy, float r, float zc, Out out) {
          const auto n = binary_counts("qlinear_mul_codes", x, y, out);
          nb::gil_scoped_release release;
          qmm::qlinear_mul_codes(x.data(), n[0], y.data(), n[1], n[2], is_signed, zx, zy, r, zc, out.data());
        });
  m.def("qlinear_binary_path", &qmm::qlinear_binary_path);
  // QLinearSoftmax (onnx/_qlinear_ops.py): x and out contiguous [rows, D] codes, table float32 [256].
  m.def("qlinear_global_average_pool_codes", [](const In& x, bool is_signed, int64_t N, int64_t S, int64_t C,
                                                bool channels_last, int32_t x_zp, float scale, int32_t y_zp, Out y) {
    if (static_cast<int64_t>(x.size()) != N * S * C || static_cast<int64_t>(y.size()) != N * C)
      throw std::invalid_argument("qlinear_global_average_pool_codes: x of N * S * C codes, y of N * C");
    nb::gil_scoped_release release;
    qmm::qlinear_global_average_pool_codes(x.data(), is_signed, N, S, C, channels_last, x_zp, scale, y_zp, y.data());
  });
  m.def("layer_norm_rows",
        [](const In& x, const In& scale, std::optional<In> bias, float epsilon, Out y, Out mean, Out inv_std_dev) {
          if (x.ndim() != 2 || x.dtype() != nb::dtype<float>())
            throw std::invalid_argument("layer_norm_rows: x float32 [rows, cols] expected");
          const auto rows = static_cast<int64_t>(x.shape(0)), cols = static_cast<int64_t>(x.shape(1));
          const auto sized = [](const auto& a, int64_t n) {
            return a.dtype() == nb::dtype<float>() && static_cast<int64_t>(a.size()) == n;
          };
          if (!sized(scale, cols) || (bias && !sized(*bias, cols)) || !sized(y, rows * cols) || !sized(mean, rows) ||
              !sized(inv_std_dev, rows))
            throw std::invalid_argument(
                "layer_norm_rows: scale and bias [cols], y [rows, cols], mean and inv_std_dev [rows] float32");
          nb::gil_scoped_release release;
          qmm::layer_norm_rows(static_cast<const float*>(x.data()), rows, cols, static_cast<const float*>(scale.data()),
                               bias ? static_cast<const float*>(bias->data()) : nullptr, epsilon,
                               static_cast<float*>(y.data()), static_cast<float*>(mean.data()),
                               static_cast<float*>(inv_std_dev.data()));
        });
  // onnx.reference's float32 element-wise nodes as one chain (onnx/_float_chains.py): operands float32 arrays of
  // any strides, steps int32 [n, 3] rows (ChainOp, a, b) as qmm::ChainStep; a new C-contiguous float32 y of
  // the operands' broadcast shape. ValueError where they do not broadcast.
  m.def(
      "float_chain",
      [](const std::vector<In>& arrays, const In& steps, const std::string& erf_path) {
        std::vector<qmm::ChainOperand> operands;
        for (const In& a : arrays) {
          if (a.dtype() != nb::dtype<float>()) throw std::invalid_argument("float_chain: float32 operands expected");
          qmm::ChainOperand o{static_cast<const float*>(a.data()), {}, {}};
          for (size_t d = 0; d < a.ndim(); ++d) {
            o.shape.push_back(static_cast<int64_t>(a.shape(d)));
            o.strides.push_back(static_cast<int64_t>(a.stride(d)));
          }
          operands.push_back(std::move(o));
        }
        if (steps.dtype() != nb::dtype<int32_t>() || steps.ndim() != 2 || steps.shape(1) != 3 || steps.stride(1) != 1 ||
            steps.stride(0) != 3)
          throw std::invalid_argument("float_chain: steps int32 [n, 3] contiguous expected");
        const auto* raw = static_cast<const int32_t*>(steps.data());
        std::vector<qmm::ChainStep> program;
        for (size_t i = 0; i < steps.shape(0); ++i) {
          if (raw[3 * i] < 0 || raw[3 * i] > static_cast<int32_t>(qmm::ChainOp::kNeg))
            throw std::invalid_argument("float_chain: no such operation");
          program.push_back({static_cast<qmm::ChainOp>(raw[3 * i]), raw[3 * i + 1], raw[3 * i + 2]});
        }
        NewArray<float> y(qmm::chain_shape(operands));
        {
          nb::gil_scoped_release release;
          qmm::float_chain(operands, program, erf_path.c_str(), y.data());
        }
        return y.array();
      },
      nb::arg("operands"), nb::arg("steps"), nb::arg("erf_path") = "");
  // A LayerNormalization with its neighbours as one call (onnx/_layer_norms.py). In: x float32 (x_type -1),
  // plus residual (float32 of x's size, or None) added first as an Add node adds them; or x 8-bit codes
  // (x_type an IntType, 0 or 1) dequantized per tensor, f32(x - x_zp) * x_scale (dequantize_linear_f32).
  // The rows [x.size / cols, cols] (cols: scale's size) normalized as layer_norm_rows. Out: out_type -1, y
  // float32 of x's shape; 0 or 1, y quantized per tensor to codes (quantize_linear_f32's bits); -2, the tuple
  // (y, DynamicQuantizeLinear's codes, scale and zero point). x, residual, scale and bias C-contiguous.
  m.def(
      "layer_norm_staged",
      [](const In& x, const std::optional<In>& residual, int x_type, float x_scale, int32_t x_zp, const In& scale,
         const std::optional<In>& bias, float epsilon, int out_type, float y_scale, int32_t y_zp) -> nb::object {
        const char* fn = "layer_norm_staged";
        const auto is_float = [](const In& a) { return a.dtype() == nb::dtype<float>(); };
        const bool codes_in =
            x_type == static_cast<int>(qmm::IntType::kInt8) || x_type == static_cast<int>(qmm::IntType::kUInt8);
        const int64_t count = static_cast<int64_t>(x.size()), cols = static_cast<int64_t>(scale.size());
        const bool x_ok = codes_in
                              ? x.dtype() == (x_type == static_cast<int>(qmm::IntType::kInt8) ? nb::dtype<int8_t>()
                                                                                              : nb::dtype<uint8_t>())
                              : x_type == -1 && is_float(x);
        if (!x_ok || !contiguous(x) || count == 0 || cols == 0 || count % cols != 0 || !is_float(scale) ||
            !contiguous(scale) || (bias && (!is_float(*bias) || !contiguous(*bias) || bias->size() != scale.size())) ||
            (residual && (codes_in || !is_float(*residual) || !contiguous(*residual) || residual->size() != x.size())))
          throw std::invalid_argument(std::string(fn) + ": x, residual, scale and bias as documented expected");
        if (out_type < -2 || out_type > static_cast<int>(qmm::IntType::kUInt8))
          throw std::invalid_argument(std::string(fn) + ": out_type -2, -1, 0 or 1 expected");
        std::vector<int64_t> dims;
        for (size_t d = 0; d < x.ndim(); ++d) dims.push_back(static_cast<int64_t>(x.shape(d)));
        const int64_t rows = count / cols;
        const qmm::LinearShape per_tensor{count, 1, count};
        NewArray<float> y(dims);
        NewArray<uint8_t> codes(out_type == -1 ? std::vector<int64_t>{} : dims);
        NewArray<float> q_scale(std::vector<int64_t>{});
        NewArray<uint8_t> q_zp(std::vector<int64_t>{});
        {
          nb::gil_scoped_release release;
          const float* in = static_cast<const float*>(x.data());
          if (codes_in) {  // (y holds the dequantized x; normalized in place)
            qmm::dequantize_linear_f32(x.data(), static_cast<qmm::IntType>(x_type), per_tensor, &x_scale, &x_zp,
                                       y.data());
            in = y.data();
          }
          std::vector<float> mean(static_cast<size_t>(rows)), inv_std_dev(static_cast<size_t>(rows));
          qmm::layer_norm_rows(in, rows, cols, static_cast<const float*>(scale.data()),
                               bias ? static_cast<const float*>(bias->data()) : nullptr, epsilon, y.data(), mean.data(),
                               inv_std_dev.data(), residual ? static_cast<const float*>(residual->data()) : nullptr);
          if (out_type >= 0) {
            qmm::quantize_linear_f32(y.data(), per_tensor, &y_scale, &y_zp, static_cast<qmm::IntType>(out_type),
                                     codes.data());
          } else if (out_type == -2) {
            const qmm::DynamicQuantization q = qmm::dynamic_quantize_linear(y.data(), count, codes.data());
            *q_scale.data() = q.scale;
            *q_zp.data() = q.zero_point;
          }
        }
        if (out_type == -1) return nb::cast(y.array());
        if (out_type == -2) return nb::make_tuple(y.array(), codes.array(), q_scale.array(), q_zp.array());
        const bool out_signed = out_type == static_cast<int>(qmm::IntType::kInt8);
        return nb::cast(codes.array(out_signed ? nb::dtype<int8_t>() : nb::dtype<uint8_t>()));
      },
      nb::arg("x"), nb::arg("residual").none(), nb::arg("x_type"), nb::arg("x_scale"), nb::arg("x_zp"),
      nb::arg("scale"), nb::arg("bias").none(), nb::arg("epsilon"), nb::arg("out_type"), nb::arg("y_scale"),
      nb::arg("y_zp"));
  // Softmax's two passes around np.exp (qmm::softmax_shift_rows, softmax_normalize_rows): float32 [rows, cols]
  // C-contiguous (x may be y).
  m.def("softmax_shift_rows", [](const In& x, Out y) {
    if (x.ndim() != 2 || x.dtype() != nb::dtype<float>() || y.dtype() != nb::dtype<float>() || y.size() != x.size() ||
        !contiguous(x) || !contiguous(y))
      throw std::invalid_argument("softmax_shift_rows: x and y float32 [rows, cols] C-contiguous expected");
    nb::gil_scoped_release release;
    qmm::softmax_shift_rows(static_cast<const float*>(x.data()), static_cast<int64_t>(x.shape(0)),
                            static_cast<int64_t>(x.shape(1)), static_cast<float*>(y.data()));
  });
  m.def("softmax_normalize_rows", [](Out y) {
    if (y.ndim() != 2 || y.dtype() != nb::dtype<float>() || !contiguous(y))
      throw std::invalid_argument("softmax_normalize_rows: y float32 [rows, cols] C-contiguous expected");
    nb::gil_scoped_release release;
    qmm::softmax_normalize_rows(static_cast<float*>(y.data()), static_cast<int64_t>(y.shape(0)),
                                static_cast<int64_t>(y.shape(1)));
  });
  m.def("qlinear_softmax_rows", [](const In& x, bool is_signed, const In& table, double yd, int32_t y_zp, Out out) {
    if (x.ndim() != 2 || out.size() != x.size() || table.size() != 256)
      throw std::invalid_argument("qlinear_softmax_rows: x [rows, D], out of its size and a 256-entry table");
    const auto rows = static_cast<int64_t>(x.shape(0)), D = static_cast<int64_t>(x.shape(1));
    nb::gil_scoped_release release;
    qmm::qlinear_softmax_rows(x.data(), is_signed, rows, D, static_cast<const float*>(table.data()), yd, y_zp,
                              out.data());
  });

  // QLinearConv / ConvInteger (onnx/_qconv.py): x channels-last [N, D..., C] contiguous 8-bit codes;
  // the geometry as qmm::ConvShape has it (shape = N, C, group); outputs contiguous, as conv.h says.
  const auto conv_shape = [](const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& geometry) {
    qmm::ConvShape s;
    s.N = shape[0], s.C = shape[1], s.group = shape[2];
    s.in = geometry[0], s.out = geometry[1], s.kernel = geometry[2];
    s.strides = geometry[3], s.dilations = geometry[4], s.pad_begin = geometry[5];
    return s;
  };
  m.def("conv_columns", [conv_shape](const In& x, const std::vector<int64_t>& shape,
                                     const std::vector<std::vector<int64_t>>& geometry, int pad, Out columns) {
    const auto s = conv_shape(shape, geometry);
    const auto row_bytes = static_cast<int64_t>(columns.shape(2));
    nb::gil_scoped_release release;
    qmm::conv_columns(static_cast<const uint8_t*>(x.data()), s, static_cast<uint8_t>(pad), row_bytes,
                      static_cast<uint8_t*>(columns.data()));
  });
  m.def("conv_offsets", [conv_shape](const std::vector<int64_t>& shape,
                                     const std::vector<std::vector<int64_t>>& geometry, Out offsets) {
    const auto s = conv_shape(shape, geometry);
    nb::gil_scoped_release release;
    qmm::conv_offsets(s, static_cast<int32_t*>(offsets.data()));
  });
  m.def("conv_depthwise",
        [conv_shape](const In& x, bool x_signed, const std::vector<int64_t>& shape,
                     const std::vector<std::vector<int64_t>>& geometry, int32_t x_zp, const In& w, Out acc) {
          const auto s = conv_shape(shape, geometry);
          nb::gil_scoped_release release;
          qmm::conv_depthwise(x.data(), x_signed, s, x_zp, static_cast<const int16_t*>(w.data()),
                              static_cast<int32_t*>(acc.data()));
        });
  m.def(
      "conv_depthwise_requantized",
      [conv_shape](const In& x, bool x_signed, const std::vector<int64_t>& shape,
                   const std::vector<std::vector<int64_t>>& geometry, int32_t x_zp, const In& w, std::optional<In> bias,
                   std::optional<In> multiplier, float a_scale, const In& b_scale, float y_scale, int32_t zp, Out y,
                   bool y_signed, int numerics) {
        const auto s = conv_shape(shape, geometry);
        const auto* b = bias ? static_cast<const int32_t*>(bias->data()) : nullptr;
        const auto* m = multiplier ? static_cast<const float*>(multiplier->data()) : nullptr;
        if (!m && numerics != 2) throw std::invalid_argument("conv_depthwise_requantized: the multiplier is required");
        nb::gil_scoped_release release;
        qmm::conv_depthwise_requantized(x.data(), x_signed, s, x_zp, static_cast<const int16_t*>(w.data()), b, m,
                                        a_scale, static_cast<const float*>(b_scale.data()), y_scale, zp, y_signed,
                                        y.data(), numerics);
      },
      nb::arg("x"), nb::arg("x_signed"), nb::arg("shape"), nb::arg("geometry"), nb::arg("x_zp"), nb::arg("w"),
      nb::arg("bias").none(), nb::arg("multiplier").none(), nb::arg("a_scale"), nb::arg("b_scale"), nb::arg("y_scale"),
      nb::arg("zp"), nb::arg("y"), nb::arg("y_signed"), nb::arg("numerics"));
  m.def("conv_depthwise_path", [] { return std::string(qmm::conv_depthwise_path()); });
  m.def("max_pool_bytes", [conv_shape](const In& x, bool x_signed, const std::vector<int64_t>& shape,
                                       const std::vector<std::vector<int64_t>>& geometry, Out y) {
    const auto s = conv_shape(shape, geometry);
    nb::gil_scoped_release release;
    qmm::max_pool_bytes(static_cast<const uint8_t*>(x.data()), x_signed, s, static_cast<uint8_t*>(y.data()));
  });
  // src [batch, rows, cols] -> dst [batch, cols, rows], both contiguous, 1- or 4-byte elements.
  m.def("transpose_planes", [](const In& src, Out dst) {
    const auto batch = static_cast<int64_t>(src.shape(0)), rows = static_cast<int64_t>(src.shape(1));
    const auto cols = static_cast<int64_t>(src.shape(2));
    const auto bytes = static_cast<int64_t>(src.itemsize());
    nb::gil_scoped_release release;
    qmm::transpose_planes(src.data(), bytes, batch, rows, cols, dst.data());
  });
  // acc [rows, cols] int32 contiguous, bias int32 [cols] or None, b_scale float32 [cols] contiguous,
  // y int8 / uint8 [rows, cols] contiguous; numerics 0, 1, 2 as conv.h says.
  m.def(
      "requantize_columns",
      [](const In& acc, std::optional<In> bias, std::optional<In> multiplier, float a_scale, const In& b_scale,
         float y_scale, int32_t zp, Out y, bool y_signed, int numerics) {
        const auto rows = static_cast<int64_t>(acc.shape(0)), cols = static_cast<int64_t>(acc.shape(1));
        const auto* b = bias ? static_cast<const int32_t*>(bias->data()) : nullptr;
        const auto* m = multiplier ? static_cast<const float*>(multiplier->data()) : nullptr;
        if (!m && numerics != 2) throw std::invalid_argument("requantize_columns: the multiplier is required");
        nb::gil_scoped_release release;
        qmm::requantize_columns(static_cast<const int32_t*>(acc.data()), b, rows, cols, m, a_scale,
                                static_cast<const float*>(b_scale.data()), y_scale, zp, y_signed, y.data(), numerics);
      },
      nb::arg("acc"), nb::arg("bias").none(), nb::arg("multiplier").none(), nb::arg("a_scale"), nb::arg("b_scale"),
      nb::arg("y_scale"), nb::arg("zp"), nb::arg("y"), nb::arg("y_signed"), nb::arg("numerics"));
  m.def("dynamic_quantize_linear", [](const In& x, Out y) {
    qmm::DynamicQuantization q;
    {
      nb::gil_scoped_release release;
      q = qmm::dynamic_quantize_linear(static_cast<const float*>(x.data()), static_cast<int64_t>(x.size()),
                                       static_cast<uint8_t*>(y.data()));
    }
    return std::make_pair(q.scale, static_cast<int>(q.zero_point));
  });
  // The same from x (float32, C-contiguous, any shape) alone: (y uint8 of x's shape, scale float32 and zero
  // point uint8 as 0-d arrays), the node's outputs in one call (onnx/_integer.py).
  m.def("dynamic_quantize_linear_arrays", [](const In& x) {
    if (x.dtype() != nb::dtype<float>() || !contiguous(x))
      throw std::invalid_argument("dynamic_quantize_linear_arrays: x float32 C-contiguous expected");
    std::vector<int64_t> dims;
    for (size_t d = 0; d < x.ndim(); ++d) dims.push_back(static_cast<int64_t>(x.shape(d)));
    NewArray<uint8_t> y(dims);
    NewArray<float> scale(std::vector<int64_t>{});
    NewArray<uint8_t> zero_point(std::vector<int64_t>{});
    {
      nb::gil_scoped_release release;
      const qmm::DynamicQuantization q =
          qmm::dynamic_quantize_linear(static_cast<const float*>(x.data()), static_cast<int64_t>(x.size()), y.data());
      *scale.data() = q.scale;
      *zero_point.data() = q.zero_point;
    }
    return nb::make_tuple(y.array(), scale.array(), zero_point.array());
  });
}

// quantize_nbits: the block loops of quantize_nbits.py (which validates everything first).
void bind_quantize_nbits(nb::module_& m) {
  // W [K, N] (any strides; float16 and bfloat16 as their uint16 bits), its type and the options as
  // qmm::QuantizeNBitsProblem has them, the mse grids (float32). Returns (status, B, scales,
  // zero_points): scales (and hqq's float zero points) as raw uint32 (float32) or uint16 bits,
  // zero_points None when symmetric; B and the rest are incomplete unless status is 0.
  m.def("quantize_nbits", [](const In& W, int w_type, int bits, int64_t block_size, bool symmetric, int method,
                             int scale_type, const In& shrink, const In& local, int64_t local_rounds,
                             const In& sym_shrink, int64_t refits) {
    const int64_t K = static_cast<int64_t>(W.shape(0)), N = static_cast<int64_t>(W.shape(1));
    const int64_t k_blocks = (K + block_size - 1) / block_size;
    qmm::QuantizeNBitsProblem p{
        W.data(),
        static_cast<qmm::QuantizeType>(w_type),
        K,
        N,
        W.stride(0),
        W.stride(1),
        bits,
        block_size,
        symmetric,
        static_cast<qmm::QuantizeMethod>(method),
        static_cast<qmm::QuantizeType>(scale_type),
        {static_cast<const float*>(shrink.data()), static_cast<int64_t>(shrink.size()),
         static_cast<const float*>(local.data()), static_cast<int64_t>(local.size()), local_rounds,
         static_cast<const float*>(sym_shrink.data()), static_cast<int64_t>(sym_shrink.size()), refits}};
    const bool wide = p.scale_type == qmm::QuantizeType::kFloat32;
    const bool float_zp = p.method == qmm::QuantizeMethod::kHqq;
    NewArray<uint8_t> B({N, k_blocks, block_size * bits / 8});
    std::optional<NewArray<uint32_t>> scales32, zp32;
    std::optional<NewArray<uint16_t>> scales16, zp16;
    std::optional<NewArray<uint8_t>> zp8;
    qmm::QuantizeNBitsOutput out{B.data(), nullptr, nullptr};
    if (wide) {
      out.scales = scales32.emplace(std::initializer_list<int64_t>{N, k_blocks}).data();
    } else {
      out.scales = scales16.emplace(std::initializer_list<int64_t>{N, k_blocks}).data();
    }
    if (float_zp) {
      out.zero_points = wide ? static_cast<void*>(zp32.emplace(std::initializer_list<int64_t>{N, k_blocks}).data())
                             : static_cast<void*>(zp16.emplace(std::initializer_list<int64_t>{N, k_blocks}).data());
    } else if (!symmetric) {
      out.zero_points = zp8.emplace(std::initializer_list<int64_t>{N, (k_blocks * bits + 7) / 8}).data();
    }
    qmm::QuantizeStatus status;
    {
      nb::gil_scoped_release release;
      status = qmm::quantize_nbits(p, out);
    }
    nb::object scales = wide ? nb::object(nb::cast(scales32->array())) : nb::object(nb::cast(scales16->array()));
    nb::object zero_points = nb::none();
    if (zp32) zero_points = nb::cast(zp32->array());
    if (zp16) zero_points = nb::cast(zp16->array());
    if (zp8) zero_points = nb::cast(zp8->array());
    return nb::make_tuple(static_cast<int>(status), B.array(), scales, zero_points);
  });
  m.def("quantize_nbits_path", [] { return std::string(qmm::quantize_nbits_path()); });
  // For the numpy reference's HQQ: powf(x, y) of a contiguous float32 array, the C library's function
  // that the core calls (numpy's float32 power may be another: SVML on AVX-512 machines).
  m.def("powf", [](const In& x, float y) {
    const int64_t count = static_cast<int64_t>(x.size());
    NewArray<float> out({count});
    const auto* v = static_cast<const float*>(x.data());
    for (int64_t i = 0; i < count; ++i) out.data()[i] = std::pow(v[i], y);
    return out.array();
  });
  // For tests: float32 [n] to float16 (kind 1) or bfloat16 (kind 2) bits, round to nearest even.
  m.def("round_float32_bits", [](const In& x, int kind) {
    const int64_t count = static_cast<int64_t>(x.size());
    NewArray<uint16_t> out({count});
    const auto* v = static_cast<const float*>(x.data());
    for (int64_t i = 0; i < count; ++i)
      out.data()[i] = kind == 1 ? qmm::float_to_half_bits(v[i]) : qmm::float_to_bfloat16_bits(v[i]);
    return out.array();
  });
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "quantmatmul's compiled core (private; use the quantmatmul package)";
  bind_runtime(m);
  bind_qlinear_matmul(m);
  bind_matmul_nbits(m);
  bind_quantize_linear(m);
  bind_onnx_ops(m);
  bind_quantize_nbits(m);
}
