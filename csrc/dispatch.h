// dispatch.h: the kernel families, their entries (one per ISA, native or emulated), and which entry each family runs.
//
// Three families, each picking its entry independently:
//   QGemmDispatch   the 8-bit integer GEMM of QLinearMatMul: packed layout, packers, micro-kernel, epilogue;
//   NBitsDispatch   MatMulNBits' products (levels 0-3 float, level 4 int8 block dots);
//   Float8Dispatch  the float32 GEMM of QLinearMatMul's float8 path.
// A kernel build NAME (CMake's qmm_add_kernels, csrc/kernels/) defines `KernelEntries
// qmm_kernels_NAME()`, listed in the generated kernel_registry.inc; dispatch.cpp collects them. An ISA
// that is not built has no entry: nothing stands in for it.
//
// Selection: set_isa(level, emulated) gives each family its highest entry at or below `level`
// that this CPU can run (every needed feature present), native entries only, except that with
// `emulated` the family's emulated entries of exactly that level come first. Between two entries
// of one level (and both native, or both emulated) the one whose feature set (`needs`, for an
// emulated entry `models`) has more features wins, then the name first in strcmp order: the
// choice never depends on the order of the builds (the float8 family's avx512bf16 entry outranks
// its avx512f one at level avx512_vnni where the CPU has AVX512-BF16). A native int8 GEMM or float8
// entry passes a known-answer test against the portable one before its first use; one that fails
// is never picked (cpu_info says why). For tests, hide_features makes selection treat features as
// absent: native entries needing them and emulated entries modelling them do not run.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "float8.h"
#include "matmul_nbits.h"
#include "qgemm.h"

