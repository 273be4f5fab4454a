// The supervision loop.
//
// One thread, one poll(): the ranks' pipes plus a "self-pipe" that the signal handlers write a byte
// to. A signal therefore wakes poll() like any other input, and all real work (reaping, printing,
// killing) happens in ordinary code, never inside a handler.
//
// Every rank leads its own process group, so one kill(-pgid) reaches the rank and everything it
// forked. The launcher is also a "child subreaper": a grandchild whose parent died is re-parented to
// us instead of to init, so we can reap it and be sure nothing is left when we return.
//
// --elastic changes one rule: a rank that fails is reported and, within --max-restarts, replaced by a
// new process in its slot; the others are left running (stage 09 re-forms its group without it). The
// store the ranks meet in is a file in a directory this launcher creates and removes. Beside it, in
// store.dead/, the launcher marks each process that ended ("<slot>.<restart>"), so that the survivors'
// round need not wait to see whether a member that is not there yet is only slow.
#include "supervisor.hpp"

#include "net.hpp"
#include "output.hpp"
#include "spawn.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp_launch {
namespace {

using Clock = std::chrono::steady_clock;

// After SIGKILL, how long to wait for the kernel to tear everything down before giving up on
// processes that escaped their group (setsid) or hang in the kernel.
constexpr auto kKillWait = std::chrono::seconds(2);
// What this project's programs exit with on bad input, before any work (and the launcher on bad options).
constexpr int kUsageErrorCode = 2;
// What stage 09 exits with when the run cannot go on at all (nobody holds the state, no checkpoint to load:
// common/base/errors.hpp's CannotContinue). A replacement could not either: none is started.
constexpr int kCannotContinueCode = 3;
// While stopping, poll() wakes at least this often to re-check deadlines and group membership.
constexpr int kTickMs = 50;
// --elastic: once a rank has finished the run (exit 0), how long the others may take to finish theirs. A
// rank still there after that is hung (or was left out of the run while stopped): it is stopped too.
constexpr auto kElasticFinishGrace = std::chrono::seconds(30);

volatile sig_atomic_t g_stop_signal = 0;  // first SIGINT / SIGTERM / SIGHUP received
volatile sig_atomic_t g_stop_count = 0;   // how many of them so far
int g_wake_fd = -1;                       // write end of the self-pipe

void on_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    if (g_stop_signal == 0) g_stop_signal = sig;
    g_stop_count = g_stop_count + 1;
  }
  const char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(g_wake_fd, &byte, 1);  // full pipe: a wake-up is pending anyway
  errno = saved;
}

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return ::strsignal(sig);
}

// Moves what one read() returns from a rank's pipe to its forwarder, closing the pipe at EOF (every
// writer gone: the rank and anything it forked). Returns false when nothing more is there right now.
bool pump(int& fd, LineForwarder& fwd) {
  char buf[65536];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n > 0) {
    fwd.feed(buf, static_cast<std::size_t>(n));
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  fwd.finish();
  ::close(fd);
  fd = -1;
  return false;
}

struct Rank {
  Rank(int local_rank, int global_rank, const std::string& tag)
      : local(local_rank), global(global_rank), out(STDOUT_FILENO, tag), err(STDERR_FILENO, tag) {}
  int local, global;
  int restarts = 0;              // --elastic: processes this slot had before the current one
  bool left_out = false;         // --elastic: stopped (SIGSTOP) when the run finished, so killed by us: not news
  bool restart_pending = false;  // --elastic: a replacement starts at restart_at
  std::chrono::steady_clock::time_point restart_at{};
  pid_t pid = -1;      // also the id of its process group
  bool reaped = true;  // true until it is started, so a rank that never ran is not waited for
  int out_fd = -1, err_fd = -1;
  LineForwarder out, err;
};

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o) : opts_(o) {
    ranks_.reserve(o.nproc);
    for (int l = 0; l < o.nproc; ++l) {
      const int g = o.global_rank(l);
      ranks_.emplace_back(l, g, o.prefix ? fmt::format("[rank {}/{}] ", g, o.world_size()) : std::string());
    }
  }
  int run();

 private:
  enum class Phase { Running, Terminating, Killing };

  void install_signal_handlers();
  bool start(Rank& r);
  void handle_stop_signals();
  void reap();
  void stop();
  void signal_groups(int sig);
  bool any_group_alive() const;
  bool all_reaped() const;
  bool any_stream_open() const;
  void wait_and_forward();
  void close_streams();
  void elastic_failure(Rank& r, int code, const std::string& what);
  void elastic_tick();
  int elastic_exit_code() const;

  LaunchOptions opts_;  // a copy: --elastic fills in elastic_store
  // --net's namespaces. Destroyed with the Supervisor, so after run() has reaped every rank, on
  // every return path (an exception included); the signal handlers stay installed meanwhile, so a
  // Ctrl-C during teardown cannot cut it short.
  std::unique_ptr<Network> net_;
  std::vector<Rank> ranks_;
  int wake_read_ = -1;
  int devnull_ = -1;
  Phase phase_ = Phase::Running;
  Clock::time_point deadline_{};
  bool failed_ = false;
  sig_atomic_t signals_handled_ = 0;
  int exit_code_ = 0;
  // --elastic
  std::string store_dir_;  // holds the store file; removed when the Supervisor is destroyed
  int restarts_used_ = 0;
  bool finished_ = false;  // a rank exited 0: the run is over
  Clock::time_point finish_deadline_{};
  int last_failure_code_ = 0;     // the code of the last failure (what ended the run, if nothing finished it)
  int late_failure_code_ = 0;     // a failure after the run finished: the launcher's exit code
  bool cannot_continue_ = false;  // a rank exited kCannotContinueCode: no replacement starts from now on

 public:
  ~Supervisor() {
    if (!store_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(store_dir_, ec);
    }
  }
};

