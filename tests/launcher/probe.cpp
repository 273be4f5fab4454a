// launch_probe: a stand-in "training program" for the launcher tests. No torch: it only reads the
// environment the launcher gave it and misbehaves on request.
//
//   launch_probe env                 print the contract's variables (and --net's) as KEY=VALUE lines
//   launch_probe exit R C            rank R says so on stderr, exits with code C; the others sleep 60 s
//   launch_probe kill R              rank R sends itself SIGKILL; the other ranks sleep 60 s
//   launch_probe stubborn R C        like exit, but the other ranks (and children) ignore SIGTERM
//   launch_probe refuse R C S        rank R exits with code C at once; the others ignore SIGTERM and
//                                    after S seconds refuse their input: a message, exit code 2
//   launch_probe spawn               fork a grandchild that sleeps 60 s, then sleep 60 s
//   launch_probe straggler           fork a grandchild that sleeps 60 s, then exit 0 at once
//   launch_probe sleep S             sleep S seconds, exit 0
//   launch_probe partial             print a line without the final newline
//   launch_probe lines               print to stdout and stderr, one line with its own [rank tag
//   launch_probe net [S]             (for --net) print GLOO_SOCKET_IFNAME, MASTER_ADDR, DP_NET, its
//                                    interfaces (IFACES=lo,dpnet0) and their IPv4 address (ADDR=ip/len);
//                                    rank 0 accepts a TCP connection from every other rank on
//                                    MASTER_ADDR:MASTER_PORT and prints their source addresses (PEERS=),
//                                    the others print CONNECT_MS= (one round trip); then each rank
//                                    writes rank<R>.pid and sleeps S seconds (default 0). Exit 3 on failure.
//   launch_probe stream FROM TO MB   (for --net) rank FROM sends MB megabytes (10^6 B) over one TCP connection
//                                    to rank TO (at MASTER_ADDR + TO, port MASTER_PORT + 1), which prints
//                                    STREAM_MBIT= (the rate of the last 90% of the bytes, in Mbit/s) and
//                                    STREAM_BYTES=; the other ranks exit 0. Exit 3 on failure.
//   launch_probe elastic R S [C]     (for --elastic) print DP_ELASTIC_STORE, DP_ELASTIC_MIN and DP_RESTART;
//                                    rank R's first process kills itself (SIGKILL); every other process,
//                                    replacements included, sleeps S seconds and exits with C (default 0)
//   launch_probe stopself R S        rank R stops itself (SIGSTOP); the others sleep S seconds, exit 0
//   launch_probe cpus                print the cores it may run on (CPUS=0,1, from sched_getaffinity),
//                                    DP_CPUS_PER_RANK and OMP_NUM_THREADS
//   launch_probe blas                load OpenBLAS (libopenblas.so.0) as a program that multiplies matrices
//                                    would, print OPENBLAS_CORETYPE, the kernels it chose (BLAS_CORE=, "none"
//                                    without OpenBLAS) and whether the CPU has AVX2 and FMA (AVX2=1)
//
// exit, kill, stubborn, spawn and straggler fork a grandchild in every rank. If PROBE_PID_DIR is set,
// each rank writes rank<R>.pid and grandchild<R>.pid there, so a test can check afterwards that all
// of them are gone; the failing rank fails only once every rank has written both files, so no process
// can be missed.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

int env_int(const char* key) {
  const char* v = std::getenv(key);
  return v ? std::atoi(v) : 0;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Written to a temporary name and renamed, so a reader never sees a half-written pid.
void record_pid(const std::string& name, pid_t pid) {
  const char* dir = std::getenv("PROBE_PID_DIR");
  if (!dir) return;
  const std::string final_path = std::string(dir) + "/" + name + ".pid";
  const std::string tmp = final_path + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(pid));
    std::fclose(f);
    std::rename(tmp.c_str(), final_path.c_str());
  }
}

int count_pid_files() {
  const char* dir = std::getenv("PROBE_PID_DIR");
  DIR* d = dir ? ::opendir(dir) : nullptr;
  if (!d) return 0;
  int n = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".pid") == 0) ++n;
  }
  ::closedir(d);
  return n;
}

// Each rank forks one grandchild that just sleeps: the launcher must take it down with the rank.
void spawn_grandchild(int rank) {
  const pid_t child = ::fork();
  if (child == 0) {
    sleep_s(60);
    ::_exit(0);
  }
  record_pid("grandchild" + std::to_string(rank), child);
  record_pid("rank" + std::to_string(rank), ::getpid());
}

