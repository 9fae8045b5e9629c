// Tests of reading the world from the environment (torchrun, srun, mpirun) with a fake getenv,
// and of the first host of a Slurm node list.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "core/error.h"
#include "distributed/world.h"

using namespace ska;
using namespace ska::dist;

namespace {

// world_from_environment over exactly these variables.
World world_of(const std::map<std::string, std::string>& env) {
  return world_from_environment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("world: no launcher variables is one process", "[cpu][distributed]") {
  World w = world_of({});
  CHECK(w.source == "single");
  CHECK(w.rank == 0);
  CHECK(w.world_size == 1);
  CHECK_FALSE(w.distributed());
  CHECK(w.master_port == 29500);
}

TEST_CASE("world: torchrun variables", "[cpu][distributed]") {
  World w = world_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                      {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"},
                      {"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  CHECK(w.source == "env");
  CHECK(w.rank == 5);
  CHECK(w.world_size == 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 4);
  CHECK(w.master_addr == "node7");
  CHECK(w.master_port == 1234);
  CHECK(w.distributed());
  CHECK_FALSE(w.is_main());

  // Without LOCAL_*: one node.
  World one = world_of({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  CHECK(one.local_rank == 2);
  CHECK(one.local_world_size == 3);
  CHECK(one.master_addr == "127.0.0.1");
  CHECK(one.master_port == 29500);
}

TEST_CASE("world: malformed or inconsistent torchrun values name the variable",
          "[cpu][distributed]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_MATCHES(world_of({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}), ValueError,
                       Catch::Matchers::Predicate<ValueError>([](const ValueError& e) {
                         return std::string(e.what()).find("RANK='1x'") != std::string::npos;
                       }));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", ""}}), Contains("WORLD_SIZE"));
  CHECK_THROWS_WITH(world_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), Contains("RANK='-1'"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}}), Contains("WORLD_SIZE is not set"));
  CHECK_THROWS_WITH(world_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
                    Contains("RANK=2 is outside the world of WORLD_SIZE=2"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), Contains("WORLD_SIZE=0"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"},
                              {"LOCAL_WORLD_SIZE", "2"}}),
                    Contains("LOCAL_RANK=2"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                    Contains("MASTER_PORT=70000"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
                    Contains("MASTER_PORT=0"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}),
                    Contains("MASTER_PORT='http'"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
                    Contains("WORLD_SIZE='99999999999'"));
}

TEST_CASE("world: an srun step", "[cpu][distributed]") {
  World w = world_of({{"SLURM_PROCID", "5"}, {"SLURM_STEP_NUM_TASKS", "7"}, {"SLURM_NTASKS", "99"},
                      {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                      {"SLURM_STEP_TASKS_PER_NODE", "2(x2),3"},
                      {"SLURM_STEP_NODELIST", "gpu[003-005,9],cpu1"},
                      {"SLURM_JOB_NODELIST", "other[1-9]"}});
  CHECK(w.source == "slurm");
  CHECK(w.rank == 5);
  CHECK(w.world_size == 7);  // the step's task count, not SLURM_NTASKS
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 3);
  CHECK(w.master_addr == "gpu003");
  CHECK(w.master_port == 29500);

  // The job's node list when the step's is missing; MASTER_ADDR wins over both.
  std::map<std::string, std::string> env = {{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"},
                                            {"SLURM_JOB_NODELIST", "n[12-13]"}};
  CHECK(world_of(env).master_addr == "n12");
  CHECK(world_of(env).local_world_size == 2);
  env["MASTER_ADDR"] = "10.1.2.3";
  env["MASTER_PORT"] = "4000";
  CHECK(world_of(env).master_addr == "10.1.2.3");
  CHECK(world_of(env).master_port == 4000);
}

TEST_CASE("world: a batch script without srun is one process", "[cpu][distributed]") {
  World w = world_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_NODELIST", "a,b"}});
  CHECK(w.source == "single");
  CHECK(w.world_size == 1);
}

TEST_CASE("world: malformed srun values name the variable", "[cpu][distributed]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(world_of({{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "2"},
                              {"SLURM_STEP_NODELIST", "a"}}),
                    Contains("SLURM_PROCID=3"));
  CHECK_THROWS_WITH(world_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "two"}}),
                    Contains("SLURM_STEP_NUM_TASKS='two'"));
  CHECK_THROWS_WITH(world_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}}),
                    Contains("SLURM_STEP_NODELIST"));
  CHECK_THROWS_WITH(world_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"},
                              {"SLURM_STEP_NODELIST", "a,b"}, {"SLURM_NODEID", "3"},
                              {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}),
                    Contains("SLURM_STEP_TASKS_PER_NODE"));
}

TEST_CASE("world: mpirun", "[cpu][distributed]") {
  std::map<std::string, std::string> env = {
      {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  World w = world_of(env);
  CHECK(w.source == "openmpi");
  CHECK(w.rank == 3);
  CHECK(w.world_size == 4);
  CHECK(w.local_rank == 3);
  CHECK(w.local_world_size == 4);
  CHECK(w.master_addr == "127.0.0.1");

  // Over two nodes rank 0's host must be given.
  env["OMPI_COMM_WORLD_SIZE"] = "8";
  CHECK_THROWS_WITH(world_of(env), Catch::Matchers::Contains("MASTER_ADDR"));
  env["MASTER_ADDR"] = "head";
  CHECK(world_of(env).master_addr == "head");
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "x";
  CHECK_THROWS_WITH(world_of(env), Catch::Matchers::Contains("OMPI_COMM_WORLD_LOCAL_RANK='x'"));
  env.erase("OMPI_COMM_WORLD_LOCAL_RANK");
  CHECK_THROWS_WITH(world_of(env), Catch::Matchers::Contains("OMPI_COMM_WORLD_LOCAL_RANK"));
}

TEST_CASE("slurm_first_host expands the first bracket range", "[cpu][distributed]") {
  CHECK(slurm_first_host("gpu[003-005,9],cpu1") == "gpu003");
  CHECK(slurm_first_host("a,b") == "a");
  CHECK(slurm_first_host("node17") == "node17");
  CHECK(slurm_first_host("gpu[9,003-005]") == "gpu9");
  CHECK(slurm_first_host("rack[1-2]-n[07-08]") == "rack1-n07");
  CHECK(slurm_first_host("x[0010-0020],y[1-2]") == "x0010");
  CHECK_THROWS_AS(slurm_first_host(""), ValueError);
  CHECK_THROWS_AS(slurm_first_host("gpu[1-2"), ValueError);
  CHECK_THROWS_AS(slurm_first_host("gpu[]"), ValueError);
  CHECK_THROWS_AS(slurm_first_host(",a"), ValueError);
}
