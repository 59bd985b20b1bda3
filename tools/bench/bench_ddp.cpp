// What data parallelism costs: the training step of the memory ablation's transformer (4 blocks
// of width 512, tools/bench/bench_configs.h) with 2 ranks of 1 thread each against 1 rank of 1
// thread, at the same per-rank batch, on the CPU through Gloo on 127.0.0.1. Each run is one
// warm-up step and --steps more (the median is the step time).
//
//   bench_ddp [--world 2] [--batch 4] [--grid 32] [--caption_len 300] [--steps 3]
//
// The ranks are this program again, started with torchrun's variables. The last line is
// ratio=<world-rank step time / 1-rank step time> (the communication and synchronisation the
// gradient all-reduce adds; target 1.15 or lower), after the same world with the optimizer state
// sharded (ZeRO-1, stages/distributed/zero_sharding.h): its step time and the optimizer-state
// bytes each rank holds, measured (AdamW::state() after the steps), against the unsharded.
#include <fmt/format.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/memory.h"
#include "core/threads.h"
#include "model/sana/sana_transformer.h"
#include "stages/distributed/data_parallel_sync.h"
#include "stages/distributed/launch_env.h"
#include "stages/distributed/zero_sharding.h"
#include "stages/plan/step_probe.h"
#include "tools/bench/bench_configs.h"

namespace {

struct Args {
    int world = 2;
    int64_t batch = 4, grid = 32, caption_len = 300, steps = 3;
    std::string out;     // a rank's result file (the ranks only)
    bool shard = false;  // the ranks only: ZeRO-1
};

// One rank (or the single process): the step; its time, loss and optimizer-state bytes into
// `a.out`.<rank>.
int run_rank(const Args& a) {
    sf::mem::install_counting_allocator();
    sf::set_torch_threads(1);
    sf::set_log_level(sf::LogLevel::kWarn);
    const sf::distributed::LaunchEnv env = sf::distributed::launch_env();
    sf::plan::ProbeInput in;
    if (env.distributed()) {
        auto world = std::make_shared<sf::distributed::World>(env, sf::distributed::WorldOptions{},
                                                              /*cuda=*/false);
        if (a.shard)
            in.sync = std::make_shared<sf::distributed::ShardedStateSync>(world);
        else
            in.sync = std::make_shared<sf::distributed::DataParallelSync>(world);
    }
    torch::manual_seed(0);
    const auto config = sf::bench::ablation_config();
    const auto model = sf::model::SanaTransformer(config).ptr();
    in.latents = torch::randn({a.batch * env.world_size, config.in_channels, a.grid, a.grid});
    in.caption_tokens = a.caption_len;
    in.caption_channels = config.caption_channels;
    in.steps = a.steps;
    sf::train::TrainStepOptions o;
    o.mark_steps = 0;
    o.max_grad_norm = 1.0;
    const sf::plan::ProbeResult r = sf::plan::probe_step(model, in, o, torch::kCPU);
    std::ofstream(fmt::format("{}.{}", a.out, env.rank))
        << fmt::format("{} {} {}\n", r.step_seconds, r.loss, r.optimizer_state_bytes);
    return 0;
}

struct Run {
    double seconds = 0, loss = 0;
    int64_t state_bytes = 0;  // the most any rank holds
};

// `world` ranks of this program (1: one process without the variables).
Run run_world(const Args& a, int world, bool shard) {
    const std::string out = fmt::format("/tmp/bench_ddp.{}.{}.{}", ::getpid(), world, shard);
    const int port = 29000 + static_cast<int>(::getpid() % 2000) + world + (shard ? 8 : 0);
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            if (world > 1) {
                ::setenv("RANK", std::to_string(r).c_str(), 1);
                ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
                ::setenv("MASTER_ADDR", "127.0.0.1", 1);
                ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            }
            const std::vector<std::string> args = {"bench_ddp",
                                                   "--rank_out",
                                                   out,
                                                   "--batch",
                                                   std::to_string(a.batch),
                                                   "--grid",
                                                   std::to_string(a.grid),
                                                   "--caption_len",
                                                   std::to_string(a.caption_len),
                                                   "--steps",
                                                   std::to_string(a.steps),
                                                   "--shard",
                                                   shard ? "1" : "0"};
            std::vector<char*> argv;
            for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
            argv.push_back(nullptr);
            ::execv("/proc/self/exe", argv.data());
            ::_exit(127);
        }
        pids.push_back(pid);
    }
    for (pid_t p : pids) {
        int status = 0;
        ::waitpid(p, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            throw std::runtime_error(fmt::format("bench_ddp: a rank of {} failed", world));
    }
    Run run;
    for (int r = 0; r < world; ++r) {
        const std::string file = fmt::format("{}.{}", out, r);
        Run rank;
        std::ifstream(file) >> rank.seconds >> rank.loss >> rank.state_bytes;
        std::remove(file.c_str());
        if (r == 0) run = rank;
        run.state_bytes = std::max(run.state_bytes, rank.state_bytes);
    }
    return run;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "bench_ddp: %s needs a value\n", flag.c_str());
            return 2;
        }
        const std::string value = argv[++i];
        if (flag == "--world") {
            a.world = std::stoi(value);
        } else if (flag == "--batch") {
            a.batch = std::stoll(value);
        } else if (flag == "--grid") {
            a.grid = std::stoll(value);
        } else if (flag == "--caption_len") {
            a.caption_len = std::stoll(value);
        } else if (flag == "--steps") {
            a.steps = std::stoll(value);
        } else if (flag == "--rank_out") {
            a.out = value;
        } else if (flag == "--shard") {
            a.shard = value == "1";
        } else {
            std::fprintf(stderr,
                         "bench_ddp: unknown flag %s (known: --world --batch --grid "
                         "--caption_len --steps)\n",
                         flag.c_str());
            return 2;
        }
    }
    if (!a.out.empty()) return run_rank(a);
    if (a.world < 2 || a.batch < 1 || a.grid < 1 || a.steps < 1) {
        std::fprintf(stderr,
                     "bench_ddp: --world at least 2, --batch, --grid, --steps at least 1\n");
        return 2;
    }
    const Run one = run_world(a, 1, false), many = run_world(a, a.world, false),
              sharded = run_world(a, a.world, true);
    std::printf("grid %lld, batch %lld per rank, 1 thread per rank, median of %lld warm steps\n",
                static_cast<long long>(a.grid), static_cast<long long>(a.batch),
                static_cast<long long>(a.steps));
    std::printf("1 rank:  %.3f s/step, loss %.5f\n", one.seconds, one.loss);
    std::printf("%d ranks: %.3f s/step, loss %.5f (%lld samples per step)\n", a.world, many.seconds,
                many.loss, static_cast<long long>(a.batch * a.world));
    std::printf("%d ranks, ZeRO-1: %.3f s/step (%.3f of unsharded), loss %.5f\n", a.world,
                sharded.seconds, sharded.seconds / many.seconds, sharded.loss);
    std::printf(
        "optimizer state, the most on a rank: %lld bytes unsharded, %lld with ZeRO-1 (%.3f; "
        "1/%d = %.3f)\n",
        static_cast<long long>(many.state_bytes), static_cast<long long>(sharded.state_bytes),
        static_cast<double>(sharded.state_bytes) / static_cast<double>(many.state_bytes), a.world,
        1.0 / a.world);
    std::printf("ratio=%.3f\n", many.seconds / one.seconds);
    return 0;
}
