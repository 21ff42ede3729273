// Per-stage ordered action lists for one training iteration (graphpipe.schedule/1). The runtime
// executes these lists exactly; the simulator times them; the checker proves they cannot deadlock.
// Execution model (runtime, simulator and checker agree): sends are non-blocking (buffered, the
// sender never waits for the receiver); receives block until the matching send has happened.
#pragma once
#include <string>
#include <vector>

#include "plan/plan.h"
#include "support/json.h"

namespace gp::schedule {

/// Sample ranges. A stage with micro-batch size m and mini-batch B runs B/m micro-batches;
/// micro-batch k covers samples [k*m, (k+1)*m). A transfer on edge u->v moves the activations
/// (or gradients) of one sample range whose size is min(m_u, m_v): when sizes differ, the larger
/// side's micro-batch is sent/received as several pieces (regrouping; see docs/schedule.md).
enum class ActionKind {
  forward,          // micro_batch: run forward of this stage's ops
  backward,         // micro_batch: run backward (input and weight gradients together)
  backward_input,   // micro_batch: zero-bubble "B": gradients w.r.t. the stage's inputs only (sent
                    // upstream at once); keeps what backward_weight needs
  backward_weight,  // micro_batch: zero-bubble "W": the parameters' gradients of a micro-batch whose
                    // backward_input ran; nothing but the all-reduce / optimizer step waits on it
  send_act,         // peer: successor stage; samples [sample_begin, sample_begin+sample_count)
  recv_act,         // peer: predecessor stage
  send_grad,        // peer: predecessor stage (gradient of its output)
  recv_grad,        // peer: successor stage
  allreduce,        // gradient all-reduce among the stage's replicas (only when devices.size() > 1)
  optimizer_step,
};
const char* to_string(ActionKind k);
ActionKind action_kind_from_string(const std::string& s);

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = -1;  // forward/backward: the stage's own micro-batch index
  int peer = -1;         // transfers: the other stage id
  int sample_begin = 0;  // transfers: first sample of the range
  int sample_count = 0;  // transfers: number of samples
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "F mb3", "B mb0", "BI mb0", "W mb0", "send_act ->s2 [0,8)", ...

struct StageSchedule {
  int stage = 0;
  std::vector<Action> actions;
  bool operator==(const StageSchedule&) const = default;
};

struct Schedule {
  std::string kind;  // 1f1b | gpipe | zb | manual
  int mini_batch_size = 0;
  std::vector<StageSchedule> stages;  // index = stage id
  bool operator==(const Schedule&) const = default;
};

/// One compute pass of a stage: forward, backward, or the zero-bubble backward_input /
/// backward_weight, of one of the stage's own micro-batches.
struct Pass {
  ActionKind kind = ActionKind::forward;
  int micro_batch = 0;
  bool operator==(const Pass&) const = default;
};

/// The 1F1B compute order of a stage with `micro` micro-batches: min(in_flight, micro) (at least 1)
/// warm-up forwards, then one backward and one forward while forwards remain, then the remaining
/// backwards. build_schedule's "1f1b" lists; the planner's estimate runs it without a schedule.
std::vector<Pass> one_f_one_b_order(int micro, int in_flight);

/// Per stage (index = stage id), one replica, one micro-batch of the stage's own size: the pass
/// times the zb builder orders passes by.
struct PassTimes {
  std::vector<double> fwd_s, bwd_input_s, bwd_weight_s;
};
/// From the plan's recorded stage pass times (Stage::fwd_s, bwd_input_s, bwd_weight_s) when every
/// stage has them, else equal times (1:1:1, the zero-bubble paper's assumption), each a third of
/// tps_s x micro_batch_size when every stage has tps_s, else 1.
PassTimes pass_times_of(const plan::Plan& p);

/// Builds a schedule for a (validated) plan; kind: a plan::kScheduleKinds name (UserError
/// otherwise). "zb" orders its passes by pass_times_of(p).
Schedule build_schedule(const plan::Plan& p, const std::string& kind = "1f1b");
/// The same with the pass times "zb" orders by (1f1b and gpipe ignore them). ZB-H1 on the stage
/// DAG: a list scheduler simulates one replica per stage with these times and zero transfer time;
/// a free stage runs, in priority order, (1) the backward_input of its oldest micro-batch whose
/// forward ran and whose output gradients have all arrived, (2) the forward of its next
/// micro-batch when its inputs have arrived and fewer than in_flight micro-batches are held
/// (forwards done minus backward_weights done: 1F1B's activation bound), (3) its oldest pending
/// backward_weight; else it waits. Ties by time, then stage id. O(passes log stages).
Schedule build_schedule(const plan::Plan& p, const std::string& kind, const PassTimes& times);

Json schedule_to_json(const Schedule& s);
Schedule schedule_from_json(const Json& j, const std::string& file);
Schedule load_schedule(const std::string& path);
void save_schedule(const std::string& path, const Schedule& s);

/// Proves the schedule runs against the plan: every recv has its matching send (same edge, same
/// samples, same order), C4 holds per stage, and a symbolic execution of all stages finishes.
/// Throws UserError naming the stages and actions that wait on each other on failure.
void check_schedule(const Schedule& s, const plan::Plan& p, const std::string& where = "schedule");

/// Peak number of micro-batches whose activations a stage holds at once under the schedule: a
/// micro-batch counts from its forward until its backward or its backward_weight.
std::vector<int> peak_in_flight(const Schedule& s);

/// Micro-batches of a stage per iteration: mini_batch / micro_batch_size.
int num_micro_batches(const plan::Stage& st, int mini_batch_size);

/// The transfer pieces of an edge whose ends have micro-batch sizes mbs_from and mbs_to: sample
/// ranges {begin, count} cut at every micro-batch boundary of either side, in sample order (all of
/// size min(mbs_from, mbs_to) when one divides the other). Each piece lies inside one micro-batch
/// of each end.
std::vector<std::pair<int, int>> edge_pieces(int mbs_from, int mbs_to, int mini_batch);
/// The same pieces inside samples [begin, end) only (both ends on a boundary of both sides, e.g.
/// one micro-batch of either end): O(pieces returned), not O(mini_batch / smaller size).
std::vector<std::pair<int, int>> edge_pieces(int mbs_from, int mbs_to, int begin, int end);

}  // namespace gp::schedule
