// dispatch.cpp: picks the kernel table once: the best path this CPU supports and this build compiled, or a lower one on request.
#include <atomic>

#include "qgemm.h"

namespace qmm {
namespace {

const QGemmKernels* table_for(Isa isa) {
  switch (isa) {
    case Isa::kAmx:  // the AVX-512 VNNI and AMX kernels are not written yet: AVX2 serves them
    case Isa::kAvx512Vnni:
    case Isa::kAvx2:
      return avx2_kernels_built() ? &kAvx2Kernels : &kPortableKernels;
    case Isa::kPortable:
      return &kPortableKernels;
  }
  return &kPortableKernels;
}

std::atomic<const QGemmKernels*>& current() {
  static std::atomic<const QGemmKernels*> table{table_for(best_isa())};
  return table;
}

}  // namespace

Isa best_isa() {
  // The highest path whose kernels exist in this build and whose features this CPU has.
  if (avx2_kernels_built() && isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kPortable;
}

const QGemmKernels& active_kernels() { return *current().load(std::memory_order_acquire); }

Isa active_isa() { return active_kernels().isa; }

bool set_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_isa())) return false;
  current().store(table_for(isa), std::memory_order_release);
  return true;
}

}  // namespace qmm
