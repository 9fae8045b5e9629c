// Reading the world from the environment a launcher sets: torchrun-style variables, an srun step
// or mpirun (see world.h for the order and the rules).
#include "distributed/world.h"

#include <cctype>
#include <string>
#include <vector>

#include "core/error.h"

namespace ska::dist {

namespace {

using Getenv = std::function<const char*(const char*)>;

constexpr int kDefaultMasterPort = 29500;

// A non-negative decimal integer, the whole of the value: "2x", "", "-1" and overflows are
// ValueErrors naming the variable, so that a typo never becomes rank 0 silently.
int parse_int(const char* name, const std::string& text) {
  bool digits = !text.empty() && text.size() <= 9;
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  SKA_CHECK(digits, ValueError, "environment variable ", name, "='", text,
            "' is not a non-negative integer");
  return std::stoi(text);
}

int env_int(const Getenv& getenv, const char* name, int fallback) {
  const char* value = getenv(name);
  return value ? parse_int(name, value) : fallback;
}

int env_int_required(const Getenv& getenv, const char* name, const char* why) {
  const char* value = getenv(name);
  SKA_CHECK(value != nullptr, ValueError, "environment variable ", name, " is not set (", why, ")");
  return parse_int(name, value);
}

std::string env_str(const Getenv& getenv, const char* name, const std::string& fallback) {
  const char* value = getenv(name);
  return value && *value ? std::string(value) : fallback;
}

// Names of the variables a source reads, for messages about inconsistent values.
struct Names {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

void validate(const World& w, const Names& n) {
  SKA_CHECK(w.world_size >= 1, ValueError, n.size, "=", w.world_size, " must be at least 1");
  SKA_CHECK(w.rank < w.world_size, ValueError, n.rank, "=", w.rank, " is outside the world of ",
            n.size, "=", w.world_size);
  SKA_CHECK(w.local_world_size >= 1 && w.local_world_size <= w.world_size, ValueError,
            n.local_size, "=", w.local_world_size, " must be in 1..", n.size, "=", w.world_size);
  SKA_CHECK(w.local_rank < w.local_world_size, ValueError, n.local_rank, "=", w.local_rank,
            " is outside the node's ", w.local_world_size, " workers (", n.local_size, ")");
  SKA_CHECK(w.master_port >= 1 && w.master_port <= 65535, ValueError, "MASTER_PORT=",
            w.master_port, " is outside 1..65535");
  SKA_CHECK(!w.master_addr.empty(), ValueError, "MASTER_ADDR is empty");
}

// MASTER_PORT for every source; a value of 0 or above 65535 fails in validate().
int master_port(const Getenv& getenv) {
  const char* value = getenv("MASTER_PORT");
  if (!value) return kDefaultMasterPort;
  std::string text(value);
  SKA_CHECK(text.size() <= 5, ValueError, "MASTER_PORT=", text, " is outside 1..65535");
  return parse_int("MASTER_PORT", text);
}

// torchrun and train --nproc-per-node. Without LOCAL_RANK every worker is taken to be on one
// node (local rank = rank), which is what a hand-set RANK/WORLD_SIZE usually means.
World from_torchrun(const Getenv& getenv) {
  World w;
  w.source = "env";
  const char* why = "RANK and WORLD_SIZE come together";
  w.rank = env_int_required(getenv, "RANK", why);
  w.world_size = env_int_required(getenv, "WORLD_SIZE", why);
  w.local_rank = env_int(getenv, "LOCAL_RANK", w.rank);
  w.local_world_size = env_int(getenv, "LOCAL_WORLD_SIZE", w.world_size);
  w.master_addr = env_str(getenv, "MASTER_ADDR", w.master_addr);
  w.master_port = master_port(getenv);
  validate(w, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  return w;
}

// SLURM_STEP_TASKS_PER_NODE, e.g. "4(x2),3": the task count of node `node` (0-based).
int slurm_tasks_on_node(const std::string& text, int node) {
  const char* name = "SLURM_STEP_TASKS_PER_NODE";
  size_t pos = 0;
  int first_node = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    int repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      SKA_CHECK(item.back() == ')', ValueError, name, "='", text, "' is malformed");
      repeat = parse_int(name, item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int tasks = parse_int(name, item);
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
    pos = end + 1;
  }
  SKA_FAIL(ValueError, name, "='", text, "' lists ", first_node, " nodes; SLURM_NODEID=", node,
           " is not among them");
}

World from_slurm(const Getenv& getenv) {
  World w;
  w.source = "slurm";
  w.rank = env_int_required(getenv, "SLURM_PROCID", "an srun step sets it");
  w.world_size = env_int_required(getenv, "SLURM_STEP_NUM_TASKS", "an srun step sets it");
  w.local_rank = env_int(getenv, "SLURM_LOCALID", 0);
  const char* per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
  w.local_world_size = per_node ? slurm_tasks_on_node(per_node, env_int(getenv, "SLURM_NODEID", 0))
                                : w.world_size;
  std::string nodes = env_str(getenv, "SLURM_STEP_NODELIST", env_str(getenv, "SLURM_JOB_NODELIST", ""));
  if (const char* addr = getenv("MASTER_ADDR"); addr && *addr) {
    w.master_addr = addr;
  } else if (!nodes.empty()) {
    w.master_addr = slurm_first_host(nodes);
  } else {
    SKA_CHECK(w.world_size == 1, ValueError, "an srun step of ", w.world_size,
              " tasks needs SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or MASTER_ADDR");
  }
  w.master_port = master_port(getenv);
  validate(w, {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"});
  return w;
}

World from_openmpi(const Getenv& getenv) {
  World w;
  w.source = "openmpi";
  const char* why = "mpirun sets the OMPI_COMM_WORLD_* variables together";
  w.rank = env_int_required(getenv, "OMPI_COMM_WORLD_RANK", why);
  w.world_size = env_int_required(getenv, "OMPI_COMM_WORLD_SIZE", why);
  w.local_rank = env_int_required(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", why);
  w.local_world_size = env_int_required(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", why);
  const char* addr = getenv("MASTER_ADDR");
  if (addr && *addr) {
    w.master_addr = addr;
  } else {
    // One node's workers can meet on loopback; across nodes only the user knows rank 0's host.
    SKA_CHECK(w.local_world_size >= w.world_size, ValueError, "an mpirun job over several nodes (",
              "OMPI_COMM_WORLD_SIZE=", w.world_size, ", OMPI_COMM_WORLD_LOCAL_SIZE=",
              w.local_world_size, ") needs MASTER_ADDR set to rank 0's host");
  }
  w.master_port = master_port(getenv);
  validate(w, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"});
  return w;
}

}  // namespace

World world_from_environment(const Getenv& getenv) {
  if (getenv("RANK") || getenv("WORLD_SIZE")) return from_torchrun(getenv);
  // A batch script (no srun) has SLURM_PROCID but no step task count: one process.
  if (getenv("SLURM_STEP_NUM_TASKS") && getenv("SLURM_PROCID")) return from_slurm(getenv);
  if (getenv("OMPI_COMM_WORLD_RANK") || getenv("OMPI_COMM_WORLD_SIZE")) return from_openmpi(getenv);
  World w;
  w.master_port = master_port(getenv);
  return w;
}

// Copies the first name of the list, expanding each bracket group to its first element:
// "gpu[003-005,9],cpu1" -> "gpu003", "r[1-2]-n[07,9]" -> "r1-n07".
std::string slurm_first_host(const std::string& nodelist) {
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      SKA_CHECK(nodelist[i] != ']', ValueError, "Slurm node list '", nodelist,
                "' has an unmatched ']'");
      host += nodelist[i++];
      continue;
    }
    size_t close = nodelist.find(']', i);
    SKA_CHECK(close != std::string::npos, ValueError, "Slurm node list '", nodelist,
              "' has an unclosed '['");
    std::string group = nodelist.substr(i + 1, close - i - 1);
    std::string first = group.substr(0, group.find_first_of(",-"));
    SKA_CHECK(!first.empty(), ValueError, "Slurm node list '", nodelist, "' has an empty range");
    host += first;  // the start of a range keeps its zero padding
    i = close + 1;
  }
  SKA_CHECK(!host.empty(), ValueError, "Slurm node list '", nodelist, "' names no host");
  return host;
}

}  // namespace ska::dist
