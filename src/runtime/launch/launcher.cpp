// run_pipeline: with no cluster launcher, spawns one `graphpipe worker` process per device
// (posix_spawn of /proc/self/exe, never fork after LibTorch ran), hosts the rendezvous store and
// supervises: the first worker to fail takes the others down, and one message names it.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "runtime/checkpoint/checkpoint_manifest.h"
#include "runtime/comm/comm_select.h"
#include "runtime/exec/build_info.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/exec/optim.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/launch/status_file.h"
#include "runtime/launch/launcher.h"
#include "support/error.h"
#include "support/memory.h"

extern char** environ;

namespace gp::runtime {
namespace {

namespace fs = std::filesystem;

struct Exit {
  int rank = 0;
  bool signaled = false;
  int value = 0;  // exit code or signal number
};

/// When `dir` holds checkpoints of a run with another plan or model: "; the checkpoints in DIR were
/// written by a different run: WHAT"; else "".
std::string other_run(const std::string& dir, const PreparedRun& run) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("stage", 0) != 0 || e.path().extension() != ".pt") continue;
    Json saved;
    try {
      saved = read_checkpoint_identity(e.path().string());
    } catch (const UserError&) {
      continue;  // unreadable: its own load reports it
    }
    if (saved.is_null()) continue;
    std::string diff = identity_difference(
        saved, pipeline_identity(run.graph, run.plan, -1, 0, saved.value("optimizer", "")), true);
    if (!diff.empty()) return fmt::format("; the checkpoints in {} were written by a different run: {}", dir, diff);
  }
  return "";
}

// SIGTERM / SIGINT to the launcher: the handler kills the workers' process group at once (kill(2)
// is async-signal-safe) and records the signal; the wait loop then reports it in one line.
volatile sig_atomic_t g_stop_signal = 0;
volatile pid_t g_worker_group = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  if (g_worker_group > 0) ::kill(-g_worker_group, SIGKILL);
}

/// Installs on_stop_signal for SIGTERM and SIGINT (no SA_RESTART: waitpid returns EINTR) and puts
/// the previous handlers back when destroyed.
struct StopSignals {
  struct sigaction old_term {
  }, old_int{};
  StopSignals() {
    g_stop_signal = 0;
    g_worker_group = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &old_term);
    ::sigaction(SIGINT, &sa, &old_int);
  }
  ~StopSignals() {
    g_worker_group = 0;
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGINT, &old_int, nullptr);
  }
};

std::string exe_path() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  GP_ASSERT(!ec, "cannot resolve /proc/self/exe: {}", ec.message());
  return p.string();
}

}  // namespace

std::vector<int> spawn_local_workers(const std::vector<std::string>& sub_args, int world, int port,
                                     const std::string& status_dir_name) {
  fs::path status_dir(status_dir_name);
  std::string exe = exe_path();
  std::vector<std::string> args = {exe};
  args.insert(args.end(), sub_args.begin(), sub_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> base;
  static const char* ours[] = {
      "RANK=",        "WORLD_SIZE=",     "LOCAL_RANK=",     "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
      "MASTER_PORT=", "GP_AGENT_STORE=", "GP_STATUS_FILE=", "GP_LAUNCHER_PID="};
  for (char** e = environ; *e; ++e) {
    bool skip = false;
    for (const char* o : ours) skip = skip || std::strncmp(*e, o, std::strlen(o)) == 0;
    if (!skip) base.emplace_back(*e);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> envs = base;
    for (auto s : {fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", world), fmt::format("LOCAL_RANK={}", r),
                   fmt::format("LOCAL_WORLD_SIZE={}", world), std::string("MASTER_ADDR=127.0.0.1"),
                   fmt::format("MASTER_PORT={}", port), std::string("GP_AGENT_STORE=1"),
                   fmt::format("GP_STATUS_FILE={}", (status_dir / fmt::format("rank{}", r)).string()),
                   fmt::format("GP_LAUNCHER_PID={}", ::getpid())})
      envs.push_back(s);
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, pids.empty() ? 0 : pids[0]);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, exe.c_str(), nullptr, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      if (!pids.empty()) ::kill(-pids[0], SIGKILL);
      throw RuntimeFailure(fmt::format("cannot start worker {} ({}): {}", r, exe, std::strerror(rc)));
    }
    pids.push_back(pid);
  }
  return pids;
}

