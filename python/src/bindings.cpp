// The Python package's C++ module, ddp_from_scratch._C: the stages' own classes, reached from Python.
//
// It only converts and forwards. Python's nn.Module arrives as its named parameters and buffers (the tensors
// themselves, so the stages' hooks sit on the AccumulateGrad nodes of the Python parameters); Python's default
// process group arrives as its c10d backend object, which dp::ProcessGroup::adopt() wraps. Every algorithm is
// the stages' (04 OverlapDdp, 05 BucketedDdp, 06b ShardedOptimizer, 07 Fsdp). Calls that communicate release the GIL:
// the collectives' threads and autograd's never need it.
#include "common/base/c10d_compat.hpp"
#include "common/base/errors.hpp"
#include "common/dist/dist.hpp"
#include "common/model/params.hpp"
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// [adopt]
// Python's process group, as the C++ classes take it. `backend` is the c10d object that runs the collectives:
// on LibTorch 2.x the default group's Backend (pg._get_backend(device)), on 1.13 the ProcessGroupGloo itself.
// A raw pointer, then a reference taken on it: that works whatever holder type torch gave the Python class.
std::shared_ptr<dp::ProcessGroup> adopt(py::handle backend, int rank, int world_size, const std::string& name,
                                        const std::string& device) {
  auto* raw = py::cast<dp::compat::CommBase*>(backend);
  auto comm = std::make_shared<dp::compat::CommPtr>(dp::compat::CommPtr::unsafe_reclaim_from_nonowning(raw));
  return std::make_shared<dp::ProcessGroup>(
      dp::ProcessGroup::adopt(comm, rank, world_size, name, torch::Device(device)));
}
// [adopt]

dp::ModelTensors model_of(const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
                          const std::vector<at::Tensor>& buffers) {
  if (names.size() != params.size())
    throw dp::UsageError("model_of: " + std::to_string(names.size()) + " names for " + std::to_string(params.size()) +
                         " parameters");
  dp::ModelTensors model;
  for (size_t i = 0; i < names.size(); ++i) model.parameters.emplace_back(names[i], params[i]);
  model.buffers = buffers;
  return model;
}

// The bucket assignment as parameter names, bucket 0 (launched first) first.
std::vector<std::vector<std::string>> bucket_names(const dp::BucketedDdp& ddp) {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : ddp.buckets()) {
    out.emplace_back();
    for (size_t i : bucket) out.back().push_back(ddp.parameter_names()[i]);
  }
  return out;
}

torch::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return torch::kFloat32;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kHalf;
  throw dp::UsageError("compute dtype " + name + ": use torch.float32, torch.bfloat16 or torch.float16");
}

