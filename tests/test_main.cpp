// Shared main for every test binary: the counting allocator is installed before any test runs,
// so memory assertions see every tensor, and LibTorch uses both cores.
#include <gtest/gtest.h>

#include "core/memory.h"
#include "core/threads.h"

int main(int argc, char** argv) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads();
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
