// quantize_nbits_avx2.cpp: quantize_nbits' block loops (../quantize_nbits_blocks.inc) built with -mavx2, picked at run time by quantize_nbits.cpp.
#define QMM_QUANTIZE_NS avx2
#include "quantize_nbits_blocks.inc"
