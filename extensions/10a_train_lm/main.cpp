// Extension 10a, on stage 10: the capstone (stage 08) trained with HSDP, without stage 08 knowing of stage 10.
//
// What it adds: stage 08 picks its synchronization by name from a table (stages/08_train_lm/trainer.hpp). Here one
// more name, --sync hsdp, is registered into it: stage 10's HSDP over a mesh of --nodes nodes (stage 07's FSDP
// inside each node, the reduced shards all-reduced across nodes, HsdpSync::all_reduce_last), and then stage 08's
// own program runs: the same flags, the same check against one process (with --clip-grad-norm, clipped on both
// sides), the same loop, checkpoints and curve. Dependencies still run one way: this extension links stages 08 and
// 10; neither links it, nor stage 08 stage 10.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/ext10a_train_lm --sync hsdp --nodes 2 --clip-grad-norm 1
//   ./build/bin/ddp_launch --nproc 4 --net 10gbit --net-nodes 2 --net-uplink 1gbit -- \
//       ./build/bin/ext10a_train_lm --sync hsdp --steps 30        (the nodes from the launcher: 2 x 2 ranks)
// Correct output: "PASS hsdp trains like one process ..." (with --clip-grad-norm its bound ends "; clipped: ..."),
// "HSDP on 2 nodes x 2 ranks: ...", the loss falling as stage 08's does (with --clip-grad-norm each step line shows
// |g|, the norm before clipping), "(no sample: under hsdp no rank holds the whole model)", and last "PASS stage 08".
// The curves at 1 rank, 2 (2 nodes x 1) and 4 (2 x 2) agree within stage 08's tolerance (ctest -R ext10a_curves).
//
// What it leaves: the node count is fixed for a run (a checkpoint resumes at any world size and --nodes, as
// stage 08's does); an elastic HSDP, which would heal a lost shard from its replica on another node, is not here
// (stage 09 refuses --sync hsdp and says why).
#include "common/base/errors.hpp"
#include "common/dist/mesh.hpp"
#include "common/measure/cli.hpp"  // PositiveInt (and CLI11)
#include "stages/08_train_lm/train_loop.hpp"
#include "stages/08_train_lm/trainer.hpp"
#include "stages/10_hierarchy/strategies.hpp"

#include <fmt/format.h>

using namespace dp;

int main(int argc, char** argv) {
  int nodes = 0;  // 0: nodes_from_environment() (ddp_launch --net-nodes, else the launch's WORLD / LOCAL_WORLD)
  const auto node_count = [&nodes] { return nodes > 0 ? nodes : nodes_from_environment(); };
  register_sync(
      "hsdp", "stage 10's HSDP over --nodes nodes",
      [node_count](const TrainerOptions&) { return hsdp_strategy(node_count(), {}, HsdpSync::all_reduce_last); },
      // Before the process group forms: Mesh::make() would refuse it too, but only once every rank has met.
      [node_count](const TrainerOptions&, int world_size) {
        const int n = node_count();
        if (world_size % n != 0)
          throw UsageError(
              fmt::format("--sync hsdp over {} nodes: {} ranks do not split into equal nodes; give "
                          "--nodes a divisor of {} (or launch a multiple of {} ranks)",
                          n, world_size, world_size, n));
      });
  return train_lm_main(argc, argv, "ext10a_train_lm",
                       "Extension 10a: stage 08's language model trained with HSDP (--sync hsdp), or as stage 08",
                       [&nodes](CLI::App& app) {
                         app.add_option("--nodes", nodes,
                                        "Nodes of HSDP's mesh (--sync hsdp; default: ddp_launch --net-nodes, else "
                                        "the launch's)")
                             ->check(PositiveInt);
                       });
}
