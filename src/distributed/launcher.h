// Starting the workers of one node: `train --nproc-per-node N` and benchmark_comm respawn
// themselves through it with the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR ...).
#pragma once

#include <string>
#include <vector>

namespace ska::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this host, which only a one-node job can use
  double grace_s = 10;  // between SIGTERM and SIGKILL when stopping the workers
  // After a forwarded SIGINT/SIGTERM, the time the workers have to end on their own (train
  // writes a checkpoint first); a second signal shortens it to grace_s.
  double signal_grace_s = 300;
};

// Runs nproc_per_node copies of the program argv[0] (a path, or a name looked up in PATH) with
// arguments argv, each with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, GROUP_RANK and NODE_RANK added to this process's environment, and waits for them.
// SIGINT and SIGTERM received meanwhile are forwarded to the workers, which get signal_grace_s
// to end (grace_s after a second signal). When a worker exits non-zero or by a signal, it says
// so on stderr, SIGTERMs the others and SIGKILLs those left after grace_s. Returns 0 when every
// worker succeeded, else the first failure's exit code (128 + signal for a signal; 128 + the
// forwarded signal when interrupted; the first such signal in *forwarded, 0 if none).
// ValueError for bad options. Call it before starting threads (it forks); the workers get SIGKILL
// if this process dies.
int launch_local_workers(const std::vector<std::string>& argv, const LaunchOptions& options,
                         int* forwarded = nullptr);

// A TCP port no socket of this host is bound to at the time of the call.
int find_free_port();

}  // namespace ska::dist
