#include "core/threads.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace sf {
namespace {
std::atomic<int> g_threads{0};
}  // namespace

int torch_threads() { return g_threads.load(); }

void use_torch_threads() {
    const int n = g_threads.load();
    if (n > 0 && at::get_num_threads() != n) at::set_num_threads(n);
}

int set_torch_threads(int n) {
    // OpenMP's own variable is honoured too: at::set_num_threads would otherwise override it.
    for (const char* name : {"SANAFLOW_THREADS", "OMP_NUM_THREADS"}) {
        if (n > 0) break;
        const char* env = std::getenv(name);
        n = env != nullptr ? std::atoi(env) : 0;
    }
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
    at::set_num_threads(n);
    g_threads = n;
    return n;
}

}  // namespace sf
