// One thread that runs jobs in the order they are submitted: where --offload_optimizer runs a
// parameter's host update while the fused backward pass goes on computing the gradients of the
// blocks before it (optim.h, AdamW::step_one_overlapped).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace sf::train {

class HostWorker {
public:
    HostWorker();
    ~HostWorker();  // waits for the jobs submitted (an exception of theirs is dropped)
    HostWorker(const HostWorker&) = delete;
    HostWorker& operator=(const HostWorker&) = delete;

    void submit(std::function<void()> job);
    // Returns once every job submitted so far has run; rethrows the first exception one threw
    // (the jobs after it are not run).
    void wait();

private:
    void run();
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::function<void()>> jobs_;
    bool busy_ = false, stopping_ = false;
    std::exception_ptr failure_;
    std::thread thread_;  // last: started once the rest exists
};

}  // namespace sf::train