// One unit per sharded tensor (its shard is then that tensor's own); the replicated tensors ride with the last.
std::shared_ptr<dp::Fsdp> make_fsdp(dp::ProcessGroup& pg, const std::vector<std::string>& names,
                                    const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& buffers,
                                    const std::vector<at::Tensor>& sharded, const std::vector<at::Tensor>& replicated,
                                    const std::string& compute_dtype, bool reshard_after_forward) {
  if (sharded.empty()) throw dp::UsageError("Fsdp: no tensor to shard");
  std::vector<dp::TensorUnit> units;
  for (const auto& t : sharded) units.push_back({{t}, {}});
  units.back().replicated = replicated;
  dp::FsdpOptions opts;
  opts.compute_dtype = dtype_named(compute_dtype);
  opts.reshard_after_forward = reshard_after_forward;
  return std::make_shared<dp::Fsdp>(pg, model_of(names, params, buffers), std::move(units), opts);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "The C++ stages of ddp_from_scratch: use the classes of the ddp_from_scratch package, not these";
  // Bad input is ValueError in Python, as in PyTorch (a wrong option, a model that differs between ranks).
  py::register_exception<dp::UsageError>(m, "UsageError", PyExc_ValueError);
  m.attr("TORCH_VERSION") = TORCH_VERSION;  // the LibTorch this module was compiled against

  py::class_<dp::ProcessGroup, std::shared_ptr<dp::ProcessGroup>>(m, "ProcessGroup")
      .def(py::init(&adopt), py::arg("backend"), py::arg("rank"), py::arg("world_size"), py::arg("name"),
           py::arg("device"))
      .def_property_readonly("rank", &dp::ProcessGroup::rank)
      .def_property_readonly("world_size", &dp::ProcessGroup::world_size);

  // keep_alive<1, 2>: the engine holds the group by reference, so the group lives as long as the engine.
  py::class_<dp::OverlapDdp, std::shared_ptr<dp::OverlapDdp>>(m, "OverlapDdp")
      .def(py::init([](dp::ProcessGroup& pg, const std::vector<std::string>& names,
                       const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& buffers) {
             return std::make_shared<dp::OverlapDdp>(pg, model_of(names, params, buffers));
           }),
           py::keep_alive<1, 2>(), py::call_guard<py::gil_scoped_release>())
      .def("on_train_batch_start", &dp::OverlapDdp::on_train_batch_start)
      .def("finish_gradient_synchronization", &dp::OverlapDdp::finish_gradient_synchronization,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("parameter_names", &dp::OverlapDdp::parameter_names)
      .def_property_readonly("launched_count", &dp::OverlapDdp::launched_count)
      .def_property_readonly("calls_per_step", &dp::OverlapDdp::calls_per_step);

  // [bucketed]
  py::class_<dp::BucketedDdp, std::shared_ptr<dp::BucketedDdp>>(m, "BucketedDdp")
      .def(py::init([](dp::ProcessGroup& pg, const std::vector<std::string>& names,
                       const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& buffers, double cap_mb) {
             return std::make_shared<dp::BucketedDdp>(pg, model_of(names, params, buffers), cap_mb);
           }),
           py::keep_alive<1, 2>(), py::call_guard<py::gil_scoped_release>())
      .def("on_train_batch_start", &dp::BucketedDdp::on_train_batch_start)
      .def("finish_gradient_synchronization", &dp::BucketedDdp::finish_gradient_synchronization,
           py::call_guard<py::gil_scoped_release>())
      .def("set_requires_gradient_sync", &dp::BucketedDdp::set_requires_gradient_sync)
      .def_property_readonly("requires_gradient_sync", &dp::BucketedDdp::requires_gradient_sync)
      .def_property_readonly("buckets", &bucket_names)
      .def_property_readonly("bucket_cap_mb", &dp::BucketedDdp::bucket_cap_mb)
      .def_property_readonly("launched_count", &dp::BucketedDdp::launched_count)
      .def("describe_buckets", &dp::BucketedDdp::describe_buckets);
  // [bucketed]

  // Built without a local optimizer: Python steps the owned tensors with any torch.optim class, then calls
  // broadcast_from_owners() (extension 06b's step is exactly these two halves).
  py::class_<dp::ShardedOptimizer, std::shared_ptr<dp::ShardedOptimizer>>(m, "ShardedOptimizer")
      .def(py::init([](dp::ProcessGroup& pg) {
             return std::make_shared<dp::ShardedOptimizer>(pg, std::vector<torch::optim::OptimizerParamGroup>{},
                                                           dp::MakeOptimizer{});
           }),
           py::keep_alive<1, 2>())
      // The same with LibTorch's C++ AdamW stepping the owned tensors (step() below): what the suite compares
      // with Python's AdamW, to see whether the two do the same arithmetic on this torch.
      .def_static(
          "with_cpp_adamw",
          [](dp::ProcessGroup& pg, double lr, double beta1, double beta2, double eps, double weight_decay) {
            const auto opts = torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay);
            return std::make_shared<dp::ShardedOptimizer>(
                dp::ShardedOptimizer::make<torch::optim::AdamW>(pg, std::vector<torch::Tensor>{}, opts));
          },
          py::keep_alive<0, 1>())
      .def("step", &dp::ShardedOptimizer::step, py::call_guard<py::gil_scoped_release>())
      .def("add_param_group",
           [](dp::ShardedOptimizer& self, const std::vector<at::Tensor>& params) {
             self.add_param_group(torch::optim::OptimizerParamGroup(params));
           })
      .def("owner_of", &dp::ShardedOptimizer::owner_of)
      .def("broadcast_from_owners", &dp::ShardedOptimizer::broadcast_from_owners,
           py::call_guard<py::gil_scoped_release>())
      .def("describe", &dp::ShardedOptimizer::describe);

  // Python's forward runs each sharded module through run_unit(u, body): the stage's gather before, free after,
  // and the hook that gathers again when backward reaches the unit.
  py::class_<dp::Fsdp, std::shared_ptr<dp::Fsdp>>(m, "Fsdp")
      .def(py::init(&make_fsdp), py::keep_alive<1, 2>(), py::call_guard<py::gil_scoped_release>())
      .def("run_unit",
           [](dp::Fsdp& self, size_t unit, const py::function& body) {
             return self.runner()(unit, [&body] { return body().cast<at::Tensor>(); });
           })
      .def("finish_gradient_synchronization", &dp::Fsdp::finish_gradient_synchronization,
           py::call_guard<py::gil_scoped_release>())
      .def("shard",
           [](const dp::Fsdp& self, size_t unit) {
             auto groups = self.sharding().groups;
             if (unit >= groups.size()) throw py::index_error("Fsdp.shard: no unit " + std::to_string(unit));
             return groups[unit].chunk;
           })
      .def("gather_full_parameters", &dp::Fsdp::gather_full_parameters, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("all_gathers", &dp::Fsdp::all_gathers)
      .def_property_readonly("reduce_scatters", &dp::Fsdp::reduce_scatters)
      .def_property_readonly("gathered_bytes", &dp::Fsdp::gathered_bytes)
      .def_property_readonly("peak_gathered_bytes", &dp::Fsdp::peak_gathered_bytes)
      .def("describe", &dp::Fsdp::describe);
}
