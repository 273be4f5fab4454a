// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and this project's own
// variables (DP_*, ddp_launch's, DP_NET_NODES among them); a malformed value is a usage error (exit 2) that
// names the variable.
#include "common/dist/launch_env.hpp"

#include "common/base/errors.hpp"
#include "common/base/log.hpp"

#include <fmt/format.h>

#include <cstdlib>

namespace dp {
namespace {

// Reads an integer environment variable; a malformed value is a usage error, not a crash.
int env_int(const char* name, int fallback, int min_value) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (*end != '\0' || v < min_value || v > 1 << 30)
    throw UsageError(
        fmt::format("environment variable {}='{}' is not an integer >= {}; "
                    "unset it or let the launcher set it",
                    name, s, min_value));
  return static_cast<int>(v);
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  if (const char* i = std::getenv("GLOO_SOCKET_IFNAME"); i && *i) env.gloo_ifname = i;
  if (const char* n = std::getenv("DP_NET"); n && *n) env.net = n;
  if (const char* b = std::getenv("DP_NET_BIT_S"); b && *b) env.net_bit_s = std::strtod(b, nullptr);
  if (const char* c = std::getenv("DP_LAUNCH_COMMAND"); c && *c) env.launch_command = c;
  env.launched = std::getenv("RANK") && std::getenv("WORLD_SIZE");
  if (!env.launched) return env;  // started by hand: one rank
  env.world_size = env_int("WORLD_SIZE", 1, 1);
  env.rank = env_int("RANK", 0, 0);
  env.local_rank = env_int("LOCAL_RANK", env.rank, 0);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", env.world_size, 1);
  env.master_port = env_int("MASTER_PORT", 29500, 1);
  env.net_nodes = env_int("DP_NET_NODES", 0, 1);
  if (const char* u = std::getenv("DP_NET_UPLINK"); u && *u) env.net_uplink = u;
  if (const char* b = std::getenv("DP_NET_UPLINK_BIT_S"); b && *b) env.net_uplink_bit_s = std::strtod(b, nullptr);
  if (const char* e = std::getenv("DP_ELASTIC_STORE"); e && *e) env.elastic_store = e;
  env.elastic_min = env_int("DP_ELASTIC_MIN", 1, 1);
  env.restart = env_int("DP_RESTART", 0, 0);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) env.master_addr = a;
  if (const char* u = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); u) env.agent_store = std::string(u) == "True";
  if (env.rank >= env.world_size)
    throw UsageError(
        fmt::format("RANK={} is not below WORLD_SIZE={}; check the launcher's settings", env.rank, env.world_size));
  if (env.master_port > 65535)
    throw UsageError(fmt::format("MASTER_PORT={} is not a TCP port (1..65535)", env.master_port));
  // Stages check their input against the world size before the group forms: their errors carry this tag.
  set_log_rank(env.rank, env.world_size);
  return env;
}

}  // namespace dp
