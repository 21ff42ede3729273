// `graphpipe worker` / train under a launcher: reads the rank from the environment, joins the
// rendezvous (TCPStore), runs execute_worker, and reports progress and failures through a small
// status file the local launcher reads (GP_STATUS_FILE).
#include <sys/prctl.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Logging.h>
#include <fmt/ranges.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/comm/comm.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/launch/status_file.h"
#include "runtime/base/fault.h"
#include "runtime/launch/launcher.h"
#include "support/error.h"

namespace gp::runtime {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  GP_CHECK(end && *end == '\0' && x >= 0 && x < (1L << 30), "environment: {}={} is not a valid number", name, v);
  return static_cast<int>(x);
}

/// The variable a launcher sets the world size in, for messages.
const char* world_size_variable(const std::string& source) {
  return source == "mpirun" ? "OMPI_COMM_WORLD_SIZE" : source == "srun" ? "SLURM_NTASKS" : "WORLD_SIZE";
}

/// Bounds joining the store by a deadline: c10d's TCPStore client retries a refused or timed-out
/// connection for up to about twice its timeout, and waits without a bound for the answer of a
/// program that accepts the connection but is not a store (a MASTER_PORT another program took).
/// Past the deadline `on_expiry` runs (it reports) and the process exits 1; disarmed when destroyed.
class Deadline {
 public:
  Deadline(std::chrono::milliseconds after, std::function<void()> on_expiry)
      : thread_([this, after, f = std::move(on_expiry)] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, after, [this] { return done_; })) {
            f();
            std::fflush(nullptr);
            std::_Exit(1);
          }
        }) {}
  ~Deadline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

/// Every rank announces itself in the store and waits for all the others, so a rank that never
/// arrives is named (CommError with that peer) rather than surfacing as Gloo's "wait timeout, keys:
/// /0/1". Keys carry torchrun's restart count: a restarted torchrun job reuses its agent's store.
void wait_for_all_ranks(c10d::Store& s, const LaunchEnv& le, std::chrono::milliseconds timeout,
                        const std::string& where) {
  const char* restart = env("TORCHELASTIC_RESTART_COUNT");
  const std::string prefix = fmt::format("graphpipe/arrived/{}/", restart ? restart : "0");
  std::vector<std::string> keys;
  for (int r = 0; r < le.world; ++r) keys.push_back(prefix + std::to_string(r));
  s.set(keys[static_cast<size_t>(le.rank)], std::vector<uint8_t>{'1'});
  try {
    s.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < le.world; ++r)
        if (!s.check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
    } catch (const std::exception&) {
      std::string m = e.what();
      if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
      throw RuntimeFailure(
          fmt::format("rendezvous: lost the store at {} while waiting for the other ranks: {}", where, m));
    }
    if (missing.empty()) return;  // the last one arrived as the wait gave up
    throw detail::CommError(
        fmt::format("rendezvous: rank{} {} of {} did not arrive within --timeout {} s (store at {}): check that "
                    "every rank was started with this MASTER_ADDR and MASTER_PORT",
                    missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), le.world,
                    std::chrono::duration<double>(timeout).count(), where),
        missing.front(), /*timed_out=*/true);
  }
}

}  // namespace

