// dispatch.cpp: collects the kernel entries this build has, self-tests the native ones, and selects one per family.
#include "dispatch.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

namespace qmm {

// Each kernel build's entries (CMake writes one QMM_KERNELS(name) line per build).
#define QMM_KERNELS(name) KernelEntries qmm_kernels_##name();
#include "kernel_registry.inc"
#undef QMM_KERNELS

namespace {

struct Registry {
  std::vector<const QGemmDispatch*> qgemm{&kPortableQGemm};
  std::vector<const NBitsDispatch*> nbits{&kPortableNBits};
  std::vector<const Float8Dispatch*> float8{&kPortableFloat8};
  std::vector<std::pair<const void*, std::string>> failed;  // entries that failed their self-test
  std::string report;

  Registry() {
    const KernelEntries builds[] = {
#define QMM_KERNELS(name) qmm_kernels_##name(),
#include "kernel_registry.inc"
#undef QMM_KERNELS
        {nullptr, nullptr, nullptr}};
    for (const KernelEntries& e : builds) {
      if (e.qgemm) qgemm.push_back(e.qgemm);
      if (e.nbits) nbits.push_back(e.nbits);
      if (e.float8) float8.push_back(e.float8);
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

// Features hidden from selection (hide_features: tests only).
std::atomic<Features> hidden{0};

bool runs_here(const EntryInfo& info) {
  const Features off = hidden.load(std::memory_order_relaxed);
  return (info.needs & ~(usable_features() & ~off)) == 0 && (info.models & off) == 0;
}

// --- Self-test: a few small products of every signedness through the entry and the portable one.

int32_t lcg(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return static_cast<int32_t>(state >> 24);  // 0..255
}

// count bytes from the generator, in order.
std::vector<uint8_t> random_bytes(int64_t count, uint32_t& state) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  for (auto& x : bytes) x = static_cast<uint8_t>(lcg(state));
  return bytes;
}

// C = A x B (raw sums of the stored values, the offsets' zero-point terms applied) through `q`.
void reference_product(const QGemmDispatch& q, const uint8_t* a, bool a_signed, const uint8_t* b, bool b_signed,
                       int64_t M, int64_t K, int64_t N, int64_t* c) {
  const QGemmLayout& L = *q.layout;
  std::vector<int32_t> pa(static_cast<size_t>(L.packed_a_int32s(M, K)) + 1);
  std::vector<int8_t> pb(static_cast<size_t>(L.packed_b_bytes(K, N)) + 1);
  std::vector<int32_t> colsum(static_cast<size_t>(N) + 1);
  q.pack_a(a, a_signed, M, K, K, pa.data());
  q.pack_b_panels(b, b_signed, K, N, 0, L.n_panels(N), pb.data(), colsum.data());
  const int64_t ldc = L.n_panels(N) * L.nr;
  std::vector<int32_t> c32(static_cast<size_t>(L.mr * ldc));
  const int64_t oa = L.a_offset[a_signed], ob = L.b_offset[b_signed], groups = L.k_groups(K);
  if (q.begin_task) q.begin_task();
  for (int64_t m0 = 0; m0 < M; m0 += L.mr) {
    const int64_t rows = std::min(L.mr, M - m0);
    for (int64_t j = 0; j < L.n_panels(N); ++j)
      q.kernel(pa.data() + m0 * L.a_row_int32s(K), L.a_row_int32s(K), rows, pb.data() + j * L.panel_bytes(K), 0, groups,
               b_signed, false, c32.data() + j * L.nr, ldc);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t rowsum = 0;
      for (int64_t k = 0; k < K; ++k) rowsum += a_signed ? int8_t(a[(m0 + r) * K + k]) : int64_t(a[(m0 + r) * K + k]);
      for (int64_t n = 0; n < N; ++n)  // raw = sum (a + oa)(b + ob)
        c[(m0 + r) * N + n] = c32[r * ldc + n] - ob * rowsum - oa * int64_t(colsum[n]) - K * oa * ob;
    }
  }
}

// QUANTMATMUL_TRACE_SELF_TEST set: each self-test step on stderr before it runs, so that a native
// kernel that crashes the process (rather than differing) is named by the last line.
void trace(const std::string& step) {
  static const bool on = std::getenv("QUANTMATMUL_TRACE_SELF_TEST") != nullptr;
  if (on) std::fprintf(stderr, "quantmatmul: %s\n", step.c_str());
}

std::string shape_text(int64_t M, int64_t K, int64_t N) {
  return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N);
}

// Empty when the entry's small products (QGemmSmallProduct: a and b read in place, the final sums with
// a zero point per row of a and per column of b) agree with the portable one's, else what differed:
// row groups and strips around the kernels' (8 and 4 rows, 16 and 8 columns), K below 16 and up to
// the limit, every signedness, zero points anywhere in the types' ranges.
std::string small_product_self_test(const QGemmDispatch& q, uint32_t& state) {
  if (!q.small_product || q.small_product == kPortableQGemm.small_product) return {};
  static const int64_t shapes[][3] = {{1, 1, 1}, {9, 6, 10}, {17, 33, 16}, {2, 128, 64}, {12, 31, 40}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2];
    trace("  small product " + shape_text(M, K, N));
    const std::vector<uint8_t> a = random_bytes(M * K, state), b = random_bytes(K * N, state);
    std::vector<int32_t> za(static_cast<size_t>(M)), zb(static_cast<size_t>(N));
    std::vector<int32_t> ours(static_cast<size_t>(M * N)), expected(ours.size());
    for (int combo = 0; combo < 4; ++combo) {
      const bool as = combo & 1, bs = combo & 2;
      for (auto& z : za) z = lcg(state) - (as ? 128 : 0);
      for (auto& z : zb) z = lcg(state) - (bs ? 128 : 0);
      q.small_product(a.data(), as, K, za.data(), b.data(), bs, N, zb.data(), M, K, N, ours.data(), N);
      kPortableQGemm.small_product(a.data(), as, K, za.data(), b.data(), bs, N, zb.data(), M, K, N, expected.data(), N);
      if (ours != expected)
        return std::string("its small products differ from the portable kernel's at ") + shape_text(M, K, N) +
               (as ? " s8" : " u8") + (bs ? "·s8" : "·u8");
    }
  }
  return {};
}

// Empty when `q` agrees with the portable kernel, else what differed.
std::string self_test(const QGemmDispatch& q) {
  // Row counts around every layout's row groups (the tiles: 32 rows straight from the tiles, 17 through
  // a buffer, 1 and 9 with vpdpbusd).
  static const int64_t shapes[][3] = {{1, 5, 3}, {9, 67, 35}, {17, 260, 33}, {33, 130, 40}};
  uint32_t state = 12345;
  for (const auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2];
    trace("  " + shape_text(M, K, N));
    const std::vector<uint8_t> a = random_bytes(M * K, state), b = random_bytes(K * N, state);
    std::vector<int64_t> ours(static_cast<size_t>(M * N)), expected(ours.size());
    for (int combo = 0; combo < 4; ++combo) {
      const bool as = combo & 1, bs = combo & 2;
      reference_product(q, a.data(), as, b.data(), bs, M, K, N, ours.data());
      reference_product(kPortableQGemm, a.data(), as, b.data(), bs, M, K, N, expected.data());
      if (ours != expected)
        return std::string("differs from the portable kernel at ") + std::to_string(M) + "x" + std::to_string(K) + "x" +
               std::to_string(N) + (as ? " s8" : " u8") + (bs ? "·s8" : "·u8");
    }
  }
  return small_product_self_test(q, state);
}

