// The recurrence behind the planner's iteration estimate (timeline.h): each stage's compute passes
// in its schedule's order (1F1B, GPipe, zero-bubble).
#include "planner/timeline.h"

#include "plan/schedule_kind.h"

#include <algorithm>
#include <deque>
#include <numeric>

namespace gp::planner::detail {

using schedule::ActionKind;

namespace {

// Plans with up to about this many micro-batches on their smallest-size stage run in full.
constexpr int kDirectMicroBatches = 512;

// A stage edge u -> v: the activations of a sample cross it forward, its gradient backward. Each
// replica of the sender sends its share of a micro-batch in segments, one per overlapping
// receiver replica: `seg` samples each, `seg_s` seconds each on the sender's port.
struct Edge {
  int u = 0, v = 0;
  int seg = 1;
  double seg_s = 0;
  double send_cpu_s = 0, recv_cpu_s = 0;  // a segment's CPU time at each end (cost::MessageCpu)
};

struct StageState {
  int m = 1, share = 1, micro = 1;            // size, samples per replica, micro-batches
  const std::vector<Pass>* passes = nullptr;  // in the schedule's order
  size_t pc = 0;                              // next pass
  double free = 0, port = 0;                  // when the replica and its send port are next free
  std::vector<int> in_edges, out_edges;       // inputs_from / outputs_to order
  // Per own micro-batch: pieces still to arrive and when the last arrived (activations, gradients).
  std::vector<int> act_left, grad_left;
  std::vector<double> act_at, grad_at;
};

class Recurrence {
 public:
  // `mini_batch`: the samples per iteration to run (the plan's, or fewer for the extrapolation);
  // `passes`: each stage's compute passes over that many samples.
  Recurrence(const plan::Plan& p, const cost::CostModel& cm, const TimelineCosts& c, int mini_batch,
             const std::vector<std::vector<Pass>>& passes)
      : p_(p), c_(c) {
    const size_t n = p.stages.size();
    GP_ASSERT(passes.size() == n, "timeline: passes for {} stages, plan has {}", passes.size(), n);
    st_.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const plan::Stage& s = p.stages[k];
      StageState& x = st_[k];
      x.m = s.micro_batch_size;
      x.share = std::max(1, x.m / static_cast<int>(s.devices.size()));
      x.micro = mini_batch / x.m;
      x.passes = &passes[k];
      x.act_left.assign(x.micro, 0);
      x.grad_left.assign(x.micro, 0);
      x.act_at.assign(x.micro, 0);
      x.grad_at.assign(x.micro, 0);
    }
    for (size_t u = 0; u < n; ++u)
      for (size_t j = 0; j < p.stages[u].outputs_to.size(); ++j) add_edge(cm, static_cast<int>(u), j);
  }

  double run() {
    std::deque<int> work;
    std::vector<char> queued(st_.size(), 1);
    for (size_t k = 0; k < st_.size(); ++k) work.push_back(static_cast<int>(k));
    while (!work.empty()) {
      const int k = work.front();
      work.pop_front();
      queued[k] = 0;
      for (int peer : advance(k))
        if (!queued[peer]) queued[peer] = 1, work.push_back(peer);
    }
    double end = 0;
    for (size_t k = 0; k < st_.size(); ++k) {
      GP_ASSERT(st_[k].pc == st_[k].passes->size(), "timeline: stage {} stuck at pass {} of {}", k, st_[k].pc,
                st_[k].passes->size());
      end = std::max(end, st_[k].free + c_.tail_s[k]);
    }
    return end;
  }

