// Internal: O(cut size) stage costs for the DP's ranges of sequence items (prefix sums over each
// sequence's ops plus the tensors live at each cut), equal to cost::stage_cost up to rounding.
#pragma once
#include <cstdint>
#include <vector>

#include "cost/cost_model.h"

namespace gp::planner::detail {

struct Structure;

/// For one structure and one micro-batch size: the cost of the stage made of items [i, m) of a
/// sequence on 2^plog replicas, in O(|tensors live at cut i| + |live at cut m|) after an O(ops +
/// live entries) setup per sequence (done on first use).
class RangeCost {
 public:
  struct Cost {
    double tps = 0, compute_tps = 0, state = 0, act = 0;
  };
  RangeCost(const cost::CostModel& cm, const Structure& st, int micro_batch, int mini_batch, bool same_node);
  Cost cost(int s, int i, int m, int plog);
  /// The O(1) part of cost(): compute_tps, state and act (tps left at 0).
  Cost cheap(int s, int i, int m, int plog);
  /// Completes cheap()'s result with the communication and all-reduce terms (tps).
  void finish(int s, int i, int m, int plog, Cost* c);
  /// Lower bound on the device-seconds per sample of items [i, m): every op at its cheapest
  /// power-of-two replication (p x its time at micro_batch / p). A plan of these items on d devices
  /// with every stage's TPS <= T exists only if this <= d x T.
  double work_lower_bound(int s, int i, int m);
  int plogs() const { return plogs_; }

 private:
  struct Live {
    int item;      // the producer's item in the sequence (-1: outside it)
    int next;      // the first item >= the cut that reads it (k: only read outside the sequence)
    double bytes;  // output bytes per sample
  };
  struct SeqData {
    bool ready = false;
    std::vector<int> off;                           // item j's ops start at off[j] in the flat list
    std::vector<std::vector<long double>> compute;  // per plog: prefix sums of op_step_time
    std::vector<std::vector<long double>> act;      // per plog: prefix sums of saved bytes
    std::vector<long double> state, param, lb;
    std::vector<int64_t> tensors;         // prefix sums of parameter tensors (the optimizer steps each)
    std::vector<std::vector<Live>> live;  // per cut c in [0, k]
  };
  void prepare(int s);

  const cost::CostModel& cm_;
  const Structure& st_;
  int mbs_, mini_, plogs_;
  bool same_node_;
  std::vector<SeqData> seq_;
  std::vector<int> where_;  // scratch: item of each op in the sequence being prepared
};

}  // namespace gp::planner::detail