// The failing rank waits (at most 10 s) until every rank and grandchild has recorded its pid.
void wait_for_everyone(int world) {
  if (!std::getenv("PROBE_PID_DIR")) return;
  for (int i = 0; i < 1000 && count_pid_files() < 2 * world; ++i) sleep_s(0.01);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// `probe net`: what the rank sees of its network namespace, and one TCP connection to rank 0.
int net_mode(int rank, int world, double hold_s) {
  for (const char* key : {"GLOO_SOCKET_IFNAME", "MASTER_ADDR", "DP_NET"}) {
    const char* v = std::getenv(key);
    std::printf("%s=%s\n", key, v ? v : "<unset>");
  }
  std::set<std::string> names;
  std::string addr = "<none>";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      names.insert(a->ifa_name);
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || std::string(a->ifa_name) == "lo") continue;
      char text[INET_ADDRSTRLEN];
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
      ::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
      addr = std::string(text) + "/" + std::to_string(__builtin_popcount(mask ? mask->sin_addr.s_addr : 0));
    }
    ::freeifaddrs(list);
  }
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : ",") + n;
  std::printf("IFACES=%s\nADDR=%s\n", joined.c_str(), addr.c_str());
  std::fflush(stdout);

  sockaddr_in master{};
  master.sin_family = AF_INET;
  master.sin_port = htons(static_cast<uint16_t>(env_int("MASTER_PORT")));
  const char* master_addr = std::getenv("MASTER_ADDR");
  if (!master_addr || ::inet_pton(AF_INET, master_addr, &master.sin_addr) != 1) return 3;
  auto* sa = reinterpret_cast<sockaddr*>(&master);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rank == 0) {
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, sa, sizeof(master)) != 0 || ::listen(fd, 64) != 0) {
      std::fprintf(stderr, "probe: cannot listen on %s: %s\n", master_addr, std::strerror(errno));
      return 3;
    }
    std::vector<std::string> peers;
    const double deadline = now_s() + 20;
    while (static_cast<int>(peers.size()) < world - 1 && now_s() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      const int c = ::accept(fd, reinterpret_cast<sockaddr*>(&peer), &len);
      if (c < 0) continue;
      char text[INET_ADDRSTRLEN];
      peers.push_back(::inet_ntop(AF_INET, &peer.sin_addr, text, sizeof(text)));
      ::close(c);
    }
    std::string all;
    for (const auto& p : std::set<std::string>(peers.begin(), peers.end())) all += (all.empty() ? "" : ",") + p;
    std::printf("PEERS=%s\n", all.c_str());
    if (static_cast<int>(peers.size()) < world - 1) return 3;
  } else {
    bool connected = false;
    double took = 0;
    for (const double deadline = now_s() + 20; !connected && now_s() < deadline;) {
      const int c = ::socket(AF_INET, SOCK_STREAM, 0);
      const double t0 = now_s();
      connected = ::connect(c, sa, sizeof(master)) == 0;  // rank 0 may not listen yet: retry
      took = now_s() - t0;
      ::close(c);
      if (!connected) sleep_s(0.02);
    }
    if (!connected) {
      std::fprintf(stderr, "probe: rank %d cannot connect to %s\n", rank, master_addr);
      return 3;
    }
    std::printf("CONNECT_MS=%.3f\n", took * 1e3);
  }
  ::close(fd);
  std::fflush(stdout);
  record_pid("rank" + std::to_string(rank), ::getpid());
  sleep_s(hold_s);
  return 0;
}

