// The pipeline worker: prepares a run (plan, model, checked schedule) and executes one rank's stage
// schedule for every step with a StageRunner (stage_runner.h): step statistics, checkpoints,
// evaluation, the measured trace and the memory report around it.
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "importers/resolve.h"
#include "plan/costs.h"
#include "runtime/checkpoint/checkpoint_manifest.h"
#include "runtime/comm/comm_select.h"
#include "runtime/checkpoint/checkpoint_set.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/device.h"
#include "runtime/exec/params.h"
#include "runtime/exec/memory_meter.h"
#include "runtime/pipeline/pipeline.h"
#include "runtime/pipeline/stage_runner.h"
#include "runtime/pipeline/step_stats.h"
#include "runtime/comm/net_address.h"
#include "runtime/base/cpu_affinity.h"
#include "runtime/exec/op_timing.h"
#include "schedule/trace.h"
#include "support/error.h"
#include "support/json.h"
#include "support/sha256.h"

namespace gp::runtime {

std::atomic<bool>& poison_next_action() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {

/// What the message tags (transfer_tag) can address: sample indices below 2^22 and at most 64
/// tensors on one stage edge. A valid plan beyond them is refused before any worker starts.
void check_runtime_limits(const plan::Plan& p, const ir::Graph& g) {
  GP_CHECK(p.mini_batch_size < kMaxMiniBatchSamples,
           "plan: mini_batch_size {} is above what the runtime can train, {} samples per step", p.mini_batch_size,
           kMaxMiniBatchSamples - 1);
  auto stage_of = plan::stage_of_ops(p, g);
  for (const auto& [e, ops] : plan::cut_edges(g, stage_of))
    GP_CHECK(ops.size() <= kMaxTensorsPerEdge,
             "plan: stage {} sends {} op outputs to stage {}; the runtime carries at most {} per stage edge (cut "
             "the model elsewhere)",
             e.first, ops.size(), e.second, kMaxTensorsPerEdge);
}

}  // namespace

PreparedRun prepare_run(plan::Plan p, const std::string& schedule_kind, const std::string& model_spec) {
  std::string spec = model_spec.empty() ? p.model_spec : model_spec;
  GP_CHECK(!spec.empty(), "plan: no model_spec in the plan; pass --model SPEC");
  importers::ParamValues w;  // every rank starts from the same weights
  ir::Graph g = importers::load_graph(spec, w);
  plan::validate_plan(p, g, "plan");
  check_runtime_limits(p, g);
  schedule::Schedule s = schedule::build_schedule(p, schedule_kind);
  schedule::check_schedule(s, p, "schedule");
  check_initial_values(g, w);
  return PreparedRun{std::move(p), std::move(g), std::move(s), std::move(w)};
}

PreparedRun prepare_run(const TrainOptions& opt, bool check_data_values) {
  GP_CHECK(!opt.plan_path.empty(), "train needs --plan FILE (or --single)");
  GP_CHECK(opt.steps >= 1, "--steps must be >= 1, found {}", opt.steps);
  GP_CHECK(opt.checkpoint_every >= 0, "--checkpoint-every must be >= 0, found {}", opt.checkpoint_every);
  GP_CHECK(!opt.resume || !opt.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  GP_CHECK(opt.checkpoint_every == 0 || !opt.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  GP_CHECK(opt.timeout_s > 0 && opt.timeout_s <= kMaxTimeoutS, "--timeout must be in (0, {}] seconds, found {}",
           kMaxTimeoutS, opt.timeout_s);
  GP_CHECK(opt.threads >= 1 && opt.threads <= kMaxThreads, "--threads must be in [1, {}], found {}", kMaxThreads,
           opt.threads);
  GP_CHECK(std::isfinite(opt.lr) && opt.lr > 0, "--lr must be a positive finite number, found {}", opt.lr);
  plan::Plan p = plan::load_plan(opt.plan_path);
  const std::string kind = opt.schedule.empty() ? p.schedule : opt.schedule;  // default: the plan's own
  PreparedRun run = prepare_run(std::move(p), kind, opt.model_spec);
  if (opt.seeded_weights) run.weights.clear();
  RunData d = open_run_data(opt, run.graph, check_data_values);
  run.data = std::move(d.train);
  run.eval_data = std::move(d.eval);
  return run;
}

double stage_bytes_estimate(const PreparedRun& run, int stage, const std::string& optimizer) {
  const plan::Stage& st = run.plan.stages.at(stage);
  std::vector<OpId> ops;
  for (const auto& name : st.ops) ops.push_back(run.graph.find(name));
  double held = double(st.in_flight) * st.micro_batch_size / double(st.devices.size());
  return training_bytes_estimate(run.graph, ops, held, optimizer);
}

namespace {

/// This host's ranks with a stage (the host's ranks are the local_world ranks from rank - local_rank on;
/// a rank the plan leaves idle waits without computing), and this rank's place among them (-1: none).
struct HostWorkers {
  int busy = 0, index = -1;
};
HostWorkers host_workers(const plan::Plan& p, const WorkerIo& io) {
  HostWorkers h;
  if (io.local_world <= 0) return h;
  for (int r = io.rank - io.local_rank; r < io.rank - io.local_rank + io.local_world; ++r)
    if (role_of_rank(p, r).stage >= 0) {
      if (r == io.rank) h.index = h.busy;
      ++h.busy;
    }
  return h;
}

/// This host has more usable cores than ranks with a stage.
bool spare_core(const plan::Plan& p, const WorkerIo& io) {
  return io.local_world > 0 && host_workers(p, io).busy < static_cast<int>(usable_cpus().size());
}

/// --pin-cores auto: where every usable core of the host has a rank with a stage (or more ranks than
/// cores), a CPU worker process pins itself, and the threads it starts, to the core of its place
/// among them (round robin); rank 0 says so. Unpinned, Gloo's receive thread can wake on the core
/// where the other worker computes and wait for its time slice (our reading of the step times, not
/// traced in the kernel): 2 data-parallel workers on 2 cores took
/// 16.7-17.7 ms a step at the median pinned, 18.3-23.5 unpinned, and 7 of 8 interleaved rounds were
/// faster pinned (issue 35). With a spare core nobody pins: the synthetic inputs are made on it.
/// Workers that are threads of one process (tests: io.local_world 0) are never pinned.
void pin_to_core(const TrainOptions& opt, const plan::Plan& p, const WorkerIo& io) {
  if (opt.pin_cores != "auto" || opt.device != "cpu") return;
  const HostWorkers h = host_workers(p, io);
  const std::vector<int> cpus = usable_cpus();
  const auto n = static_cast<int>(cpus.size());
  if (h.busy == 0 || h.busy < n) return;
  if (io.rank == 0 && io.print && !opt.json) {
    std::string where;
    for (int k = 0; k < h.busy; ++k) where += fmt::format("{}{}", k ? ", " : "", cpus[static_cast<size_t>(k % n)]);
    std::printf(
        "cores: this host's %d workers with a stage on %d usable core(s), each pinned to one: CPU %s "
        "(--pin-cores off: the OS places them)\n",
        h.busy, n, where.c_str());
  }
  if (h.index < 0) return;
  const std::string why = pin_process_to_cpu(cpus[static_cast<size_t>(h.index % n)]);
  if (!why.empty())
    std::fprintf(stderr, "rank %d: not pinned to a core (%s); training goes on\n", io.rank, why.c_str());
}

}  // namespace

RankRole role_of_rank(const plan::Plan& p, int rank) {
  for (const auto& st : p.stages)
    for (size_t i = 0; i < st.devices.size(); ++i)
      if (st.devices[i] == rank) return {st.id, static_cast<int>(i)};
  return {};
}

namespace {

using detail::Communicator;
using detail::Pending;
using schedule::Action;
using schedule::ActionKind;

detail::CommOptions comm_options(const TrainOptions& opt) {
  detail::CommOptions co;
  co.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) co.interface = ifname;
  const char* addr = std::getenv("MASTER_ADDR");
  std::string a = addr ? addr : "127.0.0.1";
  // Single-host runs bind loopback; multi-node runs the interface that routes to MASTER_ADDR ("": the
  // interface of this host's name, Gloo's default, when no route is found).
  co.hostname = (a == "127.0.0.1" || a == "localhost") ? "127.0.0.1" : local_address_towards(a);
  const char* staging = std::getenv("GP_HOST_STAGING");  // 1: stage CPU tensors too (tests the GPU path)
  co.force_host_staging = staging && std::string(staging) == "1";
  co.shm_all_reduce = opt.local_all_reduce == "shm";
  return co;
}

Json events_to_json(const std::vector<MeasuredEvent>& evs) {
  Json out = Json::array();
  for (const auto& e : evs)
    out.push_back({e.step, e.action, e.track, e.name, e.category, e.start_s, e.end_s, e.thread_cpu_s, e.process_cpu_s});
  return out;
}

std::vector<MeasuredEvent> events_from_json(const Json& j) {
  std::vector<MeasuredEvent> out;
  for (const auto& e : j)
    out.push_back({e[0].get<int64_t>(), e[1].get<int>(), e[2].get<int>(), e[3].get<std::string>(),
                   e[4].get<std::string>(), e[5].get<double>(), e[6].get<double>(), e[7].get<double>(),
                   e[8].get<double>()});
  return out;
}

void store_set(c10d::Store& s, const std::string& key, const std::string& v) {
  s.set(key, std::vector<uint8_t>(v.begin(), v.end()));
}
std::string store_get(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}

// Every rank's --comm choice, made one (comm_select.h): each rank votes through the store whether it
// could use NCCL, the last to vote publishes the count, and all settle on the same backend.
CommChoice agree_on_comm(const TrainOptions& opt, const WorkerIo& io) {
  const int gpus = opt.device == "cuda" ? static_cast<int>(torch::cuda::device_count()) : 0;
  const CommChoice mine = choose_comm(opt.comm, opt.device, io.local_world, gpus, nccl_built());
  if (io.world == 1 || (opt.comm != "auto" && opt.comm != "nccl") || opt.device != "cuda")
    return settle_comm(opt.comm, mine, mine.nccl_possible ? io.world : 0, io.world);
  c10d::Store& s = *io.store;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");  // a restarted torchrun reuses its store
  const std::string key = fmt::format("graphpipe/comm/{}/", restart ? restart : "0");
  s.add(key + "nccl-votes", mine.nccl_possible ? 1 : 0);
  if (s.add(key + "voted", 1) == io.world) store_set(s, key + "result", std::to_string(s.add(key + "nccl-votes", 0)));
  s.wait({key + "result"}, std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000)));
  return settle_comm(opt.comm, mine, std::stoi(store_get(s, key + "result")), io.world);
}

// The directed pairs of ranks that exchange activations, gradients or ordering tokens (every replica
// of a stage with every replica of a successor, both ways), sorted: the order connect() needs.
std::vector<std::pair<int, int>> transfer_pairs(const plan::Plan& p) {
  std::set<std::pair<int, int>> pairs;
  for (const auto& st : p.stages)
    for (int next : st.outputs_to)
      for (int a : st.devices)
        for (int b : p.stages[next].devices) {
          pairs.insert({a, b});
          pairs.insert({b, a});
        }
  return {pairs.begin(), pairs.end()};
}

Json samples_to_json(const detail::MemoryMeter* meter) {
  Json out = Json::array();
  if (meter)
    for (const auto& m : meter->samples()) out.push_back({m.t_s, m.live_bytes, m.peak_bytes});
  return out;
}

std::vector<detail::MemorySample> samples_from_json(const Json& j) {
  std::vector<detail::MemorySample> out;
  for (const auto& m : j) out.push_back({m[0].get<double>(), m[1].get<double>(), m[2].get<double>()});
  return out;
}

/// This rank's measured peak with the cost model's prediction for its stage, shared through the
/// store: rank 0 returns every rank's (by rank), the others their own.
std::vector<RankMemory> gather_memory(const PreparedRun& run, const TrainOptions& opt, const WorkerIo& io,
                                      RankRole role, const detail::MemoryMeter* meter) {
  RankMemory m;
  m.rank = io.rank;
  m.stage = role.stage;
  m.resident_peak_bytes = detail::resident_memory().peak_bytes;
  if (meter) {
    m.peak_bytes = meter->peak_bytes();
    m.peak_step = meter->peak_step();
    m.measured = meter->at_peak();
    m.in_flight = schedule::peak_in_flight(run.schedule).at(static_cast<size_t>(role.stage));
    m.predicted = predicted_stage_memory(run.plan, run.graph, role.stage, opt.optimizer, m.in_flight);
    m.predicted_bytes = m.predicted.total();
  }
  store_set(*io.store, "gp/memory/" + std::to_string(io.rank), m.to_json().dump());
  if (io.rank != 0) return {m};
  std::vector<RankMemory> all;
  for (int r = 0; r < io.world; ++r)
    all.push_back(RankMemory::from_json(Json::parse(store_get(*io.store, "gp/memory/" + std::to_string(r)))));
  return all;
}

/// Evaluates the current weights on --eval-data: every rank with a stage runs the forward-only
/// batches, the sums are added over the world (every rank gets them).
EvalSums evaluate_pipeline(Communicator& world, StageRunner* runner, const PreparedRun& run) {
  EvalSums s;
  if (runner)
    for (int64_t j = 0; j < eval_batches(run.eval_data->size(), run.plan.mini_batch_size); ++j)
      runner->eval_batch(j, s);
  std::vector<torch::Tensor> v{torch::tensor({s.loss, s.correct, s.samples, s.classified}, torch::kFloat64)};
  world.all_reduce(v, detail::Reduce::sum).wait();
  auto a = v[0].accessor<double, 1>();
  return EvalSums{a[0], a[1], a[2], a[3]};
}

}  // namespace

