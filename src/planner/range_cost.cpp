// RangeCost: prefix sums per sequence and live-tensor lists per cut (see range_cost.h).
#include "planner/range_cost.h"

#include "planner/engine.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace gp::planner::detail {

RangeCost::RangeCost(const cost::CostModel& cm, const Structure& st, int micro_batch, int mini_batch, bool same_node)
    : cm_(cm),
      st_(st),
      mbs_(micro_batch),
      mini_(mini_batch),
      plogs_(std::bit_width(static_cast<unsigned>(std::min(cm.cluster().num_devices(), micro_batch)))),
      same_node_(same_node),
      seq_(st.seqs.size()),
      where_(cm.graph().num_ops(), std::numeric_limits<int>::min()) {}

void RangeCost::prepare(int s) {
  SeqData& d = seq_[s];
  const Seq& q = st_.seqs[s];
  const ir::Graph& g = cm_.graph();
  const int k = static_cast<int>(q.items.size());
  std::vector<OpId> flat;
  d.off.assign(k + 1, 0);
  for (int j = 0; j < k; ++j) {
    d.off[j] = static_cast<int>(flat.size());
    flat.insert(flat.end(), q.items[j].ops.begin(), q.items[j].ops.end());
  }
  d.off[k] = static_cast<int>(flat.size());
  const size_t n = flat.size();
  d.compute.assign(plogs_, std::vector<long double>(n + 1, 0));
  d.act.assign(plogs_, std::vector<long double>(n + 1, 0));
  d.state.assign(n + 1, 0);
  d.param.assign(n + 1, 0);
  d.tensors.assign(n + 1, 0);
  d.lb.assign(n + 1, 0);
  for (size_t x = 0; x < n; ++x) {
    const OpId op = flat[x];
    double lb = std::numeric_limits<double>::infinity();
    for (int pl = 0; pl < plogs_; ++pl) {
      const int64_t b = mbs_ >> pl;  // both powers of two: ceil(mbs / p) = mbs >> plog
      const double t = cm_.op_step_time(op, b);
      d.compute[pl][x + 1] = d.compute[pl][x] + t;
      d.act[pl][x + 1] = d.act[pl][x] + cm_.saved_bytes(op, b);
      lb = std::min(lb, t * (1 << pl) / mbs_);
    }
    d.state[x + 1] = d.state[x] + cm_.state_bytes(op);
    d.param[x + 1] = d.param[x] + static_cast<double>(g.costs(op).param_bytes);
    d.tensors[x + 1] = d.tensors[x] + g.costs(op).param_tensors;
    d.lb[x + 1] = d.lb[x] + lb;
  }
  // Live tensors per cut c (between items c-1 and c): producers p with item(p) < c (or outside the
  // sequence) read by some item >= c (k when read outside the sequence).
  for (int j = 0; j < k; ++j)
    for (OpId op : q.items[j].ops) where_[op.v] = j;
  d.live.assign(k + 1, {});
  std::vector<OpId> producers = flat;
  for (OpId op : flat)
    for (OpId p : g.preds(op))
      if (where_[p.v] == std::numeric_limits<int>::min()) producers.push_back(p);
  std::sort(producers.begin(), producers.end());
  producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
  std::vector<int> reads;
  for (OpId p : producers) {
    const int own = where_[p.v] == std::numeric_limits<int>::min() ? -1 : where_[p.v];
    reads.clear();
    for (OpId c : g.succs(p)) {
      const int w = where_[c.v] == std::numeric_limits<int>::min() ? k : where_[c.v];
      if (w > own) reads.push_back(w);
    }
    if (own < 0) {  // outside the sequence: only its readers inside matter
      reads.erase(std::remove(reads.begin(), reads.end(), k), reads.end());
    }
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    const double bytes = cm_.output_bytes(p, 1);  // fp16 under mixed precision
    int c = own + 1;
    for (int r : reads)
      for (; c <= r; ++c) d.live[c].push_back({own, r, bytes});
  }
  for (OpId op : flat) where_[op.v] = std::numeric_limits<int>::min();
  d.ready = true;
}

RangeCost::Cost RangeCost::cost(int s, int i, int m, int plog) {
  Cost c = cheap(s, i, m, plog);
  finish(s, i, m, plog, &c);
  return c;
}

RangeCost::Cost RangeCost::cheap(int s, int i, int m, int plog) {
  SeqData& d = seq_[s];
  if (!d.ready) prepare(s);
  const int a = d.off[i], z = d.off[m];
  Cost c;
  c.compute_tps = (static_cast<double>(d.compute[plog][z] - d.compute[plog][a]) + cm_.cluster().device.pass_s()) / mbs_;
  c.state = static_cast<double>(d.state[z] - d.state[a]);
  c.act = static_cast<double>(d.act[plog][z] - d.act[plog][a]);
  return c;
}

void RangeCost::finish(int s, int i, int m, int plog, Cost* c) {
  SeqData& d = seq_[s];
  const int a = d.off[i], z = d.off[m];
  const int64_t b = mbs_ >> plog;
  const double compute = static_cast<double>(d.compute[plog][z] - d.compute[plog][a]) + cm_.cluster().device.pass_s();
  double comm = 0;
  for (const Live& l : d.live[i])  // producers outside [i, m) read inside it
    if (l.next < m) comm += 2 * cm_.p2p_time(same_node_, l.bytes * static_cast<double>(b));
  for (const Live& l : d.live[m])  // ops inside [i, m) read after it
    if (l.item >= i) comm += 2 * cm_.p2p_time(same_node_, l.bytes * static_cast<double>(b));
  const double param = static_cast<double>(d.param[z] - d.param[a]);
  c->tps = (compute + comm) / mbs_ +
           (cm_.allreduce_time(1 << plog, same_node_, param) +
            cost::optimizer_step_time(cm_, c->state, static_cast<double>(d.tensors[z] - d.tensors[a]))) /
               mini_;
}

double RangeCost::work_lower_bound(int s, int i, int m) {
  SeqData& d = seq_[s];
  if (!d.ready) prepare(s);
  return static_cast<double>(d.lb[d.off[m]] - d.lb[d.off[i]]);
}

}  // namespace gp::planner::detail
