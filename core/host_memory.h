// Host memory: where block swap keeps the weights of its blocks and the offloaded optimizer its
// moments. On a CUDA run a copy to it is pinned CPU memory (fast, asynchronous copies to the card);
// on a CPU run it is CPU memory outside the counting allocator (memory.h), so that the counted
// bytes stand for the device's (what the byte budget, the memory marks and `sanaflow plan` count)
// and the host's are counted apart (host_stats()). Either way a CPU run of block swap or offload
// shows on its counters what a CUDA run shows on the card.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/memory.h"

namespace sf::mem {

// A copy of `t` in host memory: pinned when `pinned` (the device is CUDA), else uncounted.
at::Tensor to_host(const at::Tensor& t, bool pinned);
// Zeros shaped, typed and strided like `t`, in uncounted host memory.
at::Tensor host_zeros_like(const at::Tensor& t);
// Whether `t`'s storage came from to_host(t, false) or host_zeros_like().
bool in_host_memory(const at::Tensor& t);
// Bytes of live host memory of those two (pinned copies are not counted here).
Stats host_stats();
void reset_host_peak();  // the peak from now on starts at the current bytes

}  // namespace sf::mem
