// The planner DP's bounds (dp_bounds.h).
#include "planner/dp_bounds.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gp::planner::detail {

Bounds::Bounds(const cost::CostModel& cm, const Structure& st, const SizeUnits& units, int num_devices,
               double memory_limit, DpStats* stats)
    : cm_(cm), st_(st), units_(units), n_(num_devices), mem_limit_(memory_limit), stats_(stats) {
  const std::vector<int>& sizes = units.sizes();
  act_unit_.assign(cm.graph().num_ops(), std::numeric_limits<double>::infinity());
  act_dev_.assign(cm.graph().num_ops(), std::numeric_limits<double>::infinity());
  for (size_t o = 0; o < act_unit_.size(); ++o)
    for (size_t z = 0; z < sizes.size(); ++z)
      for (int p = 1; p <= std::min(n_, sizes[z]); p *= 2) {
        const double a = cm.saved_bytes(OpId(static_cast<int32_t>(o)), sizes[z] / p);
        act_unit_[o] = std::min(act_unit_[o], p * a / (1 << units.wlog(static_cast<int>(z))));
        act_dev_[o] = std::min(act_dev_[o], a);
      }
  mem_state_.resize(st.seqs.size());
  mem_act_.resize(st.seqs.size());
  spine_.resize(st.seqs.size());
  chain_stage_.resize(st.seqs.size());
  chain_act_.resize(st.seqs.size());
  chain_dev_.resize(st.seqs.size());
  work_lb_.resize(st.seqs.size());
}

bool Bounds::memory_never_fits() const {
  double need = 0;
  for (size_t o = 0; o < cm_.graph().num_ops(); ++o) {
    const OpId op(static_cast<int32_t>(o));
    double least = std::numeric_limits<double>::infinity();
    for (int b : units_.sizes())
      for (int p = 1; p <= std::min(n_, b); p *= 2)
        least = std::min(least, static_cast<double>(p) * cm_.saved_bytes(op, b / p));
    need += cm_.state_bytes(op) + least;
  }
  return need > n_ * mem_limit_ * (1 + 1e-9);
}

void Bounds::prepare_memory(int s) {
  std::vector<double>& state = mem_state_[s];
  std::vector<double>& act = mem_act_[s];
  std::vector<double>& spine = spine_[s];
  const auto& items = st_.seqs[s].items;
  state.assign(items.size() + 1, 0);
  act.assign(items.size() + 1, 0);
  spine.assign(items.size() + 1, 0);
  for (size_t j = 0; j < items.size(); ++j) {
    double st = 0, a = 0;
    for (OpId op : items[j].ops) st += cm_.state_bytes(op), a += act_unit_[op.v];
    state[j + 1] = state[j] + st;
    act[j + 1] = act[j] + a;
    // A nested item's ops may spread over several stages: only single ops count.
    spine[j + 1] = spine[j] + (mem_bound_ && items[j].seq < 0 ? st + act_dev_[items[j].ops.front().v] : 0);
  }
  const Seq& q = st_.seqs[s];
  if (q.parallel || !std::all_of(items.begin(), items.end(), [](const Item& it) { return it.seq < 0; })) return;
  // A chain: pack it from its end into stages whose ops fit one device (greedy: no plan puts an op
  // in a stage nearer the end).
  const int k = static_cast<int>(items.size());
  std::vector<int>& stage = chain_stage_[s];
  stage.assign(k, 1);
  const double cap = mem_limit_ * (1 + 1e-9);
  double fill = 0;
  for (int j = k - 1, c = 1; j >= 0; --j) {
    const double x = spine[j + 1] - spine[j];
    if (fill > 0 && fill + x > cap) ++c, fill = 0;
    fill += x;
    stage[j] = c;
  }
  std::vector<double>& ca = chain_act_[s];
  ca.assign(k + 1, 0);
  for (int j = 0; j < k; ++j) ca[j + 1] = ca[j] + stage[j] * (act[j + 1] - act[j]);
}

