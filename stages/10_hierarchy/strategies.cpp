#include "stages/10_hierarchy/strategies.hpp"

#include "common/measure/memory.hpp"

#include <stdexcept>

namespace dp {

namespace {

UnitModel& units_of(torch::nn::Module& model) {
  UnitModel* m = as_unit_model(model);
  if (!m) throw std::invalid_argument("hsdp_strategy: the model has no units (it is not a dp::UnitModel)");
  return *m;
}

// Stage 05's DDP whose buckets go through the hierarchical all-reduce; it owns the mesh the hook runs on.
class HierarchicalDdp : public BucketedDdp {
 public:
  HierarchicalDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, int nodes, double bucket_cap_mb)
      : BucketedDdp(pg, std::move(model), bucket_cap_mb),
        mesh_(std::make_unique<Mesh>(Mesh::make(pg, nodes))),
        hook_(std::make_unique<HierarchicalHook>(*mesh_)) {
    HierarchicalHook* hook = hook_.get();  // no bucket is launched once this object is gone
    register_comm_hook(
        [hook](ProcessGroup&, torch::Tensor& bucket, const std::string& label) { return hook->launch(bucket, label); });
  }

 private:
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<HierarchicalHook> hook_;  // after the mesh: its worker ends before the mesh's groups go
};

// Stage 07's FsdpStrategy with a mesh under it: the shards live in the node's group, the rest is the same.
class HsdpStrategy : public Strategy {
 public:
  HsdpStrategy(ProcessGroup& pg, int nodes, std::shared_ptr<torch::nn::Module> model, const MakeOptimizer& make,
               FsdpOptions opts, HsdpSync sync, const MakeHsdp& make_hsdp)
      : mesh_(Mesh::make(pg, nodes)),
        model_(model),
        opts_(opts),
        hsdp_ptr_(make_hsdp ? make_hsdp(mesh_, model, units_of(*model).units(), opts, sync)
                            : std::make_unique<Hsdp>(mesh_, model, units_of(*model).units(), opts, sync)),
        hsdp_(*hsdp_ptr_),
        opt_(make(hsdp_.parameters())) {
    if (!opt_) throw std::invalid_argument("hsdp_strategy: the MakeOptimizer returned no optimizer");
  }
  void zero_grad() override {
    opt_->zero_grad();
    calls_at_start_ = collectives();
    sent_at_start_ = sent();
  }
  UnitRunner runner() override { return hsdp_.runner(); }
  void set_requires_gradient_sync(bool sync) override { hsdp_.set_last_micro_batch(sync); }
  void after_backward() override { hsdp_.finish_gradient_synchronization(); }
  void step() override {
    clip_before_step();
    opt_->step();
    calls_ = collectives() - calls_at_start_;
    sent_ = sent() - sent_at_start_;
  }
  int64_t calls_per_step() const override { return calls_; }
  TrainingBytes bytes() const override { return count_training_bytes(hsdp_.parameters(), *opt_); }
  double sent_bytes_per_step() const override { return sent_; }
  double gathered_peak_bytes() const override { return static_cast<double>(hsdp_.peak_gathered_bytes()); }
  std::string describe() const override { return hsdp_.describe_hsdp(); }
  torch::ScalarType compute_dtype(const torch::nn::Module& m) const override { return compute_dtype_of(m, opts_); }
  // Every node holds the whole model in shards: gathering over the node's group is enough, and loading cuts
  // the node's shards, the same on every node.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override {
    return hsdp_.gather_full_parameters();
  }
  FullState full_state() override { return hsdp_.sharding().full_state(mesh_.intra(), *opt_); }
  void load_full_state(const FullState& s) override {
    check_full_state(*model_, s);
    hsdp_.sharding().load_full_state(s, mesh_.intra().rank(), *opt_);
  }
  std::vector<torch::optim::Optimizer*> optimizers() override { return {opt_.get()}; }
  // The shards split the model over the node's group and every node holds them again: the squares are summed
  // over the node's group only (over the world, each element would count once per node).
  GradientSpread gradient_spread() override { return sharded_spread(hsdp_.sharding(), mesh_.intra()); }

 private:
  int64_t collectives() const {
    return hsdp_.all_gathers() + hsdp_.reduce_scatters() + hsdp_.all_reduces() + hsdp_.inter_all_reduces();
  }
  double sent() const { return hsdp_.sent_bytes() + hsdp_.inter_sent_bytes(); }

  Mesh mesh_;  // first: the Hsdp uses its groups
  std::shared_ptr<torch::nn::Module> model_;
  FsdpOptions opts_;
  std::unique_ptr<Hsdp> hsdp_ptr_;
  Hsdp& hsdp_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
  int64_t calls_at_start_ = 0, calls_ = 0;
  double sent_at_start_ = 0, sent_ = 0;
};

}  // namespace

MakeStrategy hierarchical_ddp_strategy(int nodes, double bucket_cap_mb) {
  auto make = [nodes, bucket_cap_mb](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model) {
    return std::unique_ptr<GradSync>(std::make_unique<HierarchicalDdp>(pg, std::move(model), nodes, bucket_cap_mb));
  };
  return ddp_strategy(make, "bucketed DDP, hierarchical all-reduce");
}

MakeStrategy hsdp_strategy(int nodes, FsdpOptions opts, HsdpSync sync, MakeHsdp make_hsdp) {
  return [nodes, opts, sync, make_hsdp](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                                        const MakeOptimizer& make) -> std::unique_ptr<Strategy> {
    return std::make_unique<HsdpStrategy>(pg, nodes, std::move(model), make, opts, sync, make_hsdp);
  };
}

}  // namespace dp