 private:
  void add_edge(const cost::CostModel& cm, int u, size_t j) {
    Edge e;
    e.u = u;
    e.v = p_.stages[u].outputs_to[j];
    e.seg = std::min(st_[u].share, st_[e.v].share);
    const double bytes = e.seg * c_.out_bytes_per_sample[u][j];
    const int a = p_.stages[u].devices.front(), b = p_.stages[e.v].devices.front();
    e.seg_s = cm.p2p_time(a, b, bytes);
    const cost::Cluster& cl = cm.cluster();
    const cost::LinkSpec& link = cl.same_node(a, b) ? cl.intra : cl.inter;
    e.send_cpu_s = link.cpu.send(bytes);
    e.recv_cpu_s = link.cpu.recv(bytes);
    const int id = static_cast<int>(edges_.size());
    edges_.push_back(e);
    st_[u].out_edges.push_back(id);
    st_[e.v].in_edges.push_back(id);
    // Pieces per micro-batch: a larger receiver gathers several of the sender's micro-batches.
    for (int& left : st_[e.v].act_left) left += std::max(1, st_[e.v].m / st_[u].m);
    for (int& left : st_[u].grad_left) left += std::max(1, st_[u].m / st_[e.v].m);
  }

  // Runs stage k's passes until one waits for an input; returns the stages it sent to. A forward
  // waits for activations and sends them on; a backward (or B) waits for gradients and sends them
  // back; a W waits for the stage only and sends nothing.
  std::vector<int> advance(int k) {
    StageState& s = st_[k];
    std::vector<int> woke;
    while (s.pc < s.passes->size()) {
      const Pass ps = (*s.passes)[s.pc];
      const int mb = ps.micro_batch;
      if (ps.kind == ActionKind::backward_weight) {
        s.free += c_.bwd_weight_s[k];
        ++s.pc;
        continue;
      }
      const bool fwd = ps.kind == ActionKind::forward;
      if ((fwd ? s.act_left : s.grad_left)[mb] > 0) break;
      double start = std::max(s.free, (fwd ? s.act_at : s.grad_at)[mb]);
      // Taking the micro-batch's messages (one per segment of each edge it arrives on) holds the stage.
      for (int id : fwd ? s.in_edges : s.out_edges) start += segments(k, edges_[id]) * edges_[id].recv_cpu_s;
      s.free = start + (fwd ? c_.fwd_s : ps.kind == ActionKind::backward_input ? c_.bwd_input_s : c_.bwd_s)[k];
      ++s.pc;
      for (int id : fwd ? s.out_edges : s.in_edges) {
        const int peer = fwd ? edges_[id].v : edges_[id].u;
        send(k, mb, edges_[id], peer, fwd);
        s.free += segments(k, edges_[id]) * edges_[id].send_cpu_s;  // and posting its own
        woke.push_back(peer);
      }
    }
    return woke;
  }

  // The segments of edge e a replica of stage k sends or receives per micro-batch of its own.
  int segments(int k, const Edge& e) const { return std::max(1, st_[k].share / e.seg); }

  // Stage `from`'s micro-batch mb crosses edge e to `to` (activations when fwd, else gradients):
  // the sender's port carries its segments in sample order; each receiver micro-batch inside mb
  // has arrived when the last segment of it has.
  void send(int from, int mb, const Edge& e, int to, bool fwd) {
    StageState& s = st_[from];
    StageState& r = st_[to];
    const double start = std::max(s.free, s.port);
    const int per_share = s.share / e.seg;
    s.port = start + per_share * e.seg_s;
    const int lo = mb * s.m, hi = lo + s.m;
    for (int i = lo / r.m; i * r.m < hi; ++i) {
      const int a = std::max(lo, i * r.m), b = std::min(hi, (i + 1) * r.m);
      const int segs = b - a >= s.share ? per_share : ((a - lo) % s.share + (b - a) + e.seg - 1) / e.seg;
      const double at = start + std::min(segs, per_share) * e.seg_s;
      --(fwd ? r.act_left : r.grad_left)[i];
      double& arrived = (fwd ? r.act_at : r.grad_at)[i];
      arrived = std::max(arrived, at);
    }
  }

  const plan::Plan& p_;
  const TimelineCosts& c_;
  std::vector<StageState> st_;
  std::vector<Edge> edges_;
};

}  // namespace

schedule::Schedule plan_schedule(const plan::Plan& p) { return schedule::build_schedule(p, p.schedule); }

