#include "graph/device_lease.h"

#include <array>
#include <memory>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"

namespace sf::graph {
namespace {

constexpr int kMaxDevices = 64;
// How often a cancel-aware wait looks at its token. Cancellation is rare and the wait is for a
// whole model phase, so a coarse poll costs nothing and needs no link from token to lease.
constexpr auto kCancelPoll = std::chrono::milliseconds(20);
// Phases that take the lease per batch wait briefly and often; only a wait this long is news.
constexpr auto kAnnounceAfter = std::chrono::seconds(1);

}  // namespace

DeviceLease::Hold& DeviceLease::Hold::operator=(Hold&& other) noexcept {
    if (this != &other) {
        release();
        lease_ = other.lease_;
        other.lease_ = nullptr;
    }
    return *this;
}

void DeviceLease::Hold::release() {
    if (lease_ != nullptr) {
        lease_->release();
        lease_ = nullptr;
    }
}

DeviceLease::~DeviceLease() {
    std::lock_guard<std::mutex> lock(mutex_);
    SF_CHECK(!held_, "DeviceLease destroyed while held");
}

DeviceLease::Hold DeviceLease::acquire(const std::string& who, const CancelToken* cancel) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (held_) {
        SF_CHECK(holder_thread_ != std::this_thread::get_id(),
                 "DeviceLease::acquire on a thread that already holds the lease");
        log_debug("device {}: {} waits for {}", device_, who, holder_);
        const auto start = std::chrono::steady_clock::now();
        bool announced = false;
        while (held_) {
            if (cancel != nullptr && cancel->cancelled()) {
                throw Cancelled("device " + std::to_string(device_) + " lease wait by " + who);
            }
            released_.wait_for(lock, cancel != nullptr ? kCancelPoll : kAnnounceAfter);
            if (!announced && held_ && std::chrono::steady_clock::now() - start >= kAnnounceAfter) {
                log_info("device {}: {} waits for {}", device_, who, holder_);
                announced = true;
            }
        }
        const double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (announced) {
            log_info("device {}: {} holds the device after waiting {:.1f}s", device_, who, waited);
        }
    } else {
        log_debug("device {}: {} holds the device", device_, who);
    }
    held_ = true;
    holder_ = who;
    holder_thread_ = std::this_thread::get_id();
    return Hold(this);
}

DeviceLease::Hold DeviceLease::try_acquire(const std::string& who) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (held_) return Hold();
    held_ = true;
    holder_ = who;
    holder_thread_ = std::this_thread::get_id();
    log_debug("device {}: {} holds the device", device_, who);
    return Hold(this);
}

std::string DeviceLease::holder() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return holder_;
}

void DeviceLease::release() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        SF_CHECK(held_, "DeviceLease released while free");
        log_debug("device {}: {} releases the device", device_, holder_);
        held_ = false;
        holder_.clear();
        holder_thread_ = std::thread::id();
    }
    // Wake every waiter: a cancel-aware waiter that was woken may leave without taking the lease,
    // and with notify_one the others would then sleep on.
    released_.notify_all();
}

DeviceLease& device_lease(int device) {
    if (device < 0 || device >= kMaxDevices) {
        throw Error::InvalidArgument("device index " + std::to_string(device) +
                                     " out of range [0, " + std::to_string(kMaxDevices) + ")");
    }
    static std::mutex mutex;
    // Never destroyed: a phase still holding the lease when the process exits must not trip the
    // destructor's check during static destruction.
    static auto* leases = new std::array<std::unique_ptr<DeviceLease>, kMaxDevices>();
    std::lock_guard<std::mutex> lock(mutex);
    auto& lease = (*leases)[device];
    if (!lease) lease = std::make_unique<DeviceLease>(device);
    return *lease;
}

}  // namespace sf::graph
