// Parameter counts computed from a config's numbers alone, in checked 64-bit arithmetic: the
// sizes of a crafted config.json can multiply past 2^63, which plain int64_t arithmetic would
// wrap (undefined behaviour) into a wrong or negative count. Count refuses that instead:
//
//     Count n = c.in_channels * Count(d) * p2;   // every operation checked
//     return n.value();
//
// Torch-free and header-only: the config readers, the planner and the fuzzers use it.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace sf::model {

class Count {
public:
    constexpr Count(int64_t value = 0) : value_(value) {}  // NOLINT: counts mix with integers

    int64_t value() const { return value_; }

    friend Count operator+(Count a, Count b) {
        int64_t r = 0;
        if (__builtin_add_overflow(a.value_, b.value_, &r)) overflow();
        return r;
    }
    friend Count operator*(Count a, Count b) {
        int64_t r = 0;
        if (__builtin_mul_overflow(a.value_, b.value_, &r)) overflow();
        return r;
    }
    friend Count operator/(Count a, Count b) {
        if (b.value_ <= 0) {
            throw Error::InvalidArgument("a config's size divides by " + std::to_string(b.value_));
        }
        return a.value_ / b.value_;
    }
    Count& operator+=(Count b) { return *this = *this + b; }
    Count& operator/=(Count b) { return *this = *this / b; }
    friend bool operator==(Count a, Count b) { return a.value_ == b.value_; }

private:
    [[noreturn]] static void overflow() {
        throw Error::InvalidArgument(
            "the config's sizes are too large: its parameter count does not fit in 64 bits");
    }

    int64_t value_;
};

// A config's validate() ends with this: its parameter count, computed as `count()` does, must fit,
// or the config is refused naming `where` ("transformer/config.json: the config's sizes are ...").
template <class CountFn>
void require_countable(const std::string& where, CountFn count) {
    try {
        (void)count();
    } catch (const Error& e) {
        throw Error::InvalidArgument(where + ": " + e.message());
    }
}

}  // namespace sf::model
