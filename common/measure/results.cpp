// Results: JSON for scripts and plots, Markdown for people.
#include "common/measure/results.hpp"

#ifdef DP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "common/dist/dist.hpp"
#include "common/dist/launch_env.hpp"

#include <torch/version.h>

#include <fmt/format.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace dp {

Results::Results(std::string benchmark) : benchmark_(std::move(benchmark)) {}

void Results::add(nlohmann::json row) { rows_.push_back(std::move(row)); }

void Results::write_json(const std::string& path, const std::string& command) const {
  // Every row carries its command and machine too: files merged from several runs (other world sizes,
  // other links) stay self-describing row by row.
  std::vector<nlohmann::json> rows = rows_;
  for (auto& r : rows) {
    if (!r.contains("command")) r["command"] = command;
    if (!r.contains("machine")) r["machine"] = machine_description();
  }
  nlohmann::json doc = {
      {"benchmark", benchmark_}, {"machine", machine_description()}, {"command", command}, {"rows", rows}};
  doc.update(meta);
  // Write next to the target and rename: readers never see a half-written file.
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw std::runtime_error("cannot write " + tmp);
    f << doc.dump(2) << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

std::string Results::markdown(const std::vector<std::string>& keys, const std::vector<std::string>& headers,
                              int precision) const {
  std::ostringstream out;
  out << "|";
  for (auto& h : headers) out << " " << h << " |";
  out << "\n|";
  for (size_t i = 0; i < headers.size(); ++i) out << "---|";
  out << "\n";
  for (auto& row : rows_) {
    out << "|";
    for (auto& k : keys) {
      const auto it = row.find(k);
      std::string cell;
      if (it == row.end() || it->is_null())
        cell = "-";
      else if (it->is_number_float() && std::abs(it->get<double>()) >= std::pow(10.0, precision))
        cell = fmt::format("{:.0f}", it->get<double>());  // 2250, not 2.25e+03
      else if (it->is_number_float())
        cell = fmt::format("{:.{}g}", it->get<double>(), precision);
      else if (it->is_string())
        cell = it->get<std::string>();
      else if (it->is_boolean())
        cell = it->get<bool>() ? "yes" : "no";
      else
        cell = it->dump();
      out << " " << cell << " |";
    }
    out << "\n";
  }
  return out.str();
}

std::string machine_description() {
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  std::string gpu;
#ifdef DP_WITH_CUDA
  // A CUDA build on a machine with a GPU: the figures may be the GPU's, so name it.
  if (torch::cuda::is_available()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(0);
    gpu = fmt::format("; GPU {} x {} ({:.0f} GiB)", torch::cuda::device_count(), p->name,
                      p->totalGlobalMem / static_cast<double>(1 << 30));
  }
#endif
  return fmt::format("{}, {} cores, {:.0f} GiB RAM, LibTorch {}{}", cpu, std::thread::hardware_concurrency(),
                     pages * static_cast<double>(page) / (1 << 30), TORCH_VERSION, gpu);
}

std::string link_description() {
  const LaunchEnv env = LaunchEnv::from_environment();
  if (!env.net.empty() && env.net_nodes > 0)  // ddp_launch --net-nodes: two tiers
    return fmt::format("simulated {} link per rank, {} nodes joined by {} uplinks", env.net, env.net_nodes,
                       env.net_uplink);
  if (!env.net.empty()) return fmt::format("simulated {} link per rank", env.net);
  return env.single_node() ? "loopback" : "network";
}

std::string command_line(int argc, char** argv) {
  // Started by ddp_launch: record the whole launcher command (ranks, --net, ...), which is what a
  // reader must type to reproduce the numbers.
  if (auto launch = LaunchEnv::from_environment().launch_command; !launch.empty()) return launch;
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    bool quote = a.find_first_of(" \t'\"$") != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  return s;
}

}  // namespace dp
