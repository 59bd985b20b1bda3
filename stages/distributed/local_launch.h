// `--nproc_per_node N` on one machine: this program run again as N ranks, each a child process
// with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
// 127.0.0.1 and a free MASTER_PORT), as `torchrun --standalone --nproc_per_node N --no-python`
// would start it. The children see RANK set and so do not launch again. Torch-free.
#pragma once

#include <string>
#include <vector>

namespace sf::distributed {

// Runs `argv` (argv[0] is ignored: the children run /proc/self/exe) as `ranks` ranks and waits
// for them. When one fails, the others get SIGTERM (SIGKILL 10 s later) and the failure is named
// on stderr; SIGINT and SIGTERM sent to this process go to every rank. Returns 0 when every rank
// succeeded, else the first failing rank's exit status (128 + the signal for a signal).
int run_local_ranks(const std::vector<std::string>& argv, int ranks);

// A TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick).
int free_local_port();

}  // namespace sf::distributed