std::optional<LaunchEnv> launch_env_from_environment() {
  LaunchEnv e;
  if (env("RANK") && env("WORLD_SIZE")) {
    e.rank = env_int("RANK", env("RANK"));
    e.world = env_int("WORLD_SIZE", env("WORLD_SIZE"));
    e.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", env("LOCAL_RANK")) : e.rank;
    e.local_world = env("LOCAL_WORLD_SIZE") ? env_int("LOCAL_WORLD_SIZE", env("LOCAL_WORLD_SIZE")) : 0;
    e.source = env("GP_STATUS_FILE") ? "graphpipe" : "torchrun";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    e.rank = env_int("OMPI_COMM_WORLD_RANK", env("OMPI_COMM_WORLD_RANK"));
    e.world = env_int("OMPI_COMM_WORLD_SIZE", env("OMPI_COMM_WORLD_SIZE"));
    e.local_rank = env("OMPI_COMM_WORLD_LOCAL_RANK")
                       ? env_int("OMPI_COMM_WORLD_LOCAL_RANK", env("OMPI_COMM_WORLD_LOCAL_RANK"))
                       : 0;
    e.local_world = env("OMPI_COMM_WORLD_LOCAL_SIZE")
                        ? env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env("OMPI_COMM_WORLD_LOCAL_SIZE"))
                        : 0;
    e.source = "mpirun";
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    e.rank = env_int("SLURM_PROCID", env("SLURM_PROCID"));
    e.world = env_int("SLURM_NTASKS", env("SLURM_NTASKS"));
    e.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID", env("SLURM_LOCALID")) : 0;
    // "4" or "4(x2)"; env_int would refuse the second form, which only says the same count twice.
    if (const char* n = env("SLURM_NTASKS_PER_NODE")) e.local_world = std::atoi(n);
    e.source = "srun";
  } else {
    return std::nullopt;
  }
  GP_CHECK(e.world >= 1 && e.rank < e.world, "environment ({}): rank {} is not below world size {}", e.source, e.rank,
           e.world);
  GP_CHECK(env("MASTER_ADDR") && env("MASTER_PORT"),
           "environment ({}): rank {} of {} is set but MASTER_ADDR and MASTER_PORT are not; set them to "
           "the host and a free port of rank 0",
           e.source, e.rank, e.world);
  e.master_addr = env("MASTER_ADDR");
  e.master_port = env_int("MASTER_PORT", env("MASTER_PORT"));
  GP_CHECK(e.master_port >= 1 && e.master_port < 65536, "environment: MASTER_PORT={} is not a port", e.master_port);
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = (agent && std::string(agent) == "True") || env("GP_AGENT_STORE");
  return e;
}

std::vector<std::string> worker_args(const TrainOptions& o) {
  std::vector<std::string> a = {"--plan",      o.plan_path,
                                "--steps",     std::to_string(o.steps),
                                "--seed",      std::to_string(o.seed),
                                "--optimizer", o.optimizer,
                                "--lr",        fmt::format("{}", o.lr),
                                "--momentum",  fmt::format("{}", o.momentum),
                                "--timeout",   fmt::format("{}", o.timeout_s),
                                "--threads",   std::to_string(o.threads)};
  auto opt = [&](const char* flag, const std::string& v) {
    if (!v.empty()) a.insert(a.end(), {flag, v});
  };
  opt("--model", o.model_spec);
  opt("--schedule", o.schedule);
  opt("--log", o.log_path);
  opt("--trace", o.trace_path);
  if (o.trace_steps != 1) a.insert(a.end(), {"--trace-steps", std::to_string(o.trace_steps)});
  opt("--checkpoint-dir", o.checkpoint_dir);
  if (o.checkpoint_every > 0) a.insert(a.end(), {"--checkpoint-every", std::to_string(o.checkpoint_every)});
  if (o.resume) a.emplace_back("--resume");
  if (o.seeded_weights) a.emplace_back("--seeded-weights");  // not push_back(string&&): GCC 12 -Warray-bounds
  if (o.allow_nonfinite) a.emplace_back("--allow-nonfinite");
  if (o.json) a.emplace_back("--json");
  if (o.memory_limit_gb > 0) a.insert(a.end(), {"--memory-limit", fmt::format("{}", o.memory_limit_gb)});
  opt("--data", o.data_dir);
  if (o.shuffle) a.emplace_back("--shuffle");
  opt("--eval-data", o.eval_data_dir);
  if (o.eval_every > 0) a.insert(a.end(), {"--eval-every", std::to_string(o.eval_every)});
  a.insert(a.end(), {"--device", o.device, "--comm", o.comm, "--pin-cores", o.pin_cores, "--local-all-reduce",
                     o.local_all_reduce});
  return a;
}

