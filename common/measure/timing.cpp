// Timing helpers. The rule from every good benchmark: warm up, synchronize the device before reading
// the clock, report the median, and let the slowest rank set the pace.
#include "common/measure/timing.hpp"

#include "common/base/log.hpp"
#include "common/dist/dist.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#ifdef DP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#endif

namespace dp {

void sync_device(const torch::Device& device) {
#ifdef DP_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
}

void Timer::start() {
  sync_device(device_);
  t0_ = std::chrono::steady_clock::now();
}

double Timer::seconds() const {
  sync_device(device_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

double log_log_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0, sxy = 0, sxx = 0;
  const double n = static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    mx += std::log(x[i]) / n;
    my += std::log(y[i]) / n;
  }
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (std::log(x[i]) - mx) * (std::log(y[i]) - my);
    sxx += (std::log(x[i]) - mx) * (std::log(x[i]) - mx);
  }
  return sxx > 0 ? sxy / sxx : 0;
}

Stats summarize(std::vector<double> xs) {
  Stats s;
  s.n = static_cast<int>(xs.size());
  if (xs.empty()) return s;
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  s.median = n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
  s.min = xs.front();
  s.max = xs.back();
  s.mean = std::accumulate(xs.begin(), xs.end(), 0.0) / n;
  return s;
}

std::vector<double> max_over_ranks(ProcessGroup& pg, const std::vector<double>& per_iter) {
  auto all = pg.all_gather(per_iter);  // [world][iters]
  std::vector<double> out(per_iter.size(), 0.0);
  for (auto& r : all)
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], r[i]);
  return out;
}

#ifdef DP_WITH_CUDA
// One iteration timed by two CUDA events on the current stream of `device`. A blocking collective
// (Work::wait()) makes that stream wait for the communication stream, so the stop event completes when
// the collective does: GPU time, with no device-wide synchronize between start and stop.
static double cuda_event_seconds(const std::function<void()>& fn, const torch::Device& device) {
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing enabled
  auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  start.record(stream);
  fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / 1e3;  // ms -> s
}
#endif

std::vector<double> time_iterations(const std::function<void()>& fn, int warmup, int iters, double budget_s,
                                    torch::Device device) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
#ifdef DP_WITH_CUDA
  if (device.is_cuda()) {
    sync_device(device);  // warm-up work out of the way, once
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      times.push_back(cuda_event_seconds(fn, device));
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > budget_s) break;
    }
    return times;
  }
#endif
  Timer total(device);
  for (int i = 0; i < iters; ++i) {
    Timer t(device);
    fn();
    times.push_back(t.seconds());
    if (total.seconds() > budget_s) break;
  }
  return times;
}

double CommModel::best_bucket_cap_mb(double grad_bytes) const {
  return std::sqrt(grad_bytes * w * std::max(o, 1e-9)) / 1e6;
}

// The slowest rank's median time of one all-reduce of `bytes` (fp32 elements), over as many samples as
// every rank took.
static double median_allreduce_s(ProcessGroup& pg, int64_t bytes) {
  auto t = torch::zeros({bytes / 4}, torch::TensorOptions().device(pg.device()));
  auto mine = time_iterations([&] { pg.all_reduce(t); }, 3, 15, 5.0, pg.device());
  auto counts = pg.all_gather(static_cast<double>(mine.size()));
  mine.resize(static_cast<size_t>(*std::min_element(counts.begin(), counts.end())));
  return summarize(max_over_ranks(pg, mine)).median;
}

CommModel measure_comm_model(ProcessGroup& pg) {
  // [model]
  const double small = 4e3, large = 32e6;  // bytes
  const double t_small = median_allreduce_s(pg, static_cast<int64_t>(small));
  const double t_large = median_allreduce_s(pg, static_cast<int64_t>(large));
  CommModel m;
  m.o = t_small;
  m.w = (large - small) / std::max(t_large - t_small, 1e-9);
  // [model]
  return m;
}

double bus_bandwidth_alone(ProcessGroup& world, ProcessGroup& group, bool member, double bytes, int rounds) {
  torch::Tensor t = torch::ones({static_cast<int64_t>(bytes / 4)}, torch::TensorOptions().device(world.device()));
  std::vector<double> times;
  for (int i = 0; i <= rounds; ++i) {  // round 0 is the warm-up
    world.barrier();                   // nobody else is on the links while the members run
    Timer timer(world.device());
    if (member) group.all_reduce(t, "bus bandwidth");
    const auto all = world.all_gather(timer.seconds());
    if (i > 0) times.push_back(*std::max_element(all.begin(), all.end()));
  }
  const int n = group.world_size();
  return 2.0 * (n - 1) / n * bytes * 8 / summarize(times).median;
}

nlohmann::json measure_tiers(Mesh& mesh, double bytes) {
  const LaunchEnv env = LaunchEnv::from_environment();
  nlohmann::json tiers = nlohmann::json::object();
  auto line = [&](const char* where, int n, double bit_s, double link_bit_s, const std::string& link) {
    print0("{}: {} ranks, {:.2f} Gbit/s bus bandwidth{}", where, n, bit_s / 1e9,
           link_bit_s > 0 ? fmt::format(" = {:.2f} of the {} link", bit_s / link_bit_s, link) : " (loopback)");
    tiers[where] = {{"ranks", n}, {"busbw_bit_s", bit_s}, {"link_bit_s", link_bit_s}};
  };
  if (mesh.per_node() > 1) {
    const double b = bus_bandwidth_alone(mesh.world(), mesh.intra(), mesh.node() == 0, bytes);
    line("inside a node", mesh.per_node(), b, env.net_bit_s, env.net);
  }
  if (mesh.nodes() > 1) {
    const double b = bus_bandwidth_alone(mesh.world(), mesh.inter(), mesh.local() == 0, bytes);
    line("across nodes", mesh.nodes(), b, env.net_uplink_bit_s, env.net_uplink);
  }
  return tiers;
}

}  // namespace dp
