#include "extensions/05a_comm_hooks/low_precision_hooks.hpp"

#include "common/dist/runtime.hpp"

#include <fmt/format.h>
#include <torch/version.h>

#include <stdexcept>

namespace dp {

CommHook low_precision_hook(torch::ScalarType dtype) {
  if (dtype != torch::kHalf && dtype != torch::kBFloat16)
    throw std::invalid_argument("low_precision_hook: dtype must be kHalf or kBFloat16");
  // [fp16_hook]
  return [dtype](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    // [n] fp32 -> [n] 16-bit: each element rounded to nearest; 2 bytes per element on the wire, not 4.
    // The copy is owned by the lambda below, so it lives until the collective has completed.
    auto low = bucket.to(dtype);
    BucketWork w;
    w.work = pg.all_reduce_async(low, label + (dtype == torch::kHalf ? " (fp16)" : " (bf16)"));
    w.wire_bytes = low.numel() * static_cast<int64_t>(low.element_size());
    const int world = pg.world_size();
    w.then = [bucket, low, world]() mutable {
      bucket.copy_(low);   // the 16-bit sum, widened exactly into the fp32 bucket
      bucket.div_(world);  // divided in fp32: exact for world = 2, 4, 8, ...
    };
    return w;
  };
  // [fp16_hook]
}

std::vector<std::string> comm_hook_names() { return {"allreduce", "fp16", "bf16"}; }

bool backend_sums(ProcessGroup& pg, torch::ScalarType dtype) {
  // Every rank runs the same backend, so every rank fails (or succeeds) alike: a backend without the
  // dtype refuses it locally before sending anything (Gloo 1.13: "Invalid scalar type"), and the ranks'
  // sequences of collectives stay aligned.
  auto probe = torch::ones({1}, torch::TensorOptions().dtype(dtype).device(pg.device()));
  try {
    pg.all_reduce(probe, "dtype probe");
  } catch (const std::exception&) {
    return false;
  }
  return probe.to(torch::kFloat64).item<double>() == pg.world_size();
}

CommHook make_comm_hook(const std::string& name, ProcessGroup& pg) {
  if (name == "allreduce") return allreduce_hook();
  if (name == "fp16" || name == "bf16") {
    const auto dtype = name == "fp16" ? torch::kHalf : torch::kBFloat16;
    if (!backend_sums(pg, dtype))
      throw UsageError(
          fmt::format("communication hook '{}': the {} backend of this LibTorch ({}) cannot all-reduce {} tensors{}; "
                      "use --comm-hook allreduce{}",
                      name, pg.backend(), TORCH_VERSION, name,
                      name == "bf16" ? " (Gloo has bf16 collectives from LibTorch 2.x on, NCCL always)" : "",
                      name == "bf16" ? " or fp16" : ""));
    return low_precision_hook(dtype);
  }
  throw UsageError(fmt::format("unknown communication hook '{}': use allreduce, fp16 or bf16", name));
}

}  // namespace dp