// `probe stream`: one bulk TCP transfer between two ranks, timed where it arrives. The first 10% of the bytes
// are left out of the rate: TCP's slow start and the token bucket's initial burst are not the link's rate.
int stream_mode(int rank, int from, int to, double mb) {
  if (rank != from && rank != to) return 0;
  const char* master_addr = std::getenv("MASTER_ADDR");
  in_addr base{};
  if (!master_addr || ::inet_pton(AF_INET, master_addr, &base) != 1) return 3;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(static_cast<uint16_t>(env_int("MASTER_PORT") + 1));
  const auto total = static_cast<std::size_t>(mb * 1e6);
  std::vector<char> buf(1 << 20, 'x');
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rank == to) {
    peer.sin_addr.s_addr = htonl(INADDR_ANY);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0 || ::listen(fd, 4) != 0) {
      std::fprintf(stderr, "probe: cannot listen: %s\n", std::strerror(errno));
      return 3;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20000) <= 0) return 3;
    const int c = ::accept(fd, nullptr, nullptr);
    if (c < 0) return 3;
    std::size_t got = 0, mark_bytes = 0;
    double mark = 0, last = 0;
    for (ssize_t n; (n = ::read(c, buf.data(), buf.size())) > 0;) {
      got += static_cast<std::size_t>(n);
      last = now_s();
      if (mark == 0 && got >= total / 10) mark = last, mark_bytes = got;
    }
    ::close(c);
    std::printf("STREAM_BYTES=%zu\nSTREAM_MBIT=%.1f\n", got,
                last > mark && mark > 0 ? static_cast<double>(got - mark_bytes) * 8 / (last - mark) / 1e6 : 0.0);
    ::close(fd);
    return got == total ? 0 : 3;
  }
  peer.sin_addr.s_addr = htonl(ntohl(base.s_addr) + static_cast<uint32_t>(to));
  bool connected = false;
  for (const double deadline = now_s() + 20; !connected && now_s() < deadline;) {
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) == 0;
    if (!connected) {  // the receiver may not listen yet: retry on a fresh socket
      ::close(fd);
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sleep_s(0.02);
    }
  }
  if (!connected) {
    std::fprintf(stderr, "probe: rank %d cannot connect to rank %d\n", rank, to);
    return 3;
  }
  for (std::size_t sent = 0; sent < total;) {
    const ssize_t n = ::write(fd, buf.data(), std::min(buf.size(), total - sent));
    if (n <= 0) return 3;
    sent += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = env_int("RANK");
  const int world = env_int("WORLD_SIZE");
  const auto arg = [&](int i) { return argc > i ? std::atoi(argv[i]) : 0; };

  if (mode == "env") {
    for (const char* key : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                            "MASTER_PORT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "DP_LAUNCHER",
                            "GLOO_SOCKET_IFNAME", "DP_NET", "DP_NET_NODES", "DP_NET_UPLINK", "DP_NET_UPLINK_BIT_S"}) {
      const char* v = std::getenv(key);
      std::printf("%s=%s\n", key, v ? v : "<unset>");
    }
    return 0;
  }
  if (mode == "cpus") {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::string cpus;
    if (::sched_getaffinity(0, sizeof(set), &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    const char* k = std::getenv("DP_CPUS_PER_RANK");
    const char* t = std::getenv("OMP_NUM_THREADS");
    std::printf("CPUS=%s\nDP_CPUS_PER_RANK=%s\nOMP_NUM_THREADS=%s\n", cpus.c_str(), k ? k : "<unset>",
                t ? t : "<unset>");
    return 0;
  }
  if (mode == "blas") {
    const char* core = std::getenv("OPENBLAS_CORETYPE");
    std::printf("OPENBLAS_CORETYPE=%s\n", core ? core : "<unset>");
    std::string chosen = "none";
    if (void* lib = ::dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL)) {
      if (auto f = reinterpret_cast<char* (*)()>(::dlsym(lib, "openblas_get_corename"))) chosen = f();
      ::dlclose(lib);
    }
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    std::printf("BLAS_CORE=%s\nAVX2=%d\n", chosen.c_str(), avx2 ? 1 : 0);
    return 0;
  }
  if (mode == "elastic" || mode == "stopself") {
    const auto show = [](const char* key) {
      const char* v = std::getenv(key);
      return v ? v : "<unset>";
    };
    std::printf("STORE=%s MIN=%s RESTART=%s\n", show("DP_ELASTIC_STORE"), show("DP_ELASTIC_MIN"), show("DP_RESTART"));
    std::fflush(stdout);
    record_pid("rank" + std::to_string(rank) + "." + show("DP_RESTART"), ::getpid());
    if (rank == arg(2) && env_int("DP_RESTART") == 0) std::raise(mode == "elastic" ? SIGKILL : SIGSTOP);
    sleep_s(argc > 3 ? std::atof(argv[3]) : 0);
    return arg(4);
  }
  if (mode == "exit" || mode == "kill" || mode == "stubborn") {
    const int failing = arg(2);
    if (mode == "stubborn" && rank != failing) std::signal(SIGTERM, SIG_IGN);  // inherited by the grandchild
    spawn_grandchild(rank);
    if (rank != failing) {
      sleep_s(60);
      return 0;
    }
    wait_for_everyone(world);
    std::fprintf(stderr, "probe: rank %d fails on purpose\n", rank);  // the launcher must show this first
    if (mode == "kill") ::raise(SIGKILL);
    return arg(3);
  }
  if (mode == "refuse") {  // the race a usage error can lose: a peer's consequential failure comes first
    if (rank == arg(2)) {  // fails once the others ignore SIGTERM (they record their pids after that)
      for (int i = 0; std::getenv("PROBE_PID_DIR") && i < 1000 && count_pid_files() < world - 1; ++i) sleep_s(0.01);
      std::fprintf(stderr, "probe: rank %d lost its peer\n", rank);
      return arg(3);
    }
    std::signal(SIGTERM, SIG_IGN);
    record_pid("rank" + std::to_string(rank), ::getpid());
    sleep_s(argc > 4 ? std::atof(argv[4]) : 0);
    std::fprintf(stderr, "probe: rank %d refuses its input\n", rank);
    return 2;
  }
  if (mode == "spawn" || mode == "straggler") {
    spawn_grandchild(rank);
    if (mode == "spawn") sleep_s(60);
    return 0;
  }
  if (mode == "sleep") {
    sleep_s(argc > 2 ? std::atof(argv[2]) : 0);
    return 0;
  }
  if (mode == "stream") return stream_mode(rank, arg(2), arg(3), argc > 4 ? std::atof(argv[4]) : 10);
  if (mode == "net") return net_mode(rank, world, argc > 2 ? std::atof(argv[2]) : 0);
  if (mode == "partial") {
    std::printf("no newline here");
    return 0;
  }
  if (mode == "lines") {
    std::printf("hello from stdout\n");
    std::printf("[rank %d] own tag\n", rank);
    std::fflush(stdout);
    std::fprintf(stderr, "hello from stderr\n");
    return 0;
  }
  std::fprintf(stderr, "launch_probe: unknown mode '%s'\n", mode.c_str());
  return 64;
}