int run_worker(const TrainOptions& opt) {
  auto le = launch_env_from_environment();
  GP_CHECK(le.has_value(), "worker: no rank in the environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*)");
  detail::StatusFile status(env("GP_STATUS_FILE"));
  if (status.active()) {
    // Spawned by our launcher: die with it, and let it print the one failure message.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (const char* ppid = env("GP_LAUNCHER_PID"); ppid && ::getppid() != std::atoi(ppid)) return 1;
  }
  std::optional<FaultSpec> fault;
  if (const char* f = env("GP_FAULT")) fault = parse_fault(f);
  // Every failure ends in the one line below; c10d's own warnings (retries, reverse DNS lookups that
  // fail) would bury it. TORCH_CPP_LOG_LEVEL=INFO|WARNING brings them back.
  if (!env("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;  // FATAL only

  int peer = -1, code = 0, stage = -1;
  bool rejected = false;
  std::string msg, current = "start-up";
  int64_t current_step = -1;
  try {
    // Under torchrun, mpirun or srun rank 0 holds the --checkpoint-dir lock (our launcher holds it itself).
    CheckpointLock lock;
    if (!status.active() && le->rank == 0 && !opt.checkpoint_dir.empty()) lock = CheckpointLock(opt.checkpoint_dir);
    PreparedRun run = prepare_run(opt, /*check_data_values=*/!status.active());  // our launcher checked them
    if (!status.active() && le->rank == 0)  // under torchrun, mpirun or srun (our launcher said it itself)
      for (const std::string& w : plan::micro_batch_warnings(run.plan, run.graph))
        std::fprintf(stderr, "graphpipe: warning: %s: %s\n", opt.plan_path.c_str(), w.c_str());
    RankRole role = role_of_rank(run.plan, le->rank);
    stage = role.stage;
    // Before the rendezvous, so every rank of a wrongly sized job stops at once instead of waiting.
    GP_CHECK(le->world == run.plan.num_devices,
             "environment ({}): {}={} but the plan {} has {} devices (num_devices): start one process per device",
             le->source, world_size_variable(le->source), le->world, opt.plan_path, run.plan.num_devices);
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(le->master_port);
    so.isServer = !le->agent_store && le->rank == 0;
    so.numWorkers = le->world;
    so.waitWorkers = false;
    so.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
    const std::string where = fmt::format("{}:{} (MASTER_ADDR:MASTER_PORT)", le->master_addr, le->master_port);
    c10::intrusive_ptr<c10d::TCPStore> store;
    {
      Deadline deadline(so.timeout + std::chrono::seconds(1), [&] {
        std::string m = fmt::format(
            "rendezvous: no store answered at {} within --timeout {} s: is rank 0 running "
            "there, and is that port not taken by another program?",
            where, opt.timeout_s);
        if (status.active()) status.failure(-1, false, m);
        else
          std::fprintf(stderr, "graphpipe worker rank %d of %d (stage %d) failed during start-up: %s\n", le->rank,
                       le->world, stage, m.c_str());
      });
      try {
        store = c10::make_intrusive<c10d::TCPStore>(le->master_addr, so);
      } catch (const std::exception& e) {
        std::string m = e.what();
        if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
        throw RuntimeFailure(
            fmt::format("rendezvous: {} the store at {}: {}", so.isServer ? "cannot host" : "cannot reach", where, m));
      }
    }
    wait_for_all_ranks(*store, *le, so.timeout, where);
    WorkerIo io;
    io.rank = le->rank;
    io.world = le->world;
    io.local_rank = le->local_rank;
    io.local_world = le->local_world;
    io.store = store;
    io.on_action = [&](int64_t step, int index, const schedule::Action& a) {
      current = schedule::to_string(a);
      current_step = step;
      status.progress(step, current);
      if (fault && fault->rank == le->rank && fault->action == index && fault->step == step) {
        if (fault->kind == "crash") ::raise(SIGKILL);
        if (fault->kind == "error")
          throw RuntimeFailure(fmt::format("injected error (GP_FAULT) at stage {} action {}", role.stage, index));
        if (fault->kind == "size") {
          GP_CHECK(a.kind == schedule::ActionKind::send_act || a.kind == schedule::ActionKind::send_grad,
                   "GP_FAULT kind=size needs a send action; action {} of stage {} is '{}'", index, role.stage, current);
          detail::wrong_size_next_send() = true;
          return;
        }
        if (fault->kind == "nan") {
          poison_next_action() = true;
          return;
        }
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // hang
      }
    };
    execute_worker(opt, run, io);
    check_stdout_written();  // train --json > FILE on a full disk is a failure, not an empty file
    return 0;
  } catch (const detail::CommError& e) {
    peer = e.peer();
    rejected = e.rejected();
    code = status.active() ? kExitPeerFailure : 1;  // 3 only tells our launcher whom to blame
    msg = e.what();
  } catch (const UserError& e) {
    code = 2;
    msg = e.what();
  } catch (const std::exception& e) {
    code = 1;
    msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  }
  if (status.active()) {
    status.failure(peer, rejected, msg);
  } else {
    std::string where = current_step < 0 ? "during start-up"
                                         : fmt::format("during step {} at action '{}'", current_step, current);
    std::fprintf(stderr, "graphpipe worker rank %d of %d (stage %d) failed %s: %s\n", le->rank, le->world, stage,
                 where.c_str(), msg.c_str());
  }
  return code;
}

}  // namespace gp::runtime
