// cpu_features.h: run-time CPU feature detection and the instruction-set path quantmatmul runs on.
#pragma once

#include <string>

namespace qmm {

// Kernel paths, lowest to highest. A path needs every feature of the paths below it that it uses.
enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  bool avx_vnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false, os_amx = false;  // the OS saves the registers (XCR0, arch_prctl)
  std::string vendor, brand;
};

// Detected once (CPUID, XGETBV; on Linux, asks for AMX tile permission with arch_prctl).
const CpuFeatures& cpu_features();

// The highest path this machine supports (and this build compiled).
Isa best_isa();
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);
// Parses "portable", "avx2", "avx512_vnni", "amx"; returns false for an unknown name.
bool parse_isa(const std::string& name, Isa* out);

}  // namespace qmm
