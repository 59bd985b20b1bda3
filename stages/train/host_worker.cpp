#include "stages/train/host_worker.h"

#include <utility>

namespace sf::train {

HostWorker::HostWorker() : thread_([this] { run(); }) {}

HostWorker::~HostWorker() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
}

void HostWorker::submit(std::function<void()> job) {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        jobs_.push_back(std::move(job));
    }
    changed_.notify_all();
}

void HostWorker::wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return jobs_.empty() && !busy_; });
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void HostWorker::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        changed_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every job ran
        std::function<void()> job = std::move(jobs_.front());
        jobs_.pop_front();
        if (failure_) {  // a job failed: the ones after it are dropped until wait()
            changed_.notify_all();
            continue;
        }
        busy_ = true;
        lock.unlock();
        try {
            job();
        } catch (...) {
            lock.lock();
            failure_ = std::current_exception();
            busy_ = false;
            changed_.notify_all();
            continue;
        }
        lock.lock();
        busy_ = false;
        changed_.notify_all();
    }
}

}  // namespace sf::train
