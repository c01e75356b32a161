// qlinear_binary_avx2.cpp: QLinearAdd's and QLinearMul's element loops (../qlinear_binary_loops.inc) in the avx2 kernel build, picked at run time by onnx_ops.cpp.
#define QMM_BINARY_NS QMM_KERNEL_NS
#include "qlinear_binary_loops.inc"
