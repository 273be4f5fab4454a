#include "tests/support/fixtures.hpp"
#include "common/model/params.hpp"

#include "tests/support/ranks.hpp"

#include <mutex>

namespace dp::testing {

LocalMlp make_local(int rank) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(100 + rank);
  return {std::make_shared<ToyMLPImpl>(), torch::randn({8, kToyIn})};
}

std::shared_ptr<ToyMLPImpl> copy_of(const ToyMLPImpl& src) {
  std::shared_ptr<ToyMLPImpl> dst;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    dst = std::make_shared<ToyMLPImpl>();
  }
  copy_parameters(*dst, src);
  return dst;
}

}  // namespace dp::testing