namespace {

std::string describe_exit(const Exit& e) {
  if (!e.signaled) return fmt::format("exited with code {}", e.value);
  const char* name = sigabbrev_np(e.value);
  return fmt::format("was killed by signal {} (SIG{})", e.value, name ? name : "?");
}

/// Picks the worker to blame and words the one failure message.
std::string failure_message(const plan::Plan& p, const std::vector<Exit>& exits, const std::vector<bool>& running,
                            const fs::path& status_dir, double timeout_s, int* user_error) {
  auto status = [&](int r) { return detail::read_status_file((status_dir / fmt::format("rank{}", r)).string()); };
  int culprit = -1;
  std::string what, detail;
  for (const Exit& e : exits)  // a crash, kill or own error beats the peers that noticed it
    if (e.signaled || (e.value != 0 && e.value != kExitPeerFailure)) {
      culprit = e.rank;
      detail::WorkerStatus s = status(e.rank);
      what = describe_exit(e) + (s.error.empty() ? "" : ": " + s.error);
      *user_error = !e.signaled && e.value == 2;
      break;
    }
  for (const Exit& e : exits)  // a rank that sent a malformed message beats a silent one
    if (detail::WorkerStatus s = status(e.rank); culprit < 0 && s.rejected && s.peer >= 0) {
      culprit = s.peer;
      what = fmt::format("sent a message that rank {} (stage {}) rejected", e.rank, role_of_rank(p, e.rank).stage);
      detail = fmt::format(
          " (the sender's current action; sends complete asynchronously). Rank {} rejected it at "
          "its action '{}' in step {}: {}",
          e.rank, s.action, s.step, s.error);
    }
  if (culprit < 0) {  // only peer failures: blame the rank they waited on, preferring a live one
    std::map<int, int> votes;
    for (const Exit& e : exits)
      if (int peer = status(e.rank).peer; peer >= 0) votes[peer] += 1 + (running[peer] ? 1000 : 0);
    int best = 0;
    for (auto [r, v] : votes)
      if (v > best) best = v, culprit = r;
    if (culprit >= 0 && running[culprit]) {
      what = fmt::format("stopped responding (its peers timed out after {} s)", timeout_s);
    } else if (culprit >= 0) {
      what = "lost its connections";
    } else if (auto live = std::find(running.begin(), running.end(), true); live != running.end()) {
      culprit = static_cast<int>(live - running.begin());  // a collective timed out: a live rank hangs
      what = fmt::format("stopped responding (its peers timed out after {} s)", timeout_s);
    } else {
      culprit = exits.front().rank;
      what = describe_exit(exits.front()) + ": " + status(culprit).error;
    }
  }
  RankRole role = role_of_rank(p, culprit);
  detail::WorkerStatus s = status(culprit);
  std::string where = s.action.empty() ? "before its first action"
                                       : fmt::format("during step {} at action '{}'", s.step, s.action);
  return fmt::format("worker rank {} (stage {}, replica {}) {} {}{}; stopped all {} workers", culprit, role.stage,
                     role.replica, what, where, detail, running.size());
}

}  // namespace

