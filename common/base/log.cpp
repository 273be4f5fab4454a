// The rank and world size that tag printed lines; set once the launch environment is read.
#include "common/base/log.hpp"

namespace dp {
namespace {
int g_rank = 0;
int g_world = 1;
int g_tag_rank = -1, g_tag_world = -1;  // set_log_tag()'s, or -1: the group's
}  // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }

void set_log_tag(int rank, int world_size) {
  g_tag_rank = rank;
  g_tag_world = world_size;
}
std::string log_tag() {
  const bool own = g_tag_rank >= 0;
  return fmt::format("[rank {}/{}]", own ? g_tag_rank : g_rank, own ? g_tag_world : g_world);
}

}  // namespace dp
