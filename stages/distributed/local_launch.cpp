#include "stages/distributed/local_launch.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace sf::distributed {
namespace {

// The children, for the signal handler (async-signal-safe: a fixed array and kill()).
constexpr int kMostRanks = 1024;
volatile pid_t g_children[kMostRanks];
volatile int g_child_count = 0;

void forward_signal(int sig) {
    for (int i = 0; i < g_child_count; ++i) {
        if (g_children[i] > 0) ::kill(g_children[i], sig);
    }
}

int status_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

std::string describe(int status) {
    if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
    return fmt::format("exited with status {}", status_code(status));
}

pid_t start_rank(const std::vector<std::string>& argv, int rank, int ranks, int port) {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    // The child: torchrun's variables, then this program again.
    const std::string r = std::to_string(rank), n = std::to_string(ranks);
    ::setenv("RANK", r.c_str(), 1);
    ::setenv("LOCAL_RANK", r.c_str(), 1);
    ::setenv("WORLD_SIZE", n.c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", n.c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv("/proc/self/exe", args.data());
    std::fprintf(stderr, "sanaflow: --nproc_per_node: cannot run /proc/self/exe: %s\n",
                 std::strerror(errno));
    ::_exit(127);
}

}  // namespace

int free_local_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        throw Error::IOError(fmt::format("--nproc_per_node: socket: {}", std::strerror(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    const int error = errno;
    ::close(fd);
    if (!ok) {
        throw Error::IOError(
            fmt::format("--nproc_per_node: no free port on 127.0.0.1: {}", std::strerror(error)));
    }
    return ntohs(addr.sin_port);
}

int run_local_ranks(const std::vector<std::string>& argv, int ranks) {
    if (ranks < 1 || ranks > kMostRanks) {
        throw Error::InvalidArgument(
            fmt::format("--nproc_per_node {}: between 1 and {}", ranks, kMostRanks));
    }
    const int port = free_local_port();
    std::fprintf(stderr, "sanaflow: --nproc_per_node %d: ranks 0-%d on 127.0.0.1:%d\n", ranks,
                 ranks - 1, port);
    std::fflush(stderr);
    struct sigaction forward {};
    forward.sa_handler = forward_signal;
    sigemptyset(&forward.sa_mask);
    struct sigaction old_int {
    }, old_term{};
    ::sigaction(SIGINT, &forward, &old_int);
    ::sigaction(SIGTERM, &forward, &old_term);
    std::vector<pid_t> pids;
    for (int r = 0; r < ranks; ++r) {
        const pid_t pid = start_rank(argv, r, ranks, port);
        if (pid < 0) break;
        pids.push_back(pid);
        g_children[r] = pid;
        g_child_count = r + 1;
    }
    int result = pids.size() == static_cast<size_t>(ranks) ? 0 : 1;
    if (result != 0) std::fprintf(stderr, "sanaflow: --nproc_per_node: fork failed\n");
    bool stopping = result != 0;
    if (stopping) forward_signal(SIGTERM);
    auto stopping_since = std::chrono::steady_clock::now();
    size_t running = pids.size();
    while (running > 0) {
        int status = 0;
        const pid_t done = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
        if (done < 0 && errno == EINTR) continue;
        if (done < 0) break;
        if (done == 0) {  // stopping: the ones left get SIGKILL after 10 s
            if (std::chrono::steady_clock::now() - stopping_since > std::chrono::seconds(10))
                forward_signal(SIGKILL);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            continue;
        }
        int rank = -1;
        for (size_t i = 0; i < pids.size(); ++i) {
            if (pids[i] == done) rank = static_cast<int>(i);
        }
        if (rank < 0) continue;
        g_children[rank] = 0;
        --running;
        if (status_code(status) != 0 && result == 0) {
            result = status_code(status);
            std::fprintf(stderr, "sanaflow: --nproc_per_node: rank %d %s; stopping the others\n",
                         rank, describe(status).c_str());
            stopping = true;
            stopping_since = std::chrono::steady_clock::now();
            forward_signal(SIGTERM);
        }
    }
    g_child_count = 0;
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    return result;
}

}  // namespace sf::distributed
