// ZB-H1 on a stage DAG: the list scheduler behind build_schedule(p, "zb", times), and the pass
// times it uses by default (pass_times_of). See docs/schedule.md ("Zero bubble").
#include "schedule/zero_bubble.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <tuple>

namespace gp::schedule {

PassTimes pass_times_of(const plan::Plan& p) {
  PassTimes t;
  const bool recorded = !p.stages.empty() && std::all_of(p.stages.begin(), p.stages.end(), [](const plan::Stage& s) {
    return s.fwd_s + s.bwd_input_s + s.bwd_weight_s > 0;
  });
  const bool tps = std::all_of(p.stages.begin(), p.stages.end(), [](const plan::Stage& s) { return s.tps_s > 0; });
  for (const plan::Stage& s : p.stages) {
    if (recorded) {
      t.fwd_s.push_back(s.fwd_s);
      t.bwd_input_s.push_back(s.bwd_input_s);
      t.bwd_weight_s.push_back(s.bwd_weight_s);
    } else {
      // 1:1:1, the zero-bubble paper's assumption, at the stage's time per micro-batch.
      const double x = tps ? s.tps_s * s.micro_batch_size / 3 : 1.0;
      t.fwd_s.push_back(x);
      t.bwd_input_s.push_back(x);
      t.bwd_weight_s.push_back(x);
    }
  }
  return t;
}

namespace {

struct StageState {
  int n = 0, m = 1, in_flight = 1;
  int f = 0, bi = 0, w = 0;  // passes done (each kind runs in micro-batch order)
  double free_at = 0;
  std::vector<double> f_end, bi_end;  // end time of each micro-batch's forward / backward_input
  std::vector<Pass> order;
};

class ListScheduler {
 public:
  ListScheduler(const plan::Plan& p, const PassTimes& t) : p_(p), t_(t) {
    const size_t n = p.stages.size();
    for (const auto* v : {&t.fwd_s, &t.bwd_input_s, &t.bwd_weight_s})
      GP_CHECK(v->size() == n, "zb schedule: pass times for {} stages, the plan has {}", v->size(), n);
    for (size_t i = 0; i < n; ++i)
      for (double x : {t.fwd_s[i], t.bwd_input_s[i], t.bwd_weight_s[i]})
        GP_CHECK(std::isfinite(x) && x >= 0, "zb schedule: stage {}: pass time {} is not a finite time >= 0", i, x);
    st_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const plan::Stage& s = p.stages[i];
      StageState& x = st_[i];
      x.n = num_micro_batches(s, p.mini_batch_size);
      x.m = s.micro_batch_size;
      x.in_flight = std::max(s.in_flight, 1);
      x.f_end.assign(x.n, 0);
      x.bi_end.assign(x.n, 0);
      x.order.reserve(3 * static_cast<size_t>(x.n));
    }
  }

  std::vector<std::vector<Pass>> run() {
    for (size_t i = 0; i < st_.size(); ++i) q_.push({0.0, static_cast<int>(i)});
    while (!q_.empty()) {
      auto [t, s] = q_.top();
      q_.pop();
      if (st_[s].free_at > t) continue;  // busy: its own completion wakes it again
      step(s, t);
    }
    std::vector<std::vector<Pass>> out;
    for (size_t i = 0; i < st_.size(); ++i) {
      const StageState& x = st_[i];
      if (x.w != x.n)
        throw UserError(
            fmt::format("zb schedule of the plan: stage {} stops after {} forwards, {} backward_inputs and {} "
                        "backward_weights of {} micro-batches (its in_flight {} is too small for its successors?)",
                        i, x.f, x.bi, x.w, x.n, x.in_flight));
      out.push_back(std::move(st_[i].order));
    }
    return out;
  }

 private:
  // The last micro-batch of a peer with micro-batch size m_peer that overlaps our micro-batch k.
  static int last_overlap(int k, int m, int m_peer) { return ((k + 1) * m - 1) / m_peer; }

  bool acts_arrived(int s, int k, double t) const {
    for (int u : p_.stages[s].inputs_from) {
      const StageState& x = st_[u];
      int j = last_overlap(k, st_[s].m, x.m);
      if (x.f <= j || x.f_end[j] > t) return false;
    }
    return true;
  }
  bool grads_arrived(int s, int k, double t) const {
    for (int v : p_.stages[s].outputs_to) {
      const StageState& x = st_[v];
      int j = last_overlap(k, st_[s].m, x.m);
      if (x.bi <= j || x.bi_end[j] > t) return false;
    }
    return true;
  }

  // Stage s is free at time t: start the first runnable pass by priority BI, F, W, or wait.
  void step(int s, double t) {
    StageState& x = st_[s];
    double end = t;
    if (x.bi < x.f && grads_arrived(s, x.bi, t)) {
      end = t + t_.bwd_input_s[s];
      x.bi_end[x.bi] = end;
      x.order.push_back({ActionKind::backward_input, x.bi++});
      for (int u : p_.stages[s].inputs_from) q_.push({end, u});
    } else if (x.f < x.n && x.f - x.w < x.in_flight && acts_arrived(s, x.f, t)) {
      end = t + t_.fwd_s[s];
      x.f_end[x.f] = end;
      x.order.push_back({ActionKind::forward, x.f++});
      for (int v : p_.stages[s].outputs_to) q_.push({end, v});
    } else if (x.w < x.bi) {
      end = t + t_.bwd_weight_s[s];
      x.order.push_back({ActionKind::backward_weight, x.w++});
    } else {
      return;  // waits: a predecessor's forward or a successor's backward_input wakes it
    }
    x.free_at = end;
    q_.push({end, s});
  }

  using Wake = std::tuple<double, int>;  // (time, stage): ties by time, then stage id
  const plan::Plan& p_;
  const PassTimes& t_;
  std::vector<StageState> st_;
  std::priority_queue<Wake, std::vector<Wake>, std::greater<>> q_;
};

}  // namespace

std::vector<std::vector<Pass>> zero_bubble_order(const plan::Plan& p, const PassTimes& times) {
  return ListScheduler(p, times).run();
}

}  // namespace gp::schedule