void Supervisor::install_signal_handlers() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error(std::strerror(errno));
  wake_read_ = fds[0];
  g_wake_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  // A closed terminal or `| head` must not kill the launcher and orphan the ranks: writes fail instead.
  ::signal(SIGPIPE, SIG_IGN);
}

bool Supervisor::start(Rank& r) {
  using Vars = std::vector<std::pair<std::string, std::string>>;
  auto env = rank_environment(opts_, r.local, net_ ? net_->rank_env(r.local) : Vars{}, r.restarts);
  const int netns = net_ ? net_->netns_fd(r.local) : -1;
  const Child child =
      spawn_rank(opts_.command, std::move(env), devnull_, r.global, netns, cpus_of_rank(opts_, r.local));
  if (child.pid < 0) return false;
  r.pid = child.pid;
  r.reaped = false;
  r.out_fd = child.out_fd;
  r.err_fd = child.err_fd;
  return true;
}

// SIGINT/SIGTERM/SIGHUP to the launcher: stop the ranks gracefully. A second one while we are
// already stopping means "now": skip the rest of the grace period.
void Supervisor::handle_stop_signals() {
  if (signals_handled_ == g_stop_count) return;
  signals_handled_ = g_stop_count;
  if (!failed_ && exit_code_ == 0) exit_code_ = 128 + g_stop_signal;
  if (phase_ == Phase::Running) {
    const auto live = std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.reaped; });
    if (live > 0) say(fmt::format("interrupted, stopping {} rank{}", live, live == 1 ? "" : "s"));
    stop();
  } else {
    signal_groups(SIGKILL);
    phase_ = Phase::Killing;
    deadline_ = Clock::now() + kKillWait;
  }
}

// Collects every exited child: ranks, and orphaned grandchildren handed to us as subreaper.
void Supervisor::reap() {
  int status = 0;
  for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
    for (Rank& r : ranks_) {
      if (r.pid != pid) continue;
      r.reaped = true;
      if (opts_.elastic) {  // "<slot>.<restart>", the id stage 09 gives this process (stages/09_elastic/membership.hpp)
        std::ofstream(fmt::format("{}.dead/{}.{}", opts_.elastic_store, r.global, r.restarts));
      }
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      // A usage error (exit 2: bad input, refused before any work) is the cause, and a peer that failed
      // first, because the refusing rank closed its connections, only its consequence: report the usage
      // error, even when it comes second.
      if (failed_ && phase_ != Phase::Running && WIFEXITED(status) && WEXITSTATUS(status) == kUsageErrorCode &&
          exit_code_ != kUsageErrorCode) {
        while (r.out_fd >= 0 && pump(r.out_fd, r.out)) {
        }
        while (r.err_fd >= 0 && pump(r.err_fd, r.err)) {
        }
        exit_code_ = kUsageErrorCode;
        say(fmt::format("rank {} exited with code {} (a usage error; the failure above followed from it)", r.global,
                        exit_code_));
        break;
      }
      if (opts_.elastic && phase_ == Phase::Running && ok && !finished_) {
        finished_ = true;  // the run is over; the others get kElasticFinishGrace to finish theirs
        finish_deadline_ = Clock::now() + kElasticFinishGrace;
      }
      if (ok || phase_ != Phase::Running) break;  // deaths we caused while stopping are not news
      if (r.left_out) break;
      if (opts_.elastic && !(WIFEXITED(status) && WEXITSTATUS(status) == kUsageErrorCode)) {
        if (WIFEXITED(status))
          elastic_failure(r, WEXITSTATUS(status), fmt::format("exited with code {}", WEXITSTATUS(status)));
        else
          elastic_failure(r, 128 + WTERMSIG(status),
                          fmt::format("was killed by signal {} ({})", WTERMSIG(status), signal_name(WTERMSIG(status))));
        break;
      }
      failed_ = true;
      // Print what the rank said last (usually why it failed) before our verdict on it.
      while (r.out_fd >= 0 && pump(r.out_fd, r.out)) {
      }
      while (r.err_fd >= 0 && pump(r.err_fd, r.err)) {
      }
      if (WIFEXITED(status)) {
        exit_code_ = WEXITSTATUS(status);
        say(fmt::format("rank {} exited with code {}", r.global, exit_code_));
      } else {
        const int sig = WTERMSIG(status);
        exit_code_ = 128 + sig;
        say(fmt::format("rank {} was killed by signal {} ({})", r.global, sig, signal_name(sig)));
      }
      stop();
      break;
    }
  }
}