// --- The float8 self-test: the pair table against a scalar model of its order on float8-like
// values (every product exact, sums rounded: the order shows), and the float32 table against the
// portable one on float32 values (inexact products: an unfused or reordered sum shows).

// y[m, n] = the pair table's documented sum over k (docs/quantization.md), every product exact:
// "odd first" / "even first": per pair of k (2j, 2j + 1), the two products added to the float32
// sum one at a time, in that order; "tiles of 32 k": per 32 k from k = 0, the even-k products
// summed from +0 in order of k, the odd-k ones likewise, and their sum added to the output's.
bool pair_model(const char* order, const float* a, const float* b, int64_t M, int64_t K, int64_t N, float* y) {
  const bool odd_first = std::strcmp(order, "odd first") == 0, tiles = std::strcmp(order, "tiles of 32 k") == 0;
  if (!odd_first && !tiles && std::strcmp(order, "even first") != 0) return false;
  auto product = [&](int64_t m, int64_t k, int64_t n) { return k < K ? a[m * K + k] * b[k * N + n] : 0.0f; };
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      if (tiles) {
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
          float even = 0.0f, odd = 0.0f;
          for (int64_t k = k0; k < k0 + 32 && k < K; k += 2) {
            even += product(m, k, n);
            odd += product(m, k + 1, n);
          }
          acc += even + odd;
        }
      } else {
        for (int64_t k = 0; k < K; k += 2) {
          const float e = product(m, k, n), o = product(m, k + 1, n);
          acc = odd_first ? (acc + o) + e : (acc + e) + o;
        }
      }
      y[m * N + n] = acc;
    }
  return true;
}

