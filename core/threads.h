// LibTorch's intra-op thread count. Debian's LibTorch starts with one thread; sanaflow programs
// set it to the core count (or SANAFLOW_THREADS, or OMP_NUM_THREADS) once at start.
#pragma once

namespace sf {

// n <= 0: SANAFLOW_THREADS if set, else OMP_NUM_THREADS, else the number of cores. Returns the
// count set.
int set_torch_threads(int n = 0);

// The count set_torch_threads() chose (0 before it ran). OpenMP keeps the count per thread: a
// worker thread that runs a model calls use_torch_threads() first, or it computes on one thread.
int torch_threads();
void use_torch_threads();

}  // namespace sf
