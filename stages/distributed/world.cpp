#include "stages/distributed/world.h"

#include <fmt/format.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if SANAFLOW_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <nccl.h>
#include <torch/csrc/cuda/nccl.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "core/error.h"
#include "core/log.h"
#include "core/torch_compat.h"

namespace sf::distributed {
namespace {

constexpr auto kHeartbeat = std::chrono::milliseconds(500);

#if SANAFLOW_WITH_NCCL
constexpr bool kHasNccl = true;
#else
constexpr bool kHasNccl = false;
#endif

std::string heartbeat_key(int rank) { return fmt::format("sanaflow/heartbeat/{}", rank); }

// The port of the store: torchrun's agent store, or this run's own on rank 0 (a 1.13 build cannot
// speak to a 2.x agent store, so it hosts its own one port above; compat::kC10dStoreSpeaksTorch2).
int store_port(const LaunchEnv& env) {
    return env.agent_store && !compat::kC10dStoreSpeaksTorch2 ? env.master_port + 1
                                                              : env.master_port;
}

bool hosts_store(const LaunchEnv& env) {
    return env.rank == 0 && (!env.agent_store || !compat::kC10dStoreSpeaksTorch2);
}

c10::intrusive_ptr<c10d::TCPStore> connect_store(const LaunchEnv& env, bool server, bool counted,
                                                 std::chrono::milliseconds timeout) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(store_port(env));
    o.isServer = server;
    if (counted) o.numWorkers = static_cast<std::size_t>(env.world_size);
    o.waitWorkers = counted;  // a client counts itself in, the server waits for all
    o.timeout = timeout;
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
}

// Gloo's device: the loopback on one machine; with several, the interface GLOO_SOCKET_IFNAME
// names, else the one this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const LaunchEnv& env) {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname)
        return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    if (env.local_world_size == env.world_size)
        return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

bool nccl_built() { return kHasNccl; }

std::string resolve_backend(const std::string& backend, bool cuda) {
    if (backend == "gloo") return backend;
    if (backend == "auto") {
        if (cuda && kHasNccl) return "nccl";
        if (cuda) log_info("ddp: NCCL is not in this build: Gloo carries the CUDA gradients");
        return "gloo";
    }
    if (backend == "nccl") {
        if (!kHasNccl) {
            throw Error::InvalidArgument(
                "--ddp_backend nccl: this build has no NCCL process group (its LibTorch has no "
                "CUDA); use gloo");
        }
        if (!cuda) {
            throw Error::InvalidArgument(
                "--ddp_backend nccl carries CUDA tensors only: use it with --device cuda, or gloo "
                "on the CPU");
        }
        return backend;
    }
    throw Error::InvalidArgument(
        fmt::format("--ddp_backend {}: unknown (known: auto, gloo, nccl)", backend));
}

#if SANAFLOW_WITH_NCCL
namespace {
// ProcessGroupNCCL's inline parts were compiled against this nccl.h: it must be the version
// LibTorch itself was built with, or the two disagree on the layout of its Options.
void check_nccl_header() {
    const std::uint64_t torch_nccl = torch::cuda::nccl::version();
    const std::uint64_t major = torch_nccl >> 32, minor = (torch_nccl >> 16) & 0xffff,
                        patch = torch_nccl & 0xffff;
    if (major != NCCL_MAJOR || minor != NCCL_MINOR || patch != NCCL_PATCH) {
        throw Error::InvalidArgument(fmt::format(
            "--ddp_backend nccl: sanaflow was compiled against nccl.h {}.{}.{} but LibTorch "
            "against NCCL {}.{}.{}; rebuild with the nvidia-nccl headers of LibTorch's own NCCL "
            "(tools/build.sh --torch2 finds them beside the torch package), or use gloo",
            NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, major, minor, patch));
    }
}
}  // namespace
#endif

// The store, the process groups and the heartbeat thread with its own store connection. Gloo is
// always there (CPU tensors: the loss, the optimizer state gathered for a checkpoint, barriers);
// with --ddp_backend nccl, NCCL carries the CUDA tensors. Each group has its own prefix in the
// store, as torch.distributed gives each group.
struct World::Impl {
    c10::intrusive_ptr<c10d::TCPStore> store;
    c10::intrusive_ptr<compat::C10dBackend> group;  // Gloo
    c10::intrusive_ptr<compat::C10dBackend> nccl;   // or null
    c10::intrusive_ptr<c10d::TCPStore> heartbeat_store;
    std::thread heartbeat;
    std::mutex mutex;
    std::condition_variable stop_cv;
    bool stop = false;

