// quantize_linear_avx2.cpp: quantize_linear's element loops (../quantize_linear_loops.inc) in the avx2 kernel build, picked at run time by quantize_linear.cpp.
#define QMM_QUANTIZE_NS QMM_KERNEL_NS
#include "quantize_linear_loops.inc"
