// float_chain_avx512.cpp: the session's float chains' binary steps (csrc/float_chain_loops.inc) compiled for AVX-512; float_ops.cpp takes them with the avx512 erf path.
#include <cstdint>

#include "onnx_ops.h"

namespace qmm {
namespace QMM_KERNEL_NS {
#include "float_chain_loops.inc"
}  // namespace QMM_KERNEL_NS
}  // namespace qmm