// Empty when `f` agrees with its models, else what differed.
std::string self_test(const Float8Dispatch& f) {
  // Row counts around the tiles' row groups (6, 12, 16, 32) and their tails, columns around the
  // 16-column panels and the 32-column panel pairs, K odd and even around the AVX-512 k chunks
  // (128 steps) and the AMX tiles' 16 pairs.
  static const int64_t shapes[][3] = {{1, 1, 1}, {7, 67, 35}, {13, 300, 17}, {25, 2, 50}, {33, 64, 33}};
  uint32_t state = 4321;
  const int64_t G = f.a_group, PG = pair_group(f);
  for (const auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2], KP = (K + 1) / 2, panels = (N + 15) / 16;
    trace("  " + shape_text(M, K, N));
    std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
    std::vector<float> y(static_cast<size_t>(M * N)), expected(y.size());
    if (f.pair_rows) {
      // e4m3-like values: sign, 8 .. 15 eighths, times 2^-6 .. 2^8
      auto value = [&] {
        const float m = static_cast<float>(8 + lcg(state) % 8) / 8.0f;
        return std::ldexp(lcg(state) & 1 ? -m : m, lcg(state) % 15 - 6);
      };
      for (auto& x : a) x = value();
      for (auto& x : b) x = value();
      std::vector<uint32_t> pa(static_cast<size_t>(M * KP)), pb(static_cast<size_t>(panels * KP * 16));
      bool exact = true;
      for (int64_t p = 0; p < panels; ++p) exact &= pack_pair_panel(b.data(), K, N, p * 16, pb.data() + p * KP * 16);
      for (int64_t g = 0; g < M; g += PG)
        exact &= pack_pair_group(a.data() + g * K, std::min(PG, M - g), K, pa.data() + g * KP);
      if (!exact) return "the pair packers reject pair-exact values";
      if (!pair_model(f.pair_order ? f.pair_order : "", a.data(), b.data(), M, K, N, expected.data()))
        return std::string("unknown pair order \"") + (f.pair_order ? f.pair_order : "") + "\"";
      f.pair_rows(pa.data(), pb.data(), y.data(), N, M, N, K);
      if (std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)) != 0)
        return "pair table differs from its order (" + std::string(f.pair_order) + ") at " + shape_text(M, K, N);
    }
    // float32 values with 24-bit significands: inexact products
    for (auto& x : a) x = static_cast<float>(lcg(state) * 256 + lcg(state) - 32768) / 8191.0f;
    for (auto& x : b) x = static_cast<float>(lcg(state) * 256 + lcg(state) - 32768) / 4093.0f;
    std::vector<float> pb(static_cast<size_t>(panels * K * 16), 0.0f), pa(a.size());
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) pb[(n / 16 * K + k) * 16 + n % 16] = b[k * N + n];
    for (int64_t g = 0; g < M; g += G) {
      const int64_t rows = std::min(G, M - g);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < rows; ++r) pa[g * K + k * rows + r] = a[(g + r) * K + k];
    }
    f.sgemm_rows(pa.data(), pb.data(), y.data(), N, M, N, K);
    kPortableFloat8.sgemm_rows(a.data(), pb.data(), expected.data(), N, M, N, K);
    if (std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)) != 0)
      return "float32 table differs from the portable one at " + shape_text(M, K, N);
  }
  return {};
}

