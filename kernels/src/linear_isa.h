// Internal (tests): the 16-bit linear_small_m with the loops of a chosen
// instruction set, so that every build is tested on a CPU that runs them all.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

// isa: 4 (AVX-512 build), 3 (AVX2), 0 (the portable loops, as target_clones
// builds them), -1 (the best this CPU runs: what linear_small_m uses).  On
// other architectures every value means the portable loops.  The caller makes
// sure the CPU runs `isa`.  float32 ignores isa.
void linear_small_m_isa(int isa, DType dt, int64_t m, int64_t n, int64_t k, const void* a,
                        int64_t lda, const void* w, int64_t ldw, const void* bias, void* out,
                        int64_t ldo);

}  // namespace axon::kernels
