// cpu_features.h: run-time CPU feature detection and the instruction-set path quantmatmul runs on.
#pragma once

#include <cstdint>
#include <string>

namespace qmm {

// Instruction-set levels, lowest to highest: the names QUANTMATMUL_ISA and set_isa take, and the
// rank by which each kernel family picks among its entries. What an entry can run on is its
// feature set (below), not its level: a CPU may have AVX-VNNI without AVX-512, or AVX-512 VNNI
// without AMX.
enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3 };

// CPU features as a set of bits; a kernel entry names the set it needs. A bit is set only when the
// CPU has the feature and the OS saves its registers.
enum Feature : uint32_t {
  kFeatAvx2 = 1u << 0,
  kFeatFma = 1u << 1,
  kFeatF16c = 1u << 2,
  kFeatBmi2 = 1u << 3,
  kFeatAvx512f = 1u << 4,
  kFeatAvx512bw = 1u << 5,
  kFeatAvx512vl = 1u << 6,
  kFeatAvx512dq = 1u << 7,
  kFeatAvx512vnni = 1u << 8,
  kFeatAvx512bf16 = 1u << 9,
  kFeatAvxVnni = 1u << 10,
  kFeatAmxTile = 1u << 11,
  kFeatAmxInt8 = 1u << 12,
  kFeatAmxBf16 = 1u << 13,
  kFeatAvx512vbmi = 1u << 14,
};
using Features = uint32_t;
// What the AVX2 kernel files are compiled for (-mavx2 -mfma -mf16c -mbmi2), and so what the
// emulated tables (AVX-512 / AMX source over SIMDe or the AMX emulation, built with those flags) need.
constexpr Features kAvx2Features = kFeatAvx2 | kFeatFma | kFeatF16c | kFeatBmi2;
constexpr Features kAvx512Features = kAvx2Features | kFeatAvx512f | kFeatAvx512bw | kFeatAvx512vl | kFeatAvx512dq;

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  bool avx512vbmi = false;
  bool avx_vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false, os_amx = false;  // the OS saves the registers (XCR0, arch_prctl)
  // BMI2's pdep/pext are single fast instructions: Intel (Haswell and later) and AMD from family 19h
  // (Zen 3); AMD families 17h/18h (Zen 1, Zen+, Zen 2, Hygon) run them in microcode, at tens to
  // hundreds of cycles each.
  bool pdep_fast = false;
  int family = 0;  // CPUID family (base + extended)
  std::string vendor, brand;
};

// Detected once (CPUID, XGETBV; on Linux, asks for AMX tile permission with arch_prctl).
const CpuFeatures& cpu_features();

// The features usable here, as a set (CPU and OS support both).
Features usable_features();

// Whether the AVX2 code decoders deposit bit fields with pdep (else with shifts and masks, the same
// bytes): cpu_features().pdep_fast unless a test set it (set_pdep_preferred).
bool pdep_preferred();
void set_pdep_preferred(bool use_pdep);
const char* isa_name(Isa isa);
// Parses "portable", "avx2", "avx512_vnni", "amx"; returns false for an unknown name.
bool parse_isa(const std::string& name, Isa* out);

}  // namespace qmm