// --elastic: rank `r` failed. The others go on; a replacement takes its slot while restarts are left.
void Supervisor::elastic_failure(Rank& r, int code, const std::string& what) {
  last_failure_code_ = code;
  if (finished_) late_failure_code_ = code;
  while (r.out_fd >= 0 && pump(r.out_fd, r.out)) {
  }
  while (r.err_fd >= 0 && pump(r.err_fd, r.err)) {
  }
  const auto live = std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& x) { return !x.reaped; });
  if (code == kCannotContinueCode || cannot_continue_) {
    if (!cannot_continue_)
      say(fmt::format("rank {} {}: the run cannot go on (the rank says why above), so no replacement starts", r.global,
                      what));
    cannot_continue_ = true;
    for (Rank& x : ranks_) x.restart_pending = false;
    return;
  }
  if (finished_ || restarts_used_ >= opts_.max_restarts) {
    say(fmt::format("rank {} {}; elastic: {} rank{} go{} on{}", r.global, what, live, live == 1 ? "" : "s",
                    live == 1 ? "es" : "", opts_.max_restarts > 0 && !finished_ ? " (no restarts left)" : ""));
    return;
  }
  // Whatever it forked goes with it, then its pipes: the replacement gets new ones.
  ::kill(-r.pid, SIGKILL);
  for (auto [fd, fwd] : {std::pair{&r.out_fd, &r.out}, std::pair{&r.err_fd, &r.err}}) {
    if (*fd < 0) continue;
    fwd->finish();
    ::close(*fd);
    *fd = -1;
  }
  ++restarts_used_;
  ++r.restarts;
  say(fmt::format("rank {} {}; elastic: {} rank{} go{} on, and a replacement starts in its slot{} (restart {} of {})",
                  r.global, what, live, live == 1 ? "" : "s", live == 1 ? "es" : "",
                  opts_.restart_delay_s > 0 ? fmt::format(" in {:g} s", opts_.restart_delay_s) : std::string(),
                  restarts_used_, opts_.max_restarts));
  r.restart_pending = true;
  r.restart_at =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.restart_delay_s));
  elastic_tick();  // starts it now when there is no delay
}

// --elastic, once the run has finished: a rank that is stopped (SIGSTOP: state T in /proc) can never
// finish, and one still running after the grace period is hung. Either is stopped now.
void Supervisor::elastic_tick() {
  if (phase_ != Phase::Running) return;
  for (Rank& r : ranks_) {
    if (!r.restart_pending || Clock::now() < r.restart_at) continue;
    r.restart_pending = false;
    if (finished_ || cannot_continue_) continue;  // the run ended meanwhile: nothing to join
    if (!start(r)) say(fmt::format("the replacement for rank {} could not be started", r.global));
  }
  if (!finished_) return;
  for (Rank& r : ranks_) {
    if (r.reaped || r.left_out) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", r.pid));
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'T' || line[paren + 2] == 't')) {
      say(fmt::format("rank {} is stopped (SIGSTOP) and the run is over without it: killing it", r.global));
      r.left_out = true;
      ::kill(-r.pid, SIGKILL);
      ::kill(-r.pid, SIGCONT);
    }
  }
  if (Clock::now() >= finish_deadline_) {
    say(fmt::format("the run finished {} s ago and some ranks are still running: stopping them",
                    std::chrono::duration_cast<std::chrono::seconds>(kElasticFinishGrace).count()));
    late_failure_code_ = late_failure_code_ ? late_failure_code_ : 1;
    stop();
  }
}

int Supervisor::elastic_exit_code() const {
  if (finished_) return late_failure_code_;
  if (cannot_continue_) return kCannotContinueCode;
  return last_failure_code_ ? last_failure_code_ : exit_code_;
}

// Ask every group to terminate; SIGKILL follows when the grace period runs out.
void Supervisor::stop() {
  if (phase_ != Phase::Running) return;
  phase_ = Phase::Terminating;
  const std::chrono::duration<double> grace(opts_.timeout_s);
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
  signal_groups(SIGTERM);
}

