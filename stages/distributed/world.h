// The ranks of a data-parallel run, joined through PyTorch's own c10d: a TCPStore for the
// rendezvous (rank 0 hosts it, or torchrun's agent does) and process groups for the collectives:
// Gloo, and with --ddp_backend nccl (the default on CUDA where LibTorch has it) NCCL for CUDA
// tensors, Gloo keeping the CPU ones (as torch.distributed's "cpu:gloo,cuda:nccl").
//
// Every collective waits at most --ddp_timeout. When one fails (a rank died: its sockets closed,
// or it stopped answering) the error names the ranks that are gone: each rank bumps a heartbeat
// counter in the store every half second from a thread of its own, and the ranks whose counter
// stood still are the ones named.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stages/distributed/launch_env.h"

namespace sf::distributed {

struct WorldOptions {
    std::string backend = "auto";  // "gloo", "nccl", or "auto": NCCL on CUDA where built, else Gloo
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // --ddp_timeout
};

// A collective started and not yet waited for: its tensors must stay untouched until wait(),
// which fails as the blocking collectives do (naming the ranks that are gone). Waiting again
// does nothing.
class PendingCollective {
public:
    PendingCollective() = default;
    explicit PendingCollective(std::function<void()> wait) : wait_(std::move(wait)) {}
    void wait() {
        if (!wait_) return;
        const std::function<void()> w = std::move(wait_);
        wait_ = nullptr;
        w();
    }
    bool pending() const { return static_cast<bool>(wait_); }

private:
    std::function<void()> wait_;
};

// kInvalidArgument naming the flag for an unknown backend, one this build lacks, or NCCL
// without CUDA.
std::string resolve_backend(const std::string& backend, bool cuda);
// Whether this build has ProcessGroupNCCL (LibTorch with CUDA).
bool nccl_built();

class World {
public:
    // Connects to the store and the other ranks; kIOError naming the address and the rank when
    // they do not all arrive within the timeout.
    World(const LaunchEnv& env, const WorldOptions& options, bool cuda);
    ~World();
    World(const World&) = delete;
    World& operator=(const World&) = delete;

    int rank() const { return env_.rank; }
    int size() const { return env_.world_size; }
    const LaunchEnv& env() const { return env_; }
    const std::string& backend() const { return backend_; }

    // In place, across every rank; `what` names the operation in a failure.
    void all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what);
    void broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what);
    // The sum lands in `root`'s tensors only (the others' are left undefined in content).
    void reduce_sum_to(std::vector<at::Tensor>& tensors, int root, const std::string& what);
    // The same, started: the process group runs them in the order they were started, which
    // must be the same on every rank.
    PendingCollective start_all_reduce_sum(const std::vector<at::Tensor>& tensors,
                                           const std::string& what);
    PendingCollective start_reduce_sum_to(const std::vector<at::Tensor>& tensors, int root,
                                          const std::string& what);
    // Point to point (CPU tensors with Gloo): `tensor` to rank `dst`, or into it from `src`.
    void send(at::Tensor tensor, int dst, const std::string& what);
    void recv(at::Tensor tensor, int src, const std::string& what);
    void barrier(const std::string& what);

private:
    struct Impl;
    // Runs a collective; a failure of it names `what` and the ranks that are gone (failed).
    void guarded(const std::string& what, const std::function<void()>& op);
    [[noreturn]] void failed(const std::string& what, const std::exception& e);
    LaunchEnv env_;
    std::string backend_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace sf::distributed
