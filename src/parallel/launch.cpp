// Where a launched process stands (include/mxmoe/parallel.h launch_info): the environment that
// scripts/launch.sh (or torchrun, or a cluster's launcher) sets.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "mxmoe/error.h"
#include "mxmoe/parallel.h"

namespace mxmoe::parallel {
namespace {

// The integer value of environment variable `name`, or `fallback` when unset or empty.
int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  MXMOE_CHECK_ARG(errno == 0 && *end == '\0' && n >= lo && n <= hi, name,
                  "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", std::string("'") + v + "'");
  return static_cast<int>(n);
}

}  // namespace

launch_info launch_info_from_environment() {
  launch_info info;
  const char* world = std::getenv("WORLD_SIZE");
  info.launched = world != nullptr && *world != '\0';
  if (!info.launched) return info;
  info.ranks = env_int("WORLD_SIZE", 1, 1, 1 << 16);
  info.rank = env_int("RANK", 0, 0, info.ranks - 1);
  info.local_rank = env_int("LOCAL_RANK", info.rank, 0, info.ranks - 1);
  const char* file = std::getenv("MXMOE_NCCL_ID_FILE");
  if (file != nullptr) info.id_file = file;
  return info;
}

}  // namespace mxmoe::parallel