namespace {

/// One step's actions of this rank's stage, metered; with `trace`, each action's measured event.
void run_step_actions(const TrainOptions& opt, const WorkerIo& io, int64_t step, bool trace, StageRunner& runner,
                      detail::MemoryMeter& meter, std::vector<MeasuredEvent>& events) {
  const auto& acts = runner.actions();
  for (size_t i = 0; i < acts.size(); ++i) {
    if (io.on_action) io.on_action(step, static_cast<int>(i), acts[i]);
    double t0 = now_s();
    double thread0 = trace ? detail::cpu_time_s() : 0, process0 = trace ? detail::cpu_time_s(true) : 0;
    meter.begin_action();
    runner.run(acts[i]);
    double peak = meter.end_action(step, now_s(), trace);
    std::string over = memory_limit_failure(io.rank, runner.stage(), step, schedule::to_string(acts[i]), peak,
                                            meter.at_peak(), opt.memory_limit_gb * 1e9);
    if (!over.empty()) throw RuntimeFailure(over);
    if (trace) {
      bool is_send = acts[i].kind == ActionKind::send_act || acts[i].kind == ActionKind::send_grad;
      events.push_back({step, static_cast<int>(i), is_send ? schedule::kSendTrack : schedule::kComputeTrack,
                        fmt::format("s{} {}", runner.stage(), schedule::to_string(acts[i])),
                        schedule::trace_category(acts[i].kind), t0, now_s(), detail::cpu_time_s() - thread0,
                        detail::cpu_time_s(true) - process0});
    }
  }
}

/// Every rank must run the same plan, model and schedule: a rank that loaded another plan.json (a stale
/// copy on one node) would exchange tensors of other shapes, and a message more than
/// kPostedRecvSlackBytes longer than its posted receive makes Gloo abort the process. Before any
/// connection each rank compares the sha256 of what it runs with rank 0's through the store and counts
/// the ranks that differ; every rank then stops with the same line (UserError) when any did.
void check_same_run(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io) {
  if (io.world == 1) return;
  const std::string mine = sha256_hex(plan::plan_to_json(run.plan).dump() + "\n" + opt.model_spec + "\n" +
                                      opt.schedule);
  c10d::Store& s = *io.store;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");  // a restarted torchrun reuses its store
  const std::string key = fmt::format("graphpipe/run/{}/", restart ? restart : "0");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
  if (io.rank == 0) store_set(s, key + "rank0", mine);
  s.wait({key + "rank0"}, timeout);
  const std::string first = store_get(s, key + "rank0");
  s.add(key + "differing", first != mine ? 1 : 0);
  if (s.add(key + "checked", 1) == io.world) store_set(s, key + "result", std::to_string(s.add(key + "differing", 0)));
  s.wait({key + "result"}, timeout);
  const int n = std::stoi(store_get(s, key + "result"));
  if (n == 0) return;
  // Rank 0 may host the store: it leaves once every rank has read the result (or the timeout passed).
  s.add(key + "read", 1);
  for (auto end = std::chrono::steady_clock::now() + timeout;
       io.rank == 0 && s.add(key + "read", 0) < io.world && std::chrono::steady_clock::now() < end;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string here = first != mine ? fmt::format("rank {}: sha256 {}, rank 0: {}", io.rank, mine.substr(0, 12),
                                                       first.substr(0, 12))
                                         : fmt::format("rank {} runs rank 0's", io.rank);
  throw UserError(
      fmt::format("{} of {} ranks run another plan, model or --schedule than rank 0 ({}): every rank must "
                  "load the same plan file (copy {} to every node), --model and --schedule",
                  n, io.world, here, opt.plan_path.empty() ? "it" : opt.plan_path));
}

/// --trace: every rank puts its events and memory samples in the store; rank 0 writes the trace.
void write_trace(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io,
                 const std::vector<MeasuredEvent>& events, const detail::MemoryMeter* meter) {
  Json mine{{"events", events_to_json(events)}, {"memory", samples_to_json(meter)}};
  store_set(*io.store, "gp/trace/" + std::to_string(io.rank), mine.dump());
  if (io.rank != 0) return;
  std::vector<std::vector<MeasuredEvent>> all;
  std::vector<std::vector<detail::MemorySample>> memory;
  for (int r = 0; r < io.world; ++r) {
    Json j = Json::parse(store_get(*io.store, "gp/trace/" + std::to_string(r)));
    all.push_back(events_from_json(j.at("events")));
    memory.push_back(samples_from_json(j.at("memory")));
  }
  std::ofstream f(opt.trace_path);
  GP_CHECK(f.good(), "--trace: cannot open {} for writing", opt.trace_path);
  f << measured_trace_json(run.plan, all, memory);
  f.close();
  check_written(f, "--trace", opt.trace_path);
}

/// Rank 0's closing lines: the mean step time (the first step left out when there are more) against
/// the plan's prediction, compared only when the plan's costs describe this machine.
void print_iteration_time(const TrainOptions& opt, const PreparedRun& run, const std::vector<double>& step_times_s) {
  // The first step pays one-time costs (allocations, connections): leave it out when we can.
  size_t skip = step_times_s.size() > 1 ? 1 : 0;
  double sum = 0;
  for (size_t i = skip; i < step_times_s.size(); ++i) sum += step_times_s[i];
  double measured = sum / double(step_times_s.size() - skip);
  double predicted = run.plan.predicted.iteration_time_s;
  // The prediction was made with the costs the plan records; compare only when they describe
  // this machine (a profile measured on this CPU, or this machine's cpu preset), and say which.
  plan::PredictionScope scope = predicted > 0 ? plan::prediction_scope(run.plan, opt.plan_path)
                                              : plan::PredictionScope{};
  if (predicted > 0 && scope.here)
    std::printf("iteration time: measured %.4f s, predicted %.4f s by the plan (%+.1f%%); the plan was %s\n", measured,
                predicted, 100.0 * (measured - predicted) / predicted, scope.why.c_str());
  else if (predicted > 0)  // costs of other hardware: a prediction for that machine, not this one
    std::printf("iteration time: measured %.4f s here; the plan predicts %.4f s, not for this machine: it was %s\n",
                measured, predicted, scope.why.c_str());
  else std::printf("iteration time: measured %.4f s (the plan has no prediction)\n", measured);
}

}  // namespace

WorkerResult execute_worker(const TrainOptions& opt, const PreparedRun& run, const WorkerIo& io) {
  GP_CHECK(io.world == run.plan.num_devices, "launched with world size {} but the plan has {} devices", io.world,
           run.plan.num_devices);
  set_torch_threads(opt.threads);
  const torch::Device device = detail::select_device(opt.device, io.local_rank);
  pin_to_core(opt, run.plan, io);        // before Gloo starts its threads
  detail::install_counting_allocator();  // before the stage's parameters exist
  check_same_run(opt, run, io);
  const CommChoice comm = agree_on_comm(opt, io);
  if (io.rank == 0 && io.print && !opt.json && (opt.device != "cpu" || opt.comm != "auto"))
    std::printf("communication: %s (%s)\n", comm_name(comm.kind).c_str(), comm.why.c_str());
  auto world = detail::make_communicator(comm.kind, io.store, io.rank, io.world, comm_options(opt), device);
  RankRole role = role_of_rank(run.plan, io.rank);
  std::unique_ptr<StageRunner> runner;
  std::unique_ptr<detail::MemoryMeter> meter;
  if (role.stage >= 0) {
    runner = std::make_unique<StageRunner>(opt, run, role, *world, device, spare_core(run.plan, io));
    meter = std::make_unique<detail::MemoryMeter>(runner->module().parameters(), &runner->optimizer(), device);
  }
  world->connect(transfer_pairs(run.plan));

  // Checkpoint generations (checkpoint/checkpoint_set.h): every rank's file, then latest.json.
  CheckpointSaver ckpt;
  if (!opt.checkpoint_dir.empty())
    ckpt = pipeline_saver(opt, run.plan, run.graph, io.rank, io.local_rank, role.stage,
                          runner ? &runner->module() : nullptr, runner ? &runner->optimizer() : nullptr, *world);
  const int64_t first = opt.resume ? resume_generation(ckpt) : 0;
  if (opt.resume && io.rank == 0 && io.print)
    std::printf("resumed from %s after %lld steps\n", opt.checkpoint_dir.c_str(), static_cast<long long>(first));

  WorkerResult res;
  StepStats stats(opt, run, io, res, *world, first);
  for (int64_t step = first; step < opt.steps; ++step) {
    bool trace = (!opt.trace_path.empty() || opt.record_events) && step + opt.trace_steps >= opt.steps;
    double t_start = now_s(), loss = 0;
    if (runner) {
      runner->begin_step(step);
      run_step_actions(opt, io, step, trace, *runner, *meter, res.events);
      loss = runner->end_step();
      const bool eval_next = run.eval_data && (step + 1) % opt.eval_every == 0;
      if (step + 1 < opt.steps && !eval_next) runner->post_next_step(step + 1);
    }
    // A rank without a stage (a plan that leaves a device idle) has no step to time: its loop runs
    // ahead of the others, and its start counted as the step's first made the step look 7x longer
    // than its pace (issue 35). Its row never wins the earliest start or the latest end.
    const double inf = std::numeric_limits<double>::infinity();
    stats.submit(step, loss, runner ? t_start : inf, runner ? now_s() : -inf, runner ? runner->data_seconds() : 0);
    bool last = step + 1 == opt.steps;
    if (!opt.checkpoint_dir.empty() && (last || (opt.checkpoint_every > 0 && (step + 1) % opt.checkpoint_every == 0)))
      save_generation(ckpt, step + 1);
    if (run.eval_data && (step + 1) % opt.eval_every == 0)
      res.evals.emplace_back(step, evaluate_pipeline(*world, runner.get(), run));
  }
  stats.flush();

  res.memory = gather_memory(run, opt, io, role, meter.get());
  if (!opt.trace_path.empty()) write_trace(opt, run, io, res.events, meter.get());
  if (io.rank == 0 && io.print && opt.json) {
    double predicted = run.plan.predicted.iteration_time_s;
    Json summary = train_summary_json(res.step_losses, median_step_time(res.step_times_s), predicted, res.memory);
    summary["step_period_s"] = stats.median_period();
    std::printf("%s\n", summary.dump(2).c_str());
    std::fflush(stdout);
  }
  if (io.rank == 0 && io.print && !opt.json) print_memory_report(res.memory);
  if (io.rank == 0 && io.print && !opt.json && !res.step_times_s.empty())
    print_iteration_time(opt, run, res.step_times_s);
  if (runner)
    for (auto& [n, t] : runner->module().named_parameters()) res.final_params.emplace_back(n, t.detach().clone());
  // Nobody leaves while a peer may still read from the store or finish a collective.
  std::vector<torch::Tensor> done{torch::zeros({1})};
  world->all_reduce(done, detail::Reduce::sum).wait();
  return res;
}

std::string measured_trace_json(const plan::Plan& p, const std::vector<std::vector<MeasuredEvent>>& per_rank,
                                const std::vector<std::vector<detail::MemorySample>>& memory) {
  double t0 = 1e300;
  for (const auto& evs : per_rank)
    for (const auto& e : evs) t0 = std::min(t0, e.start_s);
  schedule::TraceWriter w;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int device = static_cast<int>(r);
    RankRole role = role_of_rank(p, device);
    w.add_device(device, role.stage);
    for (const auto& e : per_rank[r])
      w.add_slice(device, e.track, e.name, e.category, e.start_s - t0, e.end_s - t0,
                  {{"step", e.step},
                   {"action", e.action},
                   {"stage", role.stage},
                   {"thread_cpu_us", std::round(e.thread_cpu_s * 1e7) / 10},
                   {"process_cpu_us", std::round(e.process_cpu_s * 1e7) / 10}});
    if (r < memory.size())  // a counter track: Perfetto draws it as a graph above the device's slices
      for (const auto& m : memory[r])
        w.add_counter(device, "tensor memory (MB)", m.t_s - t0,
                      {{"live", m.live_bytes / 1e6}, {"peak in action", m.peak_bytes / 1e6}});
  }
  return std::move(w).finish({{"source", "graphpipe train (measured)"}}).dump();
}

}  // namespace gp::runtime
