#include "stages/train/host_worker.h"

#include <utility>

namespace sf::train {

HostWorker::HostWorker(int64_t max_pending_bytes)
    : max_pending_bytes_(max_pending_bytes), thread_([this] { run(); }) {}

HostWorker::~HostWorker() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
}

void HostWorker::submit(std::function<void()> job, int64_t bytes) {
    {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] {
            return pending_bytes_ == 0 || pending_bytes_ + bytes <= max_pending_bytes_;
        });
        pending_bytes_ += bytes;
        jobs_.push_back({std::move(job), bytes});
    }
    changed_.notify_all();
}

void HostWorker::wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return jobs_.empty() && !busy_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

int64_t HostWorker::pending_bytes() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return pending_bytes_;
}

void HostWorker::finished(int64_t bytes) {
    pending_bytes_ -= bytes;
    busy_ = false;
    changed_.notify_all();
}

void HostWorker::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        changed_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every job ran
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
        if (failure_) {  // a job failed: the ones after it are dropped until wait()
            finished(job.bytes);
            continue;
        }
        lock.unlock();
        std::exception_ptr error;
        try {
            job.run();
        } catch (...) {
            error = std::current_exception();
        }
        job.run = nullptr;  // what it held, released before the bound counts it gone
        lock.lock();
        if (error) failure_ = error;
        finished(job.bytes);
    }
}

}  // namespace sf::train
