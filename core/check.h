// Programmer invariants. Not for bad input (throw sf::Error for that): a failed SF_CHECK is a bug
// in sanaflow, so it prints file:line and aborts. Named SF_CHECK because <torch/torch.h> defines
// CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>

#define SF_CHECK(cond, msg)                                                                     \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            std::fprintf(stderr, "%s:%d: SF_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                         msg);                                                                  \
            std::abort();                                                                       \
        }                                                                                       \
    } while (0)