// --- The MatMulNBits self-test: levels 0 and 4 through the entry's drivers on values where every
// float32 operation is exact (integer A with one |a| = 127 per block, so level 4's qa = a and its
// scale is 1; codes, zero points and bias integers; scales powers of two; every partial sum below
// 2^24), so that any summation order gives the one exact result.
std::string self_test(const NBitsDispatch& e) {
  // Rows around the decode/prefill crossover (12) and the AMX row groups (16, 32); columns around
  // 16- and 32-column tasks; K with a partial last block; widths 2, 3, 4, 8 (8-bit also below 8
  // rows: the packed kernels' c - 128 codes).
  static const int64_t shapes[][4] = {{1, 64, 20, 4},  {5, 80, 33, 2},  {3, 96, 24, 8},
                                      {13, 64, 40, 8}, {17, 96, 33, 4}, {33, 64, 17, 3}};
  uint32_t state = 777;
  for (const auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2], bits = s[3], bs = 32, kb = (K + bs - 1) / bs;
    const int64_t row_bytes = kb * bs * bits / 8;
    std::vector<uint8_t> codes(static_cast<size_t>(N * row_bytes), 0), zp(static_cast<size_t>(N * kb));
    std::vector<float> scales(zp.size()), a(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
    std::vector<int64_t> q(static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {  // LSB-first bitstream per column
        const int64_t code = lcg(state) & ((1 << bits) - 1);
        q[n * K + k] = code;
        encode_nbits_code(codes.data() + n * row_bytes, bits, k, static_cast<unsigned>(code));
      }
    for (size_t i = 0; i < zp.size(); ++i) {
      zp[i] = static_cast<uint8_t>(lcg(state) & ((1 << bits) - 1));
      scales[i] = std::ldexp(1.0f, -(lcg(state) % 3));  // 1, 1/2, 1/4
    }
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        a[m * K + k] = k % bs == 0 ? (lcg(state) & 1 ? 127.0f : -127.0f) : lcg(state) % 255 - 127;
    for (auto& x : bias) x = static_cast<float>(lcg(state) - 128);
    std::vector<float> expected(static_cast<size_t>(M * N)), y(expected.size());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = bias[n];
        for (int64_t k = 0; k < K; ++k)
          sum += a[m * K + k] * static_cast<double>(q[n * K + k] - zp[n * kb + k / bs]) * scales[n * kb + k / bs];
        expected[m * N + n] = static_cast<float>(sum);  // exact
      }
    const NBitsWeight w{codes.data(), N, K, bits, bs, kb, row_bytes, scales.data(), nullptr, zp.data()};
    // Each level also on the weight packed in the entry's layout for it, where it has one.
    for (int level : {0, 4})
      for (bool pack : {false, true}) {
        const PackedNBits packed = pack ? pack_nbits_weight(nbits_layout(e, level), w) : PackedNBits{};
        if (pack && !packed.layout) continue;
        const NBitsPacked view = packed.view();
        NBitsWeight weight = w;
        if (pack) weight.packed = &view;
        std::fill(y.begin(), y.end(), 0.0f);
        trace("  level " + std::to_string(level) + (pack ? " packed " : " ") + shape_text(M, K, N) + " " +
              std::to_string(bits) + "-bit");
        if (level == 0) matmul_nbits_f32(e, a.data(), M, weight, bias.data(), y.data());
        else matmul_nbits_int8(e, a.data(), M, weight, bias.data(), y.data());
        if (std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)) != 0)
          return "level " + std::to_string(level) + (pack ? " (packed weight)" : "") +
                 " differs from the exact result at " + shape_text(M, K, N) + " " + std::to_string(bits) + "-bit";
      }
  }
  return {};
}

