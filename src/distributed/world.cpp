// Reading the world from the environment (see world.h).
#include "distributed/world.h"

#include <string>

#include "core/error.h"

namespace ska::dist {

World world_from_environment(const std::function<const char*(const char*)>& getenv) {
  World w;
  const char* rank = getenv("RANK");
  const char* size = getenv("WORLD_SIZE");
  if (rank && size) {
    w.rank = std::stoi(rank);
    w.world_size = std::stoi(size);
    w.source = "env";
  }
  return w;
}

std::string slurm_first_host(const std::string& nodelist) { return nodelist; }

}  // namespace ska::dist
