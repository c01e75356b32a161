// cpu_features.cpp: CPUID/XGETBV feature detection and Linux AMX permission (x86-64; other targets get the portable path).
#include "cpu_features.h"

#include <atomic>

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define QMM_X86 1
#endif
#if defined(__linux__) && defined(QMM_X86)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qmm {
namespace {

#ifdef QMM_X86
void cpuid(unsigned leaf, unsigned subleaf, unsigned r[4]) { __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]); }

unsigned long long xgetbv0() {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

// Linux keeps AMX tile data (XFEATURE 18) off until a process asks for it.
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef QMM_X86
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  f.vendor = vendor;

  cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      cpuid(0x80000002u + i, 0, r);
      std::memcpy(brand + 16 * i, r, 16);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(f.brand.begin());
  }

  cpuid(1, 0, r);
  const unsigned base_family = (r[0] >> 8) & 0xF;
  f.family = static_cast<int>(base_family == 0xF ? base_family + ((r[0] >> 20) & 0xFF) : base_family);
  const bool osxsave = (r[2] >> 27) & 1;
  f.fma = (r[2] >> 12) & 1;
  f.f16c = (r[2] >> 29) & 1;
  if (osxsave) {
    const unsigned long long xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;  // SSE and AVX state
    f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  }
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    f.avx2 = (r[1] >> 5) & 1;
    f.bmi2 = (r[1] >> 8) & 1;
    f.avx512f = (r[1] >> 16) & 1;
    f.avx512dq = (r[1] >> 17) & 1;
    f.avx512bw = (r[1] >> 30) & 1;
    f.avx512vl = (r[1] >> 31) & 1;
    f.avx512vbmi = (r[2] >> 1) & 1;
    f.avx512vnni = (r[2] >> 11) & 1;
    f.amx_bf16 = (r[3] >> 22) & 1;
    f.amx_tile = (r[3] >> 24) & 1;
    f.amx_int8 = (r[3] >> 25) & 1;
    cpuid(7, 1, r);
    f.avx_vnni = (r[0] >> 4) & 1;
    f.avx512bf16 = (r[0] >> 5) & 1;
  }
  if (f.os_amx && f.amx_tile) f.os_amx = request_amx_permission();
  const bool amd_like = f.vendor == "AuthenticAMD" || f.vendor == "HygonGenuine";
  f.pdep_fast = f.bmi2 && !(amd_like && f.family < 0x19);
#endif
  return f;
}

std::atomic<bool>& pdep_preference() {
  static std::atomic<bool> preferred{cpu_features().pdep_fast};
  return preferred;
}

}  // namespace

bool pdep_preferred() { return pdep_preference().load(std::memory_order_relaxed); }
void set_pdep_preferred(bool use_pdep) { pdep_preference().store(use_pdep); }

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Features usable_features() {
  const CpuFeatures& f = cpu_features();
  Features set = 0;
  auto add = [&](bool present, Feature bit) { set |= present ? bit : 0u; };
  if (f.os_avx) {
    add(f.avx2, kFeatAvx2);
    add(f.fma, kFeatFma);
    add(f.f16c, kFeatF16c);
    add(f.avx_vnni, kFeatAvxVnni);
  }
  add(f.bmi2, kFeatBmi2);
  if (f.os_avx512) {
    add(f.avx512f, kFeatAvx512f);
    add(f.avx512bw, kFeatAvx512bw);
    add(f.avx512vl, kFeatAvx512vl);
    add(f.avx512dq, kFeatAvx512dq);
    add(f.avx512vnni, kFeatAvx512vnni);
    add(f.avx512bf16, kFeatAvx512bf16);
    add(f.avx512vbmi, kFeatAvx512vbmi);
  }
  if (f.os_amx) {
    add(f.amx_tile, kFeatAmxTile);
    add(f.amx_int8, kFeatAmxInt8);
    add(f.amx_bf16, kFeatAmxBf16);
  }
  return set;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

bool parse_isa(const std::string& name, Isa* out) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512Vnni, Isa::kAmx}) {
    if (name == isa_name(isa)) {
      *out = isa;
      return true;
    }
  }
  return false;
}

}  // namespace qmm
