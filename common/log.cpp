// The rank and world size that tag printed lines; set once the launch environment is read.
#include "common/log.hpp"

namespace dp {
namespace {
int g_rank = 0;
int g_world = 1;
}  // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }
int log_world() { return g_world; }

}  // namespace dp
