// qgemm_avx2_absent.cpp: stands in for the AVX2 kernels on targets that cannot build them.
#include "qgemm.h"

namespace qmm {

const QGemmKernels kAvx2Kernels = kPortableKernels;
bool avx2_kernels_built() { return false; }

}  // namespace qmm
