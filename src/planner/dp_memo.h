// Internal: the planner DP's memo (engine.h): what it knows of each state (sequence, item, device
// count, in-flight after it), kept across the binary search's targets.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "planner/dp_types.h"
#include "planner/sp_structure.h"
#include "support/error.h"

namespace gp::planner::detail {

class Memo {
 public:
  /// What the memo knows of one state (s, i, d, down): the targets below which it is infeasible (an
  /// infeasible answer at target T whose TargetRange ends at hi holds at every target below hi: a
  /// smaller target only rejects more, so nothing becomes feasible; +inf when memory alone rules it
  /// out), and its last feasible answer with the range where it holds.
  struct Cell {
    double infeasible_below = -std::numeric_limits<double>::infinity();
    bool has_entry = false;
    Entry e;
  };
  /// One dense slot per (sequence, device count, item) holds the first `down` stored (the common
  /// case); other `down` values go to an overflow hash map.
  struct Slot {
    bool filled = false;
    int32_t down = 0;
    Cell cell;
  };

  /// `counts`: the device counts a state can have (the candidates and the root's).
  Memo(const Structure& st, int num_devices, const std::vector<int>& counts) : st_(st), cidx_(num_devices + 1, -1) {
    for (int d : counts)
      if (cidx_[d] < 0) cidx_[d] = ncounts_++;
    seq_base_.resize(st.seqs.size());
    size_t total = 0;
    for (size_t q = 0; q < st.seqs.size(); ++q) {
      seq_base_[q] = total;
      total += st.seqs[q].items.size() * static_cast<size_t>(ncounts_);
    }
    slots_.resize(total);
  }

  /// The state's cell (nullptr when none yet; `create`: make one). Identical sequences share
  /// their cells (mirror_sequences).
  Cell* cell(int s, int i, int d, int down, bool create) {
    s = st_.canon(s);
    Slot& sl = row(s, d)[i];
    if (sl.filled && sl.down == down) return &sl.cell;
    if (!sl.filled) {
      if (!create) return nullptr;
      sl.filled = true;
      sl.down = down;
      return &sl.cell;
    }
    const uint64_t key = (uint64_t(s) << 48) | (uint64_t(i) << 32) | (uint64_t(d) << 16) | uint64_t(down);
    if (create) return &overflow_[key];
    auto it = overflow_.find(key);
    return it == overflow_.end() ? nullptr : &it->second;
  }
  /// The slots of canonical sequence s at device count d, by item ([sequence][device count][item]:
  /// base_case looks up the rests of one stage's growing ends at one device count, consecutive slots).
  Slot* row(int s, int d) {
    GP_ASSERT(cidx_[d] >= 0, "memo: device count {} is not a candidate", d);
    return &slots_[seq_base_[s] + static_cast<size_t>(cidx_[d]) * st_.seqs[s].items.size()];
  }
  /// The state's feasible answer at target t, if the memo has it.
  const Entry* find(int s, int i, int d, int down, double t) {
    const Cell* c = cell(s, i, d, down, false);
    return c && c->has_entry && c->e.range.holds(t) ? &c->e : nullptr;
  }
  /// Records a state's answer (at a target within e.range).
  void store(int s, int i, int d, int down, const Entry& e) {
    Cell& c = *cell(s, i, d, down, true);
    if (e.val >= 0) {
      c.has_entry = true;
      c.e = e;
    } else if (e.range.unbounded_above()) {
      c.infeasible_below = std::numeric_limits<double>::infinity();
    } else {
      c.infeasible_below = std::max(c.infeasible_below, e.range.hi);
    }
  }

 private:
  const Structure& st_;
  std::vector<int> cidx_;  // per device count 0..n: index among the memo's counts, or -1
  int ncounts_ = 0;
  std::vector<size_t> seq_base_;  // first slot of each sequence
  std::vector<Slot> slots_;
  std::unordered_map<uint64_t, Cell> overflow_;
};

}  // namespace gp::planner::detail
