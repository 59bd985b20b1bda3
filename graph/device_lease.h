// The device lease: one token per device, so that only one model phase (text encoder, VAE, DiT)
// has its weights and activations on the device at a time. A phase takes the lease for its whole
// run, loads its model inside that scope and frees it before the Hold goes out of scope; CPU work
// that needs no model runs beside it without the lease.
//
// Take it around a phase (outside LinearPipeline::run()) or inside one stage body (per batch). A
// waiter inside a stage body occupies a worker thread while it waits; pass the run's cancel token
// (current_item()->cancel) so that a cancelled run does not wait for another phase to finish.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "graph/cancel.h"

namespace sf::graph {

class DeviceLease {
public:
    // RAII proof of holding the lease; releases it when destroyed. Movable, not copyable. The
    // lease is not reentrant: a thread that already holds it and asks again is a bug (it would
    // wait forever), and SF_CHECK stops it with a message instead.
    class Hold {
    public:
        Hold() = default;
        Hold(Hold&& other) noexcept : lease_(other.lease_) { other.lease_ = nullptr; }
        Hold& operator=(Hold&& other) noexcept;
        Hold(const Hold&) = delete;
        Hold& operator=(const Hold&) = delete;
        ~Hold() { release(); }

        void release();
        bool held() const { return lease_ != nullptr; }
        explicit operator bool() const { return held(); }

    private:
        friend class DeviceLease;
        explicit Hold(DeviceLease* lease) : lease_(lease) {}
        DeviceLease* lease_ = nullptr;
    };

    explicit DeviceLease(int device = 0) : device_(device) {}
    DeviceLease(const DeviceLease&) = delete;
    DeviceLease& operator=(const DeviceLease&) = delete;
    // Destroying a lease that is still held is a bug: its Hold would dangle.
    ~DeviceLease();

    // Blocks until the device is free. `who` names the phase ("encode_vae") in the log lines
    // that say who waits for whom. With a cancel token, the wait gives up with Cancelled once the
    // token is set, so a cancelled graph does not wait for another phase to finish.
    Hold acquire(const std::string& who, const CancelToken* cancel = nullptr);
    // Takes the lease only if it is free now; an empty Hold otherwise.
    Hold try_acquire(const std::string& who);

    // Name of the current holder, empty when free.
    std::string holder() const;
    int device() const { return device_; }

private:
    void release();

    const int device_;
    mutable std::mutex mutex_;
    std::condition_variable released_;
    bool held_ = false;
    std::string holder_;
    std::thread::id holder_thread_;
};

// The process-wide lease for a device index (0 .. 63), created on first use.
DeviceLease& device_lease(int device = 0);

}  // namespace sf::graph
