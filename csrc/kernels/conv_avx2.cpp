// conv_avx2.cpp: the depthwise convolution's loop (../conv_loops.inc) in the avx2 kernel build, picked at run time by conv.cpp.
#define QMM_CONV_NS QMM_KERNEL_NS
#include "conv_loops.inc"
