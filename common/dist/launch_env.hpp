// What a launcher (ours, torchrun, a Slurm wrapper) tells each rank through its environment, read in
// one place. The process group (common/dist/dist.hpp) forms from it; programs check their input against it
// before the group forms.
#pragma once

#include <string>

namespace dp {

/// What a launcher (ours, torchrun, a Slurm wrapper) tells a rank through its environment.
/// Without RANK/WORLD_SIZE a program runs as a single rank (rank 0 of 1).
struct LaunchEnv {
  int rank = 0;                           ///< RANK: global rank, 0..world_size-1
  int world_size = 1;                     ///< WORLD_SIZE: number of ranks in the job
  int local_rank = 0;                     ///< LOCAL_RANK: rank on this node (picks the GPU)
  int local_world_size = 1;               ///< LOCAL_WORLD_SIZE: ranks on this node (a simulated one under
                                          ///< ddp_launch --net-nodes: see ranks_on_this_machine())
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: host of rank 0's rendezvous store
  int master_port = 29500;                ///< MASTER_PORT: its TCP port
  bool launched = false;                  ///< true when RANK and WORLD_SIZE were set
  bool agent_store = false;               ///< TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already hosts the
                                          ///< store at MASTER_ADDR:MASTER_PORT, so rank 0 connects instead of hosting
  std::string gloo_ifname;      ///< GLOO_SOCKET_IFNAME: the interface Gloo binds (PyTorch's variable), or empty
  std::string net;              ///< DP_NET: the rate of ddp_launch --net's simulated links ("1gbit"), or empty
  double net_bit_s = 0;         ///< DP_NET_BIT_S: the same rate in bits/s (1e9), or 0
  int net_nodes = 0;            ///< DP_NET_NODES: ddp_launch --net-nodes, simulated nodes on this machine, or 0
  std::string net_uplink;       ///< DP_NET_UPLINK: the rate of their uplinks ("1gbit"), or empty
  double net_uplink_bit_s = 0;  ///< DP_NET_UPLINK_BIT_S: the same rate in bits/s, or 0
  std::string launch_command;   ///< DP_LAUNCH_COMMAND: ddp_launch's own command line, or empty
  std::string elastic_store;    ///< DP_ELASTIC_STORE: ddp_launch --elastic's store file, or empty
  int elastic_min = 1;          ///< DP_ELASTIC_MIN: ddp_launch --min-nproc (elastic runs), else 1
  int restart = 0;              ///< DP_RESTART: processes this rank's slot had before this one (0: the first)

  /// The ranks that share this machine's cores and memory: LOCAL_WORLD_SIZE, times DP_NET_NODES where
  /// ddp_launch --net-nodes simulates several nodes on it (each rank's LOCAL_WORLD_SIZE then counts only
  /// its simulated node's ranks). What threads and memory are divided by; a GPU is still bound by LOCAL_RANK.
  int ranks_on_this_machine() const { return net_nodes > 0 ? local_world_size * net_nodes : local_world_size; }

  /// True when every rank runs on this machine (ranks_on_this_machine() == WORLD_SIZE): simulated nodes too.
  bool single_node() const { return ranks_on_this_machine() == world_size; }

  /// Reads the variables above. This is the one place that reads the launch environment; throws
  /// dp::UsageError naming a malformed variable.
  static LaunchEnv from_environment();
};

}  // namespace dp