bool Bounds::rest_may_beat(int s, int j, int down, int best) {
  if (best < 0) return true;
  const int r = best - down - 2;  // the most parts a rest shallower than best - 1 can have
  if (r < 1) return false;
  if (spine_[s].empty()) prepare_memory(s);
  const std::vector<double>& sp = spine_[s];
  // A chain: the fewest stages exactly (greedy); otherwise the single ops' need over the limit.
  const bool may = !chain_stage_[s].empty() ? chain_stage_[s][j] <= r
                                            : sp.back() - sp[j] <= r * mem_limit_ * (1 + 1e-9);
  stats_->rest_pruned += !may;
  return may;
}

int Bounds::first_rest_beating(int s, int j, int down, int best) {
  const int k = static_cast<int>(st_.seqs[s].items.size());
  if (best < 0) return j;
  const int r = best - down - 2;
  if (r < 1) return k;
  if (spine_[s].empty()) prepare_memory(s);
  int m = 0;
  if (const std::vector<int>& stage = chain_stage_[s]; !stage.empty()) {
    m = static_cast<int>(std::partition_point(stage.begin() + j, stage.end(), [&](int c) { return c > r; }) -
                         stage.begin());
  } else {
    const std::vector<double>& sp = spine_[s];
    const double from = sp.back() - r * mem_limit_ * (1 + 1e-9);  // the rest [m, k) must need at most r parts
    m = static_cast<int>(std::lower_bound(sp.begin() + j, sp.begin() + k, from) - sp.begin());
  }
  stats_->rest_pruned += m > j;
  return m;
}

void Bounds::chain_devices(int s) {
  const int k = static_cast<int>(st_.seqs[s].items.size());
  const std::vector<double>& state = mem_state_[s];
  const std::vector<double>& act = mem_act_[s];
  const double cap = mem_limit_ * (1 + 1e-9), inf = std::numeric_limits<double>::infinity();
  const int top = std::clamp(units_.num_micro() - 1, 0, 16);  // c = top stands for "top or more stages after"
  const size_t w = static_cast<size_t>(top) + 1;
  // q[i * w + c]: the fewest devices for [i, k) whose first stage has c stages after it (a row per
  // item, so the loop over c runs on consecutive entries).
  std::vector<double> q((static_cast<size_t>(k) + 1) * w, inf);
  // next[m * w + c]: the rest [m, k) after a stage with c stages after it: q[m][c - 1], and for
  // c = top also q[m][top] (c = 0 is only the stage to the end, which has nothing after it).
  std::vector<double> next(q.size(), inf);
  std::vector<double> f(w);
  const size_t c0 = top == 0 ? 0 : 1;  // with top = 0, c = 0 means "0 or more stages after"
  for (int c = 0; c <= top; ++c) f[c] = std::min(c + 1, units_.num_micro());
  for (int i = k - 1; i >= 0; --i) {
    double* qi = &q[static_cast<size_t>(i) * w];
    for (int m = i + 1; m <= k; ++m) {
      const double st = state[m] - state[i];
      if (st >= cap) break;
      const double a = act[m] - act[i];
      if (m == k) {  // the stage to the end has nothing after it
        qi[0] = std::min(qi[0], std::max(1.0, f[0] * a / (cap - st)));
        continue;
      }
      const double* rest = &next[static_cast<size_t>(m) * w];
      for (size_t c = c0; c < w; ++c) {
        const double need = f[c] * a / (cap - st);
        qi[c] = std::min(qi[c], (need > 1.0 ? need : 1.0) + rest[c]);
      }
    }
    double* ni = &next[static_cast<size_t>(i) * w];
    for (size_t c = 1; c < w; ++c) ni[c] = qi[c - 1];
    ni[top] = top == 0 ? qi[0] : std::min(qi[top - 1], qi[top]);
  }
  std::vector<double>& out = chain_dev_[s];
  out.assign(k + 1, 0);
  for (int i = k - 1; i >= 0; --i) {
    out[i] = inf;
    for (size_t c = 0; c < w; ++c) out[i] = std::min(out[i], q[static_cast<size_t>(i) * w + c]);
    // A suffix needs at least what a shorter one does (drop its first op: no stage grows), so the
    // array is non-increasing in i even where rounding says otherwise (first_rest_fitting bisects it).
    out[i] = std::max(out[i], out[i + 1]);
  }
}

