// Cooperative cancellation. A fatal error in one stage (or a signal handler, later) sets the
// token; stage code that runs long (a video decode, a batch of VAE tiles) polls it between steps so
// that shutdown does not wait for work whose result will be thrown away. Torch- and TBB-free.
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>

namespace sf::graph {

// Thrown by code that notices cancellation. Once a run is cancelled, exceptions from its stages are
// expected and ignored; the run reports the error that caused the cancellation, not this one.
class Cancelled : public std::runtime_error {
public:
    explicit Cancelled(const std::string& what) : std::runtime_error(what) {}
};

class CancelToken {
public:
    CancelToken() = default;
    CancelToken(const CancelToken&) = delete;
    CancelToken& operator=(const CancelToken&) = delete;

    // Safe from any thread and from a signal handler (a lock-free atomic store).
    void cancel() noexcept { flag_.store(true, std::memory_order_release); }
    bool cancelled() const noexcept { return flag_.load(std::memory_order_acquire); }
    void throw_if_cancelled(const char* where = "operation") const {
        if (cancelled()) throw Cancelled(std::string(where) + " cancelled");
    }
    void reset() noexcept { flag_.store(false, std::memory_order_release); }

private:
    std::atomic<bool> flag_{false};
};

}  // namespace sf::graph
