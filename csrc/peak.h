// peak.h: the measured int8 peak of this machine with the active kernels (GOP/s, all threads).
#pragma once

namespace qmm {

// Runs the active micro-kernel on cache-resident data on every thread for about `seconds`, in five
// samples, and returns the best.
double measure_peak_gops(double seconds);

}  // namespace qmm