// Whether `entry` passed its family's self-test (run once per entry, on first selection; native
// entries of every family).
template <class Entry>
bool passes_self_test(const Entry* entry, const char* family, const Entry* portable) {
  static std::mutex mutex;
  static std::vector<std::pair<const void*, bool>> done;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [e, ok] : done)
    if (e == entry) return ok;
  const bool run = !entry->info.emulated && entry != portable;
  if (run) trace(std::string("self-test ") + family + ":" + entry->info.name);
  const std::string why = run ? self_test(*entry) : std::string();
  if (!why.empty()) {
    Registry& r = registry();
    r.failed.emplace_back(entry, why);
    r.report += std::string(r.report.empty() ? "" : "; ") + family + ":" + entry->info.name + " " + why;
  }
  done.emplace_back(entry, why.empty());
  return why.empty();
}

// Whether x outranks y, two entries of one level that both run here (dispatch.h): emulated first
// (asked for by name), then the larger feature set, then the name.
bool outranks(const EntryInfo& x, const EntryInfo& y) {
  if (x.emulated != y.emulated) return x.emulated;
  const int fx = std::popcount(x.emulated ? x.models : x.needs), fy = std::popcount(y.emulated ? y.models : y.needs);
  if (fx != fy) return fx > fy;
  return std::strcmp(x.name, y.name) < 0;
}

// The family's entry for (isa, emulated): see dispatch.h.
template <class Entry>
const Entry* pick(const std::vector<const Entry*>& entries, Isa isa, bool emulated,
                  bool (*wanted)(const Entry&) = nullptr) {
  const Entry* best = nullptr;
  for (const Entry* e : entries) {
    const EntryInfo& info = e->info;
    if (!runs_here(info) || info.isa > isa || (wanted && !wanted(*e))) continue;
    if (info.emulated && !(emulated && info.isa == isa)) continue;
    const bool better =
        !best || info.isa > best->info.isa || (info.isa == best->info.isa && outranks(info, best->info));
    if (!better) continue;
    if constexpr (std::is_same_v<Entry, QGemmDispatch>)
      if (!passes_self_test(e, "qgemm", &kPortableQGemm)) continue;
    if constexpr (std::is_same_v<Entry, Float8Dispatch>)
      if (!passes_self_test(e, "float8", &kPortableFloat8)) continue;
    if constexpr (std::is_same_v<Entry, NBitsDispatch>)
      if (!passes_self_test(e, "nbits", &kPortableNBits)) continue;
    best = e;
  }
  return best;
}

struct Selection {
  Isa isa;
  bool emulated;
  const QGemmDispatch* qgemm;
  const NBitsDispatch* nbits;
  const Float8Dispatch* float8;
  const QGemmDispatch* qgemm_taps;  // qgemm_taps_kernels()
};

bool reads_taps(const QGemmDispatch& e) { return e.kernel_taps != nullptr; }

Selection select(Isa isa, bool emulated) {
  const Registry& r = registry();
  const QGemmDispatch* qgemm = pick(r.qgemm, isa, emulated);
  const QGemmDispatch* taps = qgemm->kernel_taps ? qgemm : pick(r.qgemm, isa, emulated, reads_taps);
  return {isa, emulated, qgemm, pick(r.nbits, isa, emulated), pick(r.float8, isa, emulated), taps ? taps : qgemm};
}

// One selection per (level, emulated, hidden features), made on first use and kept for the
// process: a call still running on the previous one keeps valid entries, and switching back and
// forth allocates nothing.
const Selection* interned(Isa isa, bool emulated) {
  static std::mutex mutex;
  struct Made {
    Isa isa;
    bool emulated;
    Features hidden;
    const Selection* selection;
  };
  static std::vector<Made> made;
  std::lock_guard<std::mutex> lock(mutex);
  const Features off = hidden.load();
  for (const Made& m : made)
    if (m.isa == isa && m.emulated == emulated && m.hidden == off) return m.selection;
  made.push_back({isa, emulated, off, new Selection(select(isa, emulated))});
  return made.back().selection;
}