int Bounds::first_rest_fitting(int s, int j, int devices, int down) {
  if (down != 0 || !mem_bound_ || chain_stage_[s].empty()) return j;
  if (chain_dev_[s].empty()) chain_devices(s);
  const std::vector<double>& need = chain_dev_[s];  // non-increasing: a shorter suffix needs no more
  const double have = devices * (1 + 1e-9);
  if (need[j] <= have) return j;  // the common case: no stage end is ruled out
  const int m = static_cast<int>(
      std::partition_point(need.begin() + j, need.end() - 1, [&](double x) { return x > have; }) - need.begin());
  stats_->rest_pruned += m > j;
  return m;
}

// The least device-seconds per sample of items [i, end) of sequence s: per op the least over the
// stage sizes z and degrees p of p x its time at z / p over z (a plan may give each op any size),
// summed in the order RangeCost sums its per-size bound (with one size, the same value).
double Bounds::work_lower_bound(int s, int i) {
  std::vector<long double>& w = work_lb_[s];
  if (w.empty()) {
    const auto& items = st_.seqs[s].items;
    w.assign(items.size() + 1, 0);
    long double acc = 0;
    for (size_t j = 0; j < items.size(); ++j) {
      for (OpId op : items[j].ops) {
        double lb = std::numeric_limits<double>::infinity();
        for (int z : units_.sizes())
          for (int pl = 0; (1 << pl) <= std::min(n_, z); ++pl)
            lb = std::min(lb, cm_.op_step_time(op, z >> pl) * (1 << pl) / z);
        acc += lb;
      }
      w[j + 1] = acc;
    }
  }
  return static_cast<double>(w.back() - w[i]);
}

// A stage on p devices computes at least its ops' least device-seconds per sample / p, so a plan
// of the suffix on d devices (sum of p <= d) has a stage computing at least work_lower_bound / d.
bool Bounds::over_cap(int s, int i, int d) {
  return cap_ != std::numeric_limits<double>::infinity() && work_lower_bound(s, i) > d * cap_ * (1 + 1e-9);
}

bool Bounds::memory_rules_out(int s, int i, int d, int down) {
  if (!mem_bound_) return false;
  if (mem_state_[s].empty()) prepare_memory(s);
  const std::vector<double>& state = mem_state_[s];
  const std::vector<double>& act = mem_act_[s];
  const double have = d * mem_limit_ * (1 + 1e-9);
  double need = state.back() - state[i] + units_.after(0, down) * (act.back() - act[i]);
  // Every unit count is at most M: when even that fits, the finer chain count is not needed.
  const bool may_bind = state.back() - state[i] + units_.num_micro() * (act.back() - act[i]) > have;
  if (const std::vector<int>& stage = chain_stage_[s]; may_bind && !stage.empty()) {
    // Items [i, b) sit in stages at least M - down from the end (in-flight capped at M), the rest
    // in their greedy stage's: min(down + stage, M) units each.
    const int b = std::max(
        i, static_cast<int>(
               std::partition_point(stage.begin(), stage.end(), [&](int c) { return c >= units_.num_micro() - down; }) -
               stage.begin()));
    const std::vector<double>& ca = chain_act_[s];
    need = state.back() - state[i] + units_.num_micro() * (act[b] - act[i]) + (ca.back() - ca[b]) +
           down * (act.back() - act[b]);
  }
  bool out = need > have;
  if (!out && down == 0 && !chain_stage_[s].empty()) {
    if (chain_dev_[s].empty()) chain_devices(s);
    out = chain_dev_[s][i] > d * (1 + 1e-9);
  }
  stats_->memory_pruned += out;
  return out;
}

}  // namespace gp::planner::detail
