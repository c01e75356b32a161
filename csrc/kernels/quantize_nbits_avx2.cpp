// quantize_nbits_avx2.cpp: quantize_nbits' block loops (../quantize_nbits_blocks.inc) in the avx2 kernel build, picked at run time by quantize_nbits.cpp.
#define QMM_QUANTIZE_NS QMM_KERNEL_NS
#include "quantize_nbits_blocks.inc"