int run_pipeline(const TrainOptions& opt) {
  if (launch_env_from_environment()) return run_worker(opt);

  // Bad input ends here, before any worker starts.
  check_device_available(opt.device);
  choose_comm(opt.comm, opt.device, 0, 0, nccl_built());  // refuses a bad --comm before any worker starts
  PreparedRun run = prepare_run(opt);
  for (const std::string& w : plan::micro_batch_warnings(run.plan, run.graph))
    std::fprintf(stderr, "graphpipe: warning: %s: %s\n", opt.plan_path.c_str(), w.c_str());
  const int world = run.plan.num_devices;
  double local_bytes = 0;  // every worker runs on this machine
  for (const auto& st : run.plan.stages)
    local_bytes += double(st.devices.size()) * stage_bytes_estimate(run, st.id, opt.optimizer);
  check_fits_in_memory(local_bytes, fmt::format("train --plan {} ({} local workers)", opt.plan_path, world),
                       "parameters, gradients, optimizer state and in-flight activations of every stage");
  // The checkpoint folder is ours while we run (checkpoint/checkpoint_set.h); what --resume would load
  // is checked before any worker starts.
  if (opt.resume) {
    SetIdentity set = pipeline_set_identity(opt, run.plan, run.graph);
    try {
      check_resumable(opt.checkpoint_dir, set);
    } catch (const UserError& e) {
      throw UserError(e.what() + other_run(opt.checkpoint_dir, run));
    }
  }
  CheckpointLock lock;
  if (!opt.checkpoint_dir.empty()) lock = CheckpointLock(opt.checkpoint_dir);

  c10d::TCPStoreOptions so;
  so.port = 0;  // any free port; the workers learn it from MASTER_PORT
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);

  fs::path status_dir = fs::temp_directory_path() / fmt::format("graphpipe-{}-{}", ::getpid(), store->getPort());
  fs::create_directories(status_dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{status_dir};

  std::vector<std::string> args = {"worker"};
  for (auto& a : worker_args(opt)) args.push_back(a);
  StopSignals stop_signals;
  std::vector<pid_t> pids = spawn_local_workers(args, world, store->getPort(), status_dir.string());
  g_worker_group = pids[0];
  if (g_stop_signal) ::kill(-pids[0], SIGKILL);  // a signal that came while they started
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < world; ++r) rank_of[pids[r]] = r;
  std::vector<bool> running(world, true);
  std::vector<Exit> failures;
  int alive = world;
  auto record = [&](pid_t pid, int st) {
    auto it = rank_of.find(pid);
    if (it == rank_of.end()) return;
    running[it->second] = false;
    --alive;
    Exit e{it->second, WIFSIGNALED(st), WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st)};
    if (e.signaled || e.value != 0) failures.push_back(e);
  };
  while (alive > 0 && failures.empty() && !g_stop_signal) {
    int st = 0;
    pid_t pid = ::waitpid(-pids[0], &st, 0);
    if (pid < 0 && errno == EINTR) continue;
    GP_ASSERT(pid > 0, "waitpid failed: {}", std::strerror(errno));
    record(pid, st);
  }
  if (g_stop_signal) {
    const int sig = g_stop_signal;
    ::kill(-pids[0], SIGKILL);
    while (::waitpid(-pids[0], nullptr, 0) > 0 || errno == EINTR) {
    }
    detail::WorkerStatus s0 = detail::read_status_file((status_dir / "rank0").string());
    std::string where = s0.action.empty() ? "before its first action"
                                          : fmt::format("in step {} at action '{}'", s0.step, s0.action);
    std::string kept;
    if (!opt.checkpoint_dir.empty()) {
      try {
        auto gen = published_generation(opt.checkpoint_dir);
        kept = gen && !gen->flat()
                   ? fmt::format("; the checkpoint of step {} in {} is complete", gen->steps_done, opt.checkpoint_dir)
                   : fmt::format("; {} holds no complete checkpoint", opt.checkpoint_dir);
      } catch (const UserError&) {
      }
    }
    const char* name = sigabbrev_np(sig);
    std::fprintf(stderr, "graphpipe train: stopped by SIG%s: killed all %d workers (rank 0 was %s)%s\n",
                 name ? name : "?", world, where.c_str(), kept.c_str());
    std::fflush(stderr);
    std::error_code ec;
    fs::remove_all(status_dir, ec);
    lock.release();
    ::signal(sig, SIG_DFL);  // end as the signal asked: the shell sees 128 + sig
    ::raise(sig);
    std::_Exit(128 + sig);
  }
  if (failures.empty()) return 0;

  // Give the peers a moment to notice and report, then stop everyone.
  auto grace_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (alive > 0 && std::chrono::steady_clock::now() < grace_end) {
    int st = 0;
    pid_t pid = ::waitpid(-pids[0], &st, WNOHANG);
    if (pid > 0) record(pid, st);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<bool> still_running = running;
  ::kill(-pids[0], SIGKILL);
  while (alive > 0) {
    int st = 0;
    pid_t pid = ::waitpid(-pids[0], &st, 0);
    if (pid < 0 && errno != EINTR) break;
    if (pid > 0) {
      auto it = rank_of.find(pid);
      if (it != rank_of.end() && running[it->second]) running[it->second] = false, --alive;
    }
  }
  int user_error = 0;
  std::string msg = failure_message(run.plan, failures, still_running, status_dir, opt.timeout_s, &user_error);
  if (user_error) throw UserError(msg);
  throw RuntimeFailure(msg);
}

}  // namespace gp::runtime
