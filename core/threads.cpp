#include "core/threads.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <thread>

namespace sf {

int set_torch_threads(int n) {
    if (n <= 0) {
        const char* env = std::getenv("SANAFLOW_THREADS");
        n = env != nullptr ? std::atoi(env) : 0;
    }
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
    at::set_num_threads(n);
    return n;
}

}  // namespace sf
