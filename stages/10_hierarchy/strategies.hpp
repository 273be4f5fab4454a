// Stage 10's ways of training as dp::Strategy (common/contract/strategy.hpp): HSDP in its three accumulation
// flavours, so that the common check, the benchmark harness and the training-strategy contract suite run them as
// they run stage 07's FSDP.
#pragma once

#include "common/contract/strategy.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/10_hierarchy/hierarchical.hpp"
#include "stages/10_hierarchy/hsdp.hpp"

#include <functional>
#include <memory>

namespace dp {

/// Stage 05's bucketed DDP with each bucket all-reduced hierarchically over a mesh of `nodes` nodes formed from the
/// strategy's group (HierarchicalHook): one AdamW (or whatever it is given) over every parameter, as
/// bucketed_ddp_strategy(). Its GradSync owns the mesh and the hook's worker.
MakeStrategy hierarchical_ddp_strategy(int nodes, double bucket_cap_mb);

/// Builds the Hsdp a strategy trains with (tests plant mistakes in a subclass); empty: an Hsdp.
using MakeHsdp = std::function<std::unique_ptr<Hsdp>(Mesh&, std::shared_ptr<torch::nn::Module>, const ModuleUnits&,
                                                     FsdpOptions, HsdpSync)>;

/// HSDP (Hsdp over a mesh of `nodes` nodes, formed from the group the strategy is given) with `opts` and `sync`,
/// and one optimizer over its shards and replicated tensors. The model must have units (dp::UnitModel).
/// sent_bytes_per_step() counts both tiers; calls_per_step() both tiers' collectives.
MakeStrategy hsdp_strategy(int nodes, FsdpOptions opts = {}, HsdpSync sync = HsdpSync::all_reduce_last,
                           MakeHsdp make_hsdp = {});

}  // namespace dp
