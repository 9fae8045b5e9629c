// The world of a data-parallel job: this process's rank, the number of workers and where to meet,
// read from the environment a launcher sets (train --nproc-per-node, torchrun, srun, mpirun).
#pragma once

#include <cstdlib>
#include <functional>
#include <string>

namespace ska::dist {

struct World {
  int rank = 0;              // global rank in [0, world_size)
  int world_size = 1;
  int local_rank = 0;        // rank on this node: selects the GPU
  int local_world_size = 1;  // workers on this node
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the rendezvous store
  int master_port = 29500;
  // Where the values came from: "env" (RANK/WORLD_SIZE, as torchrun and train --nproc-per-node
  // set), "slurm" (an srun step), "openmpi" (mpirun) or "single" (none: one process).
  std::string source = "single";

  bool distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
};

// Reads the world in the order timm uses: RANK / WORLD_SIZE / LOCAL_RANK (+ LOCAL_WORLD_SIZE) with
// MASTER_ADDR / MASTER_PORT; else an srun step's SLURM_PROCID / SLURM_STEP_NUM_TASKS /
// SLURM_LOCALID (+ SLURM_STEP_TASKS_PER_NODE) with the first host of SLURM_STEP_NODELIST or
// SLURM_JOB_NODELIST unless MASTER_ADDR is set (a batch script without srun is one process, not a
// world that waits for peers forever); else OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK /
// _LOCAL_SIZE (MASTER_ADDR required when the job spans nodes). MASTER_PORT defaults to 29500.
// ValueError naming the variable for a malformed or inconsistent value (rank outside the world,
// a port outside 1..65535). `getenv` is injectable for tests.
World world_from_environment(
    const std::function<const char*(const char*)>& getenv = [](const char* k) {
      return std::getenv(k);
    });

// The first host of a Slurm node list: "gpu[003-005,9],cpu1" -> "gpu003", "a,b" -> "a".
std::string slurm_first_host(const std::string& nodelist);

}  // namespace ska::dist