void Supervisor::signal_groups(int sig) {
  for (const Rank& r : ranks_) {
    if (r.pid > 0) ::kill(-r.pid, sig);  // ESRCH: the group is already empty
  }
}

// A group exists while any member exists, zombies included; so "no group alive" means every
// process the ranks started has been reaped.
bool Supervisor::any_group_alive() const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.pid > 0 && (::kill(-r.pid, 0) == 0 || errno == EPERM); });
}

bool Supervisor::all_reaped() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.reaped; });
}

bool Supervisor::any_stream_open() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out_fd >= 0 || r.err_fd >= 0; });
}

void Supervisor::close_streams() {
  for (Rank& r : ranks_) {
    for (auto [fd, fwd] : {std::pair{&r.out_fd, &r.out}, std::pair{&r.err_fd, &r.err}}) {
      if (*fd < 0) continue;
      fwd->finish();
      ::close(*fd);
      *fd = -1;
    }
  }
}

// One poll(): sleep until output, a signal, or the next deadline tick; then forward what arrived.
void Supervisor::wait_and_forward() {
  std::vector<pollfd> fds{{wake_read_, POLLIN, 0}};
  std::vector<std::pair<int*, LineForwarder*>> streams;
  for (Rank& r : ranks_) {
    for (auto s : {std::pair{&r.out_fd, &r.out}, std::pair{&r.err_fd, &r.err}}) {
      if (*s.first < 0) continue;
      fds.push_back({*s.first, POLLIN, 0});
      streams.push_back(s);
    }
  }
  int timeout_ms = -1;  // while running, only a pipe or a signal (SIGCHLD included) can change anything
  const bool pending = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.restart_pending; });
  if (finished_ || pending) timeout_ms = kTickMs;  // --elastic: elastic_tick() has deadlines to watch
  if (phase_ != Phase::Running) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, kTickMs));
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) < 0) return;  // EINTR: the self-pipe has the news

  if (fds[0].revents & POLLIN) {
    char buf[256];
    while (::read(wake_read_, buf, sizeof(buf)) > 0) {
    }
  }
  for (std::size_t i = 0; i < streams.size(); ++i) {
    if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) pump(*streams[i].first, *streams[i].second);
  }
}

int Supervisor::run() {
  install_signal_handlers();  // before the first fork: a Ctrl-C from now on is forwarded, not fatal
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Built after the handlers are in place: a Ctrl-C during setup is only recorded, setup completes
  // (or fails and cleans up), and no rank is started; the loop below then exits with 130.
  if (opts_.net.enabled()) net_ = std::make_unique<Network>(opts_.net, opts_.nproc);
  if (opts_.elastic) {
    char tmpl[] = "/tmp/ddp_launch_elastic.XXXXXX";
    if (!::mkdtemp(tmpl))
      throw std::runtime_error(fmt::format("cannot create the elastic store's directory: {}", std::strerror(errno)));
    store_dir_ = tmpl;
    opts_.elastic_store = store_dir_ + "/store";
    std::filesystem::create_directory(opts_.elastic_store + ".dead");
  }
  if (g_stop_count > 0) say("interrupted before any rank was started");
  for (Rank& r : ranks_) {
    if (g_stop_count > 0) break;
    if (!start(r)) {
      failed_ = true;
      exit_code_ = 1;
      stop();
      break;
    }
  }
  for (;;) {
    handle_stop_signals();
    reap();
    // Every rank is done. Whatever they left behind (a background process, a data-loader child)
    // gets the same SIGTERM-then-SIGKILL treatment; usually there is nothing and this costs nothing.
    if (opts_.elastic) elastic_tick();
    // (--elastic: every rank dead at once, with replacements due, is not the end: they fall back to a checkpoint.)
    const bool due = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.restart_pending; });
    if (phase_ == Phase::Running && all_reaped() && !due) stop();
    if (all_reaped() && !any_stream_open() && !any_group_alive() && !(due && phase_ == Phase::Running)) break;

    const auto now = Clock::now();
    if (phase_ == Phase::Terminating && now >= deadline_) {
      signal_groups(SIGKILL);
      phase_ = Phase::Killing;
      deadline_ = now + kKillWait;
    } else if (phase_ == Phase::Killing) {
      if (now >= deadline_) break;  // escaped or unkillable processes: give up rather than hang
      signal_groups(SIGKILL);       // again: catches anything forked while the last one was delivered
    }
    wait_and_forward();
  }
  close_streams();
  // Elastic: a stop we were asked for (a signal) or a usage error keeps its code; otherwise the run's outcome.
  if (opts_.elastic && !(signals_handled_ > 0 || exit_code_ == kUsageErrorCode)) return elastic_exit_code();
  return exit_code_;
}

}  // namespace

int supervise(const LaunchOptions& opts) { return Supervisor(opts).run(); }

}  // namespace ddp_launch
