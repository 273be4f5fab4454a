#include "common/model/units.hpp"

#include "common/model/params.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

namespace dp {

std::vector<std::vector<UnitParameter>> unit_parameters(const torch::nn::Module& model, const ModuleUnits& units,
                                                        const std::string& who) {
  std::unordered_map<const void*, size_t> owner;  // parameter -> its unit
  std::vector<std::vector<UnitParameter>> out(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    for (const auto& top : units[u])
      for (const auto& m : top->modules(/*include_self=*/true))
        for (const auto& item : m->named_parameters(/*recurse=*/false)) {
          const torch::Tensor& p = item.value();
          if (!p.requires_grad()) continue;  // frozen tensors are the wrapper's to leave alone
          auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), u);
          if (!fresh && it->second == u) continue;  // tied within the unit: once
          if (!fresh)
            throw std::invalid_argument(fmt::format("{}: a parameter is in units {} and {}", who, it->second, u));
          out[u].push_back({p, m.get()});
        }
  for (const auto& [name, p] : unique_named_parameters(model, /*trainable_only=*/true))
    if (!owner.count(p.unsafeGetTensorImpl()))
      throw std::invalid_argument(who + ": parameter " + name + " belongs to no unit");
  return out;
}

std::vector<TensorUnit> tensor_units(const std::shared_ptr<torch::nn::Module>& model, const ModuleUnits& units,
                                     const std::function<bool(const torch::nn::Module&)>& is_sharded,
                                     const std::string& who) {
  if (!model || units.empty()) throw std::invalid_argument(who + ": a model with at least one unit is needed");
  const auto owned = unit_parameters(*model, units, who);
  std::vector<TensorUnit> out(units.size());
  for (size_t u = 0; u < units.size(); ++u)
    for (const auto& [p, m] : owned[u]) (is_sharded(*m) ? out[u].sharded : out[u].replicated).push_back(p);
  return out;
}

}  // namespace dp