namespace qmm {

struct EntryInfo {
  const char* name;  // for reports: "avx2", "avx512_vnni", ...
  Isa isa;           // its level
  Features needs;    // the CPU features its code uses
  bool emulated;     // AVX-512 / AMX source built over SIMDe or the AMX emulation: for tests
  // The features the native build of an emulated entry needs (what it models): ranks it among the
  // family's emulated entries of its level and lets hide_features drop it. 0: it models nothing
  // more than any other (the only emulated entry of its family and level).
  Features models;
};

struct QGemmDispatch {
  EntryInfo info;
  const QGemmLayout* layout;
  PackA pack_a;
  PackBPanels pack_b_panels;
  QGemmKernel kernel;
  RequantizeRows requantize_onnxruntime;
  // Called on a thread before it runs a series of kernel calls (a task) with nothing else in
  // between (null: nothing to do). AMX loads its tile configuration here, once per task, not
  // per call: other code on the thread (ONNX Runtime's AMX kernels) may have changed it since.
  void (*begin_task)();
  // The kernel over a table of receptive fields (csrc/qgemm.h), where the entry has one (null: the
  // driver's caller forms the im2col instead).
  QGemmTapsKernel kernel_taps = nullptr;
  // Small products read in place (csrc/qgemm.h), where the entry has them (null: always packed).
  QGemmSmallProduct small_product = nullptr;
  // The kernel with the ONNX Runtime epilogue in registers, for blocks whose K fits one kernel call
  // (csrc/qgemm.h), where the entry has it (null: the sums go through requantize_onnxruntime).
  QGemmRequantizedKernel kernel_requantized = nullptr;
  QGemmTapsRequantizedKernel kernel_taps_requantized = nullptr;  // (kernel_taps' form of it)
};

struct NBitsDispatch {
  EntryInfo info;
  NBitsRows rows;                 // levels 0-3
  int64_t rows_prefill_columns;   // levels 0-3 with more than 12 rows of A: columns per task (zero: 16)
  NBitsRowsInt8 rows_int8;        // level 4
  NBitsPrepareInt8 prepare_int8;  // may be null
  NBitsPrepareF32 prepare_f32;    // may be null
  NBitsRoundOperands round_operands;  // levels 2/3's rounding of A; may be null (round_operand per value)
  NBitsQuantizeA quantize_a;          // level 4's quantization of A; may be null (quantize_a_int8_rows)
  NBitsInt8Tiling int8_tiling;    // level 4's tasks (zero: 16 columns over all rows)
  // The layouts its level-4 kernels and its levels 0/1 kernels read a packed weight in
  // (NBitsWeight::packed), or null (none: they read the codes as they are). Their panels divide
  // every task's columns.
  const NBitsLayout* int8_layout;
  const NBitsLayout* f32_layout;
};

// The layout an entry's kernels at accuracy level `level` read a constant weight in, or null
// (levels 2/3: none; their rounding reads the codes).
inline const NBitsLayout* nbits_layout(const NBitsDispatch& e, int level) {
  return level == 4 ? e.int8_layout : level <= 1 ? e.f32_layout : nullptr;
}

struct Float8Dispatch {
  EntryInfo info;
  int64_t a_group;  // rows of a interleaved by k for sgemm_rows and pair_rows (csrc/qgemm.h); 1: a as given
  SgemmRows sgemm_rows;
  // Optional (null: none): the product over bfloat16 pairs (PairRows, csrc/qgemm.h), which the
  // driver runs instead of sgemm_rows when every value of a and b is pair-exact and 0 < K < 2^29
  // (docs/quantization.md); pair_order names its order of additions ("odd first": vdpbf16ps's,
  // "tiles of 32 k": tdpbf16ps's).
  PairRows pair_rows;
  const char* pair_order;
  int64_t pair_group;  // a_group for pair_rows' a where it differs (0: a_group; 1: rows of words as given)
  // Optional (null: float8.cpp's SSE2 step): the float8 output step on a row (float8.h).
  Float8EncodeRow encode_row;
};

// The rows per group of a pair table's packed a.
inline int64_t pair_group(const Float8Dispatch& f) { return f.pair_group ? f.pair_group : f.a_group; }

// What a kernel file's register function returns: its entries, null for a family it has none for.
// A plain aggregate: kernel files compiled with wide instructions instantiate no shared code.
struct KernelEntries {
  const QGemmDispatch* qgemm;
  const NBitsDispatch* nbits;
  const Float8Dispatch* float8;
};

// The entries in use. Read once per call: a call keeps the entry it started with.
const QGemmDispatch& qgemm_kernels();
// The int8 entry for a convolution's weight (one group, channels in whole quads): qgemm_kernels()
// where it has a kernel over receptive fields (kernel_taps: x read in place, no im2col), else the
// highest entry below it that has one, else qgemm_kernels(). The amx table has none: its
// convolutions run on the avx512_vnni entry, whose products read x as it lies where the tiles take
// an im2col and a packing of it per call (Xeon, 16 threads: ResNet-18 4.7 -> 3.0 ms with its 3x3
// convolutions moved; MobileNetV2, mostly 1x1, 5.1 ms on the amx table, 4.2 with the whole model on
// avx512_vnni).
const QGemmDispatch& qgemm_taps_kernels();
const NBitsDispatch& nbits_kernels();
const Float8Dispatch& float8_kernels();

// The level set_isa last selected ("portable" ... "amx"), and whether emulated entries were asked for.
Isa active_isa();
bool active_emulated();
// The highest level with a native entry this CPU runs, in any family.
Isa best_isa();
// Whether some family has an entry of exactly this level that this CPU runs (native or emulated).
bool isa_available(Isa isa, bool emulated);
// Selects the entries (above); false, changing nothing, where isa_available(isa, emulated) is false.
bool set_isa(Isa isa, bool emulated);
// For tests: the features selection treats as absent (0: none), and whether it does. Changing them
// selects the entries of the current level again.
void hide_features(Features hidden);
Features hidden_features();
// Whether loops built for AVX2 outside the kernel families (quantize_nbits', quantize_linear's) may
// run now: they are built (QMM_QUANTIZE_AVX2), the selected level is avx2 or higher and the CPU has
// the avx2 build's features, none hidden.
bool avx2_loops_usable();
// Every registered entry, as "family:name" with " (emulated)", " (not supported here)" or
// " (failed its self-test: ...)" where that applies.
std::vector<std::string> kernel_entries();
// The self-test failures so far (empty when none).
std::string self_test_report();
// Tests only: every entry that runs here, emulated ones included, through its family's self-test
// now (what a native entry gets before its first use), as "family:name" and what differed ("" if
// nothing): the emulated builds check the self-tests' models against the kernels on any machine.
std::vector<std::pair<std::string, std::string>> run_self_tests();

// The portable entries (kernels/qgemm_portable.cpp): always present.
extern const QGemmDispatch kPortableQGemm;
extern const NBitsDispatch kPortableNBits;
extern const Float8Dispatch kPortableFloat8;

}  // namespace qmm
