// One thread that runs jobs in the order they are submitted: where --offload_optimizer runs a
// parameter's host update while the fused backward pass goes on computing the gradients of the
// blocks before it (optim.h, AdamW::step_one_overlapped).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace sf::train {

class HostWorker {
public:
    // Jobs hold data until they run (the offloaded update: host copies of a parameter and its
    // gradient); submit() waits while those of the jobs queued or running would pass
    // `max_pending_bytes`, so a worker slower than its producer holds that much, not everything.
    explicit HostWorker(int64_t max_pending_bytes);
    ~HostWorker();  // waits for the jobs submitted (an exception of theirs is dropped)
    HostWorker(const HostWorker&) = delete;
    HostWorker& operator=(const HostWorker&) = delete;

    // `bytes`: what the job holds. A job larger than the bound waits for an empty queue.
    void submit(std::function<void()> job, int64_t bytes);
    // Returns once every job submitted so far has run; rethrows the first exception one threw
    // (the jobs after it are not run).
    void wait();
    int64_t pending_bytes();

private:
    struct Job {
        std::function<void()> run;
        int64_t bytes;
    };
    void run();
    void finished(int64_t bytes);  // with the lock held
    const int64_t max_pending_bytes_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Job> jobs_;
    int64_t pending_bytes_ = 0;  // of the jobs queued and the one running
    bool busy_ = false, stopping_ = false;
    std::exception_ptr failure_;
    std::thread thread_;  // last: started once the rest exists
};

}  // namespace sf::train