    void start_heartbeat(int rank) {
        heartbeat = std::thread([this, rank] {
            std::unique_lock<std::mutex> lock(mutex);
            while (!stop) {
                try {
                    heartbeat_store->add(heartbeat_key(rank), 1);
                } catch (const std::exception&) {
                    return;  // the store is gone; the next collective reports it
                }
                stop_cv.wait_for(lock, kHeartbeat, [this] { return stop; });
            }
        });
    }
    // NCCL for CUDA tensors where it runs, Gloo for the rest.
    compat::C10dBackend& group_for(const std::vector<at::Tensor>& tensors) {
        return nccl && !tensors.empty() && tensors[0].is_cuda() ? *nccl : *group;
    }
    void stop_heartbeat() {
        {
            std::lock_guard<std::mutex> lock(mutex);
            stop = true;
        }
        stop_cv.notify_all();
        if (heartbeat.joinable()) heartbeat.join();
    }
};

World::World(const LaunchEnv& env, const WorldOptions& options, bool cuda)
    : env_(env), backend_(resolve_backend(options.backend, cuda)), impl_(std::make_unique<Impl>()) {
    const std::string where = fmt::format("{}:{}", env.master_addr, store_port(env));
    try {
        impl_->store = connect_store(env, hosts_store(env), /*counted=*/true, options.timeout);
        impl_->heartbeat_store = connect_store(env, false, false, options.timeout);
        auto o = c10d::ProcessGroupGloo::Options::create();
        o->devices.push_back(gloo_device(env));
        o->timeout = options.timeout;
        impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>("gloo", impl_->store), env.rank, env.world_size,
            o);
    } catch (const std::exception& e) {
        throw Error::IOError(fmt::format(
            "ddp: {} could not join the other ranks through the store at {} within --ddp_timeout "
            "({} s): {}",
            env.describe(), where,
            std::chrono::duration_cast<std::chrono::seconds>(options.timeout).count(), e.what()));
    }
#if SANAFLOW_WITH_NCCL
    if (backend_ == "nccl") {
        check_nccl_header();
        try {
            // The group first (its Options are built by this build's inline code, the group by
            // LibTorch's: without a GPU it refuses, which shows they agree), then the device its
            // communicators bind to.
            auto n = c10d::ProcessGroupNCCL::Options::create();
            n->timeout = options.timeout;
            impl_->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
                c10::make_intrusive<c10d::PrefixStore>("nccl", impl_->store), env.rank,
                env.world_size, n);
            c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
        } catch (const std::exception& e) {
            throw Error::IOError(fmt::format("ddp: {}: the NCCL process group on cuda:{}: {}",
                                             env.describe(), env.local_rank, e.what()));
        }
    }
#endif
    impl_->start_heartbeat(env.rank);
    log_info("ddp: {} joined ({}, store {})", env.describe(), backend_, where);
}

World::~World() { impl_->stop_heartbeat(); }

void World::all_reduce_sum(std::vector<at::Tensor>& tensors, const std::string& what) {
    start_all_reduce_sum(tensors, what).wait();
}

void World::broadcast(std::vector<at::Tensor>& tensors, int root, const std::string& what) {
    guarded(what, [&] {
        c10d::BroadcastOptions o;
        o.rootRank = root;
        impl_->group_for(tensors).broadcast(tensors, o)->wait();
    });
}

void World::reduce_sum_to(std::vector<at::Tensor>& tensors, int root, const std::string& what) {
    start_reduce_sum_to(tensors, root, what).wait();
}

// The work holds its tensors; the wait runs guarded as a blocking collective does.
PendingCollective World::start_all_reduce_sum(const std::vector<at::Tensor>& tensors,
                                              const std::string& what) {
    std::vector<at::Tensor> in = tensors;
    auto work = decltype(impl_->group->allreduce(in)){};
    guarded(what, [&] { work = impl_->group_for(in).allreduce(in); });
    return PendingCollective([this, work, what] { guarded(what, [&] { work->wait(); }); });
}

PendingCollective World::start_reduce_sum_to(const std::vector<at::Tensor>& tensors, int root,
                                             const std::string& what) {
    std::vector<at::Tensor> in = tensors;
    c10d::ReduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.rootRank = root;
    auto work = decltype(impl_->group->reduce(in, o)){};
    guarded(what, [&] { work = impl_->group_for(in).reduce(in, o); });
    return PendingCollective([this, work, what] { guarded(what, [&] { work->wait(); }); });
}

void World::send(at::Tensor tensor, int dst, const std::string& what) {
    guarded(what, [&] {
        std::vector<at::Tensor> t = {std::move(tensor)};
        impl_->group_for(t).send(t, dst, /*tag=*/0)->wait();
    });
}

void World::recv(at::Tensor tensor, int src, const std::string& what) {
    guarded(what, [&] {
        std::vector<at::Tensor> t = {std::move(tensor)};
        impl_->group_for(t).recv(t, src, /*tag=*/0)->wait();
    });
}

void World::barrier(const std::string& what) {
    guarded(what, [&] { impl_->group->barrier()->wait(); });
}

void World::guarded(const std::string& what, const std::function<void()>& op) {
    try {
        op();
    } catch (const std::exception& e) {
        failed(what, e);
    }
}

void World::failed(const std::string& what, const std::exception& e) {
    impl_->stop_heartbeat();
    // Which ranks are gone: those whose heartbeat stands still over a few beats.
    std::string gone;
    try {
        std::map<int, int64_t> before;
        for (int r = 0; r < size(); ++r)
            before[r] = r == rank() ? 0 : impl_->heartbeat_store->add(heartbeat_key(r), 0);
        std::this_thread::sleep_for(kHeartbeat * 4);
        std::vector<int> still;
        for (int r = 0; r < size(); ++r) {
            if (r != rank() && impl_->heartbeat_store->add(heartbeat_key(r), 0) == before[r])
                still.push_back(r);
        }
        gone = still.empty() ? "every other rank still answers the store"
                             : fmt::format("rank {} stopped answering (died or hangs)",
                                           fmt::join(still, ", rank "));
    } catch (const std::exception&) {
        gone = env_.agent_store && compat::kC10dStoreSpeaksTorch2
                   ? "the launcher's store is gone too"
                   : "rank 0, which hosts the store, is gone";
    }
    throw Error::IOError(
        fmt::format("ddp: {}: {} failed: {}; {}", env_.describe(), what, gone, e.what()));
}

}  // namespace sf::distributed