// The selection in use: null until set_isa or the first use, which takes the best level (so that a
// level asked for first, as QUANTMATMUL_ISA is, never runs the self-tests of the levels above it).
std::atomic<const Selection*>& current() {
  static std::atomic<const Selection*> selection{nullptr};
  return selection;
}

const Selection* selected() {
  const Selection* s = current().load(std::memory_order_acquire);
  if (s) return s;
  const Selection* best = interned(best_isa(), false);
  return current().compare_exchange_strong(s, best, std::memory_order_acq_rel) ? best : s;
}

template <class Entry>
bool has_level(const std::vector<const Entry*>& entries, Isa isa, bool emulated) {
  for (const Entry* e : entries)
    if (e->info.isa == isa && e->info.emulated == emulated && runs_here(e->info)) return true;
  return false;
}

}  // namespace

const QGemmDispatch& qgemm_kernels() { return *selected()->qgemm; }
const QGemmDispatch& qgemm_taps_kernels() { return *selected()->qgemm_taps; }
const NBitsDispatch& nbits_kernels() { return *selected()->nbits; }
const Float8Dispatch& float8_kernels() { return *selected()->float8; }
Isa active_isa() { return selected()->isa; }
bool active_emulated() { return selected()->emulated; }

bool isa_available(Isa isa, bool emulated) {
  if (isa == Isa::kPortable) return !emulated;
  const Registry& r = registry();
  if (!has_level(r.qgemm, isa, emulated) && !has_level(r.nbits, isa, emulated) && !has_level(r.float8, isa, emulated))
    return false;
  // A level whose only entries failed their self-test is not available.
  const Selection s = select(isa, emulated);
  return s.qgemm->info.isa == isa || s.nbits->info.isa == isa || s.float8->info.isa == isa;
}

Isa best_isa() {
  Isa best = Isa::kPortable;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmx})
    if (isa_available(isa, false)) best = isa;
  return best;
}

bool set_isa(Isa isa, bool emulated) {
  if (!isa_available(isa, emulated)) return false;
  current().store(interned(isa, emulated), std::memory_order_release);
  return true;
}

void hide_features(Features features) {
  const Selection* now = selected();
  hidden.store(features);
  // The current level again under the new mask; the best available one if it has gone.
  const Isa isa = isa_available(now->isa, now->emulated) ? now->isa : best_isa();
  current().store(interned(isa, isa == now->isa && now->emulated), std::memory_order_release);
}

Features hidden_features() { return hidden.load(); }

bool avx2_loops_usable() {
#if QMM_QUANTIZE_AVX2
  const Features usable = usable_features() & ~hidden_features();
  return active_isa() >= Isa::kAvx2 && (usable & kAvx2Features) == kAvx2Features;
#else
  return false;  // the avx2 build is not there
#endif
}

std::vector<std::string> kernel_entries() {
  const Registry& r = registry();
  std::vector<std::string> out;
  auto add = [&](const char* family, const EntryInfo& info, const void* entry) {
    std::string line = std::string(family) + ":" + info.name;
    if (info.emulated) line += " (emulated)";
    if (!runs_here(info)) line += " (not supported here)";
    for (const auto& [e, why] : r.failed)
      if (e == entry) line += " (failed its self-test: " + why + ")";
    out.push_back(line);
  };
  for (const auto* e : r.qgemm) add("qgemm", e->info, e);
  for (const auto* e : r.nbits) add("nbits", e->info, e);
  for (const auto* e : r.float8) add("float8", e->info, e);
  return out;
}

std::string self_test_report() { return registry().report; }

std::vector<std::pair<std::string, std::string>> run_self_tests() {
  const Registry& r = registry();
  std::vector<std::pair<std::string, std::string>> out;
  auto run = [&](const char* family, const auto& entries) {
    for (const auto* e : entries)
      if (runs_here(e->info))
        out.emplace_back(std::string(family) + ":" + e->info.name + (e->info.emulated ? "-emulated" : ""),
                         self_test(*e));
  };
  run("qgemm", r.qgemm);
  run("nbits", r.nbits);
  run("float8", r.float8);
  return out;
}

}  // namespace qmm
