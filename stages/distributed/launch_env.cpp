#include "stages/distributed/launch_env.h"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace sf::distributed {
namespace {

std::optional<std::string> lookup(const EnvLookup& get, const char* name) {
    const char* v = get ? get(name) : std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
}

// A whole non-negative number, or kInvalidArgument naming the variable.
int number(const std::string& value, const char* name) {
    size_t used = 0;
    long n = -1;
    try {
        n = std::stol(value, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != value.size() || n < 0 || n > 1'000'000) {
        throw Error::InvalidArgument(
            fmt::format("the environment variable {}={} is not a rank or a count", name, value));
    }
    return static_cast<int>(n);
}

int number_or(const EnvLookup& get, const char* name, int fallback) {
    const auto v = lookup(get, name);
    return v ? number(*v, name) : fallback;
}

// Slurm's SLURM_NTASKS_PER_NODE: "4" or "4(x2)" (tasks per node, for nodes alike).
int tasks_per_node(const EnvLookup& get, int fallback) {
    auto v = lookup(get, "SLURM_NTASKS_PER_NODE");
    if (!v) return fallback;
    const size_t paren = v->find('(');
    return number(v->substr(0, paren), "SLURM_NTASKS_PER_NODE");
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
    const size_t comma = nodelist.find(',');
    const size_t bracket = nodelist.find('[');
    if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
        return nodelist.substr(0, comma);
    // "prefix[03-05,9]...": the prefix and the first number of the range, its zeros kept.
    const size_t end = nodelist.find_first_of("-,]", bracket + 1);
    if (end == std::string::npos || end == bracket + 1) {
        throw Error::InvalidArgument(
            fmt::format("SLURM_JOB_NODELIST={}: cannot read its first host", nodelist));
    }
    return nodelist.substr(0, bracket) + nodelist.substr(bracket + 1, end - bracket - 1);
}

LaunchEnv launch_env(const EnvLookup& get) {
    LaunchEnv e;
    if (lookup(get, "RANK") || lookup(get, "WORLD_SIZE")) {
        if (!lookup(get, "RANK") || !lookup(get, "WORLD_SIZE"))
            throw Error::InvalidArgument(
                "RANK and WORLD_SIZE are set together (as torchrun does), one of them is missing");
        e.launcher = "torchrun";
        e.rank = number(*lookup(get, "RANK"), "RANK");
        e.world_size = number(*lookup(get, "WORLD_SIZE"), "WORLD_SIZE");
        e.local_rank = number_or(get, "LOCAL_RANK", e.rank);
        e.local_world_size = number_or(get, "LOCAL_WORLD_SIZE", e.world_size);
        e.agent_store = lookup(get, "TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    } else if (lookup(get, "SLURM_PROCID") && lookup(get, "SLURM_NTASKS")) {
        e.launcher = "slurm";
        e.rank = number(*lookup(get, "SLURM_PROCID"), "SLURM_PROCID");
        e.world_size = number(*lookup(get, "SLURM_NTASKS"), "SLURM_NTASKS");
        e.local_rank = number_or(get, "SLURM_LOCALID", 0);
        e.local_world_size = tasks_per_node(get, e.world_size);
        if (auto nodes = lookup(get, "SLURM_JOB_NODELIST"))
            e.master_addr = first_slurm_host(*nodes);
    } else {
        return e;
    }
    if (e.world_size < 1 || e.rank >= e.world_size) {
        throw Error::InvalidArgument(fmt::format("rank {} of a world of {} ({}'s variables)",
                                                 e.rank, e.world_size, e.launcher));
    }
    if (e.local_rank >= e.local_world_size) {
        throw Error::InvalidArgument(
            fmt::format("local rank {} of {} on this machine", e.local_rank, e.local_world_size));
    }
    if (auto addr = lookup(get, "MASTER_ADDR")) e.master_addr = *addr;
    e.master_port = number_or(get, "MASTER_PORT", e.master_port);
    if (e.master_port < 1 || e.master_port > 65535)
        throw Error::InvalidArgument(fmt::format("MASTER_PORT={} is no port", e.master_port));
    return e;
}

std::string per_rank_name(const std::string& name, const LaunchEnv& env) {
    if (env.rank == 0) return name;
    const size_t dot = name.rfind('.');
    const std::string stem = dot == std::string::npos ? name : name.substr(0, dot);
    const std::string ext = dot == std::string::npos ? "" : name.substr(dot);
    return fmt::format("{}.rank-{}{}", stem, env.rank, ext);
}

std::string LaunchEnv::describe() const {
    return fmt::format("rank {} of {} (local {} of {}, {}, store {}:{})", rank, world_size,
                       local_rank, local_world_size, launcher, master_addr, master_port);
}

}  // namespace sf::distributed
