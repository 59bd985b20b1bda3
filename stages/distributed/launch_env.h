// Where this process stands in a data-parallel run, read from the environment its launcher set:
// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE) or, when RANK is absent, Slurm's (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NTASKS_PER_NODE, the first host of SLURM_JOB_NODELIST unless MASTER_ADDR
// says otherwise). Neither: one process. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace sf::distributed {

struct LaunchEnv {
    std::string launcher = "none";  // "torchrun" (or its variables set by hand), "slurm", "none"
    int rank = 0, world_size = 1;
    int local_rank = 0, local_world_size = 1;
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    // torchrun's agent hosts the rendezvous store at MASTER_ADDR:MASTER_PORT (its static
    // rendezvous); every rank connects to it as a client.
    bool agent_store = false;

    bool distributed() const { return world_size > 1; }
    std::string describe() const;  // "rank 1 of 2 (local 1 of 2, torchrun, 127.0.0.1:29500)"
};

// kInvalidArgument naming the variable when one is not a number, out of range (RANK >=
// WORLD_SIZE), or half of a pair is missing. `get` looks a variable up (std::getenv by default;
// tests pass their own).
using EnvLookup = std::function<const char*(const char*)>;
LaunchEnv launch_env(const EnvLookup& get = nullptr);

// A file every rank writes into one folder (the memory timeline): `name` for rank 0 and one
// process, "stem.rank-N.ext" for rank N, so that the ranks do not overwrite each other's.
std::string per_rank_name(const std::string& name, const LaunchEnv& env);

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03", "a,b" -> "a".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace sf::distributed