std::vector<std::vector<Pass>> schedule_passes(const schedule::Schedule& s) {
  std::vector<std::vector<Pass>> out;
  for (const schedule::StageSchedule& st : s.stages) {
    std::vector<Pass>& ps = out.emplace_back();
    for (const schedule::Action& a : st.actions)
      if (a.kind == ActionKind::forward || a.kind == ActionKind::backward || a.kind == ActionKind::backward_input ||
          a.kind == ActionKind::backward_weight)
        ps.push_back({a.kind, a.micro_batch});
  }
  return out;
}

namespace {

// Each stage's passes over `mini_batch` samples under the plan's schedule.
std::vector<std::vector<Pass>> plan_passes(const plan::Plan& p, int mini_batch) {
  if (plan::find_schedule_kind(p.schedule) == plan::ScheduleKind::one_f_one_b) {
    std::vector<std::vector<Pass>> out;
    for (const plan::Stage& s : p.stages)
      out.push_back(schedule::one_f_one_b_order(mini_batch / s.micro_batch_size, s.in_flight));
    return out;
  }
  if (mini_batch == p.mini_batch_size) return schedule_passes(plan_schedule(p));
  plan::Plan shorter = p;
  shorter.mini_batch_size = mini_batch;
  return schedule_passes(plan_schedule(shorter));
}

double run_for(const plan::Plan& p, const cost::CostModel& cm, const TimelineCosts& c, int mini_batch) {
  return Recurrence(p, cm, c, mini_batch, plan_passes(p, mini_batch)).run();
}

}  // namespace

double timeline_iteration_s(const plan::Plan& p, const cost::CostModel& cm, const TimelineCosts& c) {
  GP_ASSERT(c.fwd_s.size() == p.stages.size() && c.bwd_s.size() == p.stages.size() &&
                c.tail_s.size() == p.stages.size() && c.out_bytes_per_sample.size() == p.stages.size(),
            "timeline: costs for {} stages, plan has {}", c.fwd_s.size(), p.stages.size());
  GP_ASSERT(plan::find_schedule_kind(p.schedule) != plan::ScheduleKind::zb ||
                (c.bwd_input_s.size() == p.stages.size() && c.bwd_weight_s.size() == p.stages.size()),
            "timeline: zb needs B and W times for {} stages", p.stages.size());
  // Past a few hundred micro-batches the pipeline is in its periodic regime: each further sample
  // adds the same time (the schedule's steady state), so two shorter runs give the slope and the
  // rest is extrapolated (the tails do not depend on the mini-batch). Keeps a plan of 65,536
  // micro-batches as cheap as one of 512.
  int smallest = p.mini_batch_size, step = 1;
  for (const plan::Stage& s : p.stages) {
    smallest = std::min(smallest, s.micro_batch_size);
    step = std::lcm(step, s.micro_batch_size);
  }
  const int64_t b1 = (int64_t{kDirectMicroBatches} / 2 * smallest + step - 1) / step * step;
  if (p.mini_batch_size <= 2 * (2 * b1)) return run_for(p, cm, c, p.mini_batch_size);
  const double t1 = run_for(p, cm, c, static_cast<int>(b1));
  const double t2 = run_for(p, cm, c, static_cast<int>(2 * b1));
  // The extrapolation never predicts less than a stage's own passes and tail (what the full
  // recurrence guarantees, and what the planner's size bound relies on: timeline_floor_s).
  return std::max(t2 + (t2 - t1) * static_cast<double>(p.mini_batch_size - 2 * b1) / static_cast<double>(b1),
                  timeline_floor_s(p, c));
}

double timeline_floor_s(const plan::Plan& p, const TimelineCosts& c) {
  double floor = 0;
  for (size_t k = 0; k < p.stages.size(); ++k)
    floor = std::max(floor, p.mini_batch_size / p.stages[k].micro_batch_size * (c.fwd_s[k] + c.bwd_s[k]) + c.tail_s[k]);
  return floor;
}

}  // namespace gp::planner::detail
