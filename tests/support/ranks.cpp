#include "tests/support/ranks.hpp"

#include "common/model/models.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include "common/base/libtorch.hpp"

#include <exception>
#include <thread>
#include <vector>

namespace dp::testing {

std::mutex& rng_mutex() { return model_init_mutex(); }

bool gpu_visible() { return cuda_build() && torch::cuda::is_available(); }

void run_ranks(int world, const std::function<void(ProcessGroup&)>& fn, std::chrono::milliseconds timeout,
               const std::string& device) {
  torch::set_num_threads(1);  // W ranks share 2 cores
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = ProcessGroup::init_with_store(store, r, world, {"gloo", timeout, device});
        fn(pg);
        pg.barrier();  // nobody tears down the group while a peer still talks to it
        pg.shutdown();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

bool same_on_all_ranks(ProcessGroup& pg, const torch::Tensor& t) {
  bool same = true;
  for (auto& other : pg.all_gather(t.contiguous())) same = same && torch::equal(other, t);
  return same;
}

}  // namespace dp::testing
