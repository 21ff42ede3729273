// Building 1F1B, GPipe and zero-bubble schedules from a plan, and what a schedule implies (peak in-flight).
#include "schedule/schedule.h"

#include <algorithm>
#include <array>
#include <optional>

#include "plan/schedule_kind.h"
#include "schedule/zero_bubble.h"

namespace gp::schedule {

namespace {
constexpr std::array<std::pair<ActionKind, const char*>, 10> kKindNames = {{
    {ActionKind::forward, "forward"},
    {ActionKind::backward, "backward"},
    {ActionKind::backward_input, "backward_input"},
    {ActionKind::backward_weight, "backward_weight"},
    {ActionKind::send_act, "send_act"},
    {ActionKind::recv_act, "recv_act"},
    {ActionKind::send_grad, "send_grad"},
    {ActionKind::recv_grad, "recv_grad"},
    {ActionKind::allreduce, "allreduce"},
    {ActionKind::optimizer_step, "optimizer_step"},
}};
}  // namespace

const char* to_string(ActionKind k) {
  for (auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  internal_assert_fail("known ActionKind", __FILE__, __LINE__, std::to_string(static_cast<int>(k)));
}

ActionKind action_kind_from_string(const std::string& s) {
  std::string valid;
  for (auto& [kind, name] : kKindNames) {
    if (s == name) return kind;
    valid += valid.empty() ? name : std::string(", ") + name;
  }
  throw UserError(fmt::format("unknown action kind \"{}\" (valid: {})", s, valid));
}

std::string to_string(const Action& a) {
  auto range = [&] { return fmt::format("[{},{})", a.sample_begin, a.sample_begin + a.sample_count); };
  switch (a.kind) {
    case ActionKind::forward: return fmt::format("F mb{}", a.micro_batch);
    case ActionKind::backward: return fmt::format("B mb{}", a.micro_batch);
    case ActionKind::backward_input: return fmt::format("BI mb{}", a.micro_batch);
    case ActionKind::backward_weight: return fmt::format("W mb{}", a.micro_batch);
    case ActionKind::send_act:
    case ActionKind::send_grad: return fmt::format("{} ->s{} {}", to_string(a.kind), a.peer, range());
    case ActionKind::recv_act:
    case ActionKind::recv_grad: return fmt::format("{} <-s{} {}", to_string(a.kind), a.peer, range());
    case ActionKind::allreduce: return "allreduce";
    case ActionKind::optimizer_step: return "optimizer_step";
  }
  internal_assert_fail("known ActionKind", __FILE__, __LINE__, std::to_string(static_cast<int>(a.kind)));
}

int num_micro_batches(const plan::Stage& st, int mini_batch_size) {
  GP_CHECK(st.micro_batch_size >= 1 && mini_batch_size % st.micro_batch_size == 0,
           "stage {}: micro_batch_size {} does not divide the mini-batch {}", st.id, st.micro_batch_size,
           mini_batch_size);
  return mini_batch_size / st.micro_batch_size;
}

std::vector<std::pair<int, int>> edge_pieces(int mbs_from, int mbs_to, int mini_batch) {
  GP_ASSERT(mini_batch >= 1, "bad mini-batch {}", mini_batch);
  return edge_pieces(mbs_from, mbs_to, 0, mini_batch);
}

std::vector<std::pair<int, int>> edge_pieces(int mbs_from, int mbs_to, int begin, int end) {
  GP_ASSERT(mbs_from >= 1 && mbs_to >= 1 && 0 <= begin && begin <= end, "bad sizes {} {} [{}, {})", mbs_from, mbs_to,
            begin, end);
  std::vector<std::pair<int, int>> out;
  while (begin < end) {
    // Next boundary of either side's micro-batch partition.
    int next = std::min({(begin / mbs_from + 1) * mbs_from, (begin / mbs_to + 1) * mbs_to, end});
    out.emplace_back(begin, next - begin);
    begin = next;
  }
  return out;
}

namespace {

/// Emits the actions of one stage: recvs before each pass, sends right after it.
class StageBuilder {
 public:
  StageBuilder(const plan::Plan& p, const plan::Stage& st) : p_(p), st_(st) {}

  void forward(int k) {
    for (int u : st_.inputs_from) transfers(ActionKind::recv_act, u, k, peer_mbs(u), true);
    out_.push_back({ActionKind::forward, k, -1, 0, 0});
    for (int v : st_.outputs_to) transfers(ActionKind::send_act, v, k, peer_mbs(v), false);
  }
  // B or BI: the output gradients arrive before it, the input gradients leave right after it; a W
  // moves nothing.
  void pass(const Pass& ps) {
    const int k = ps.micro_batch;
    if (ps.kind == ActionKind::forward) return forward(k);
    if (ps.kind == ActionKind::backward_weight) return out_.push_back({ps.kind, k, -1, 0, 0});
    for (int v : st_.outputs_to) transfers(ActionKind::recv_grad, v, k, peer_mbs(v), false);
    out_.push_back({ps.kind, k, -1, 0, 0});
    for (int u : st_.inputs_from) transfers(ActionKind::send_grad, u, k, peer_mbs(u), true);
  }
  void finish() {
    if (st_.devices.size() > 1) out_.push_back({ActionKind::allreduce, -1, -1, 0, 0});
    out_.push_back({ActionKind::optimizer_step, -1, -1, 0, 0});
  }
  std::vector<Action> take() { return std::move(out_); }

 private:
  int peer_mbs(int peer) const {
    GP_CHECK(peer >= 0 && peer < static_cast<int>(p_.stages.size()), "stage {}: edge to unknown stage {}", st_.id,
             peer);
    return p_.stages[peer].micro_batch_size;
  }
  // The pieces of edge (peer -> this) or (this -> peer) inside this stage's micro-batch k.
  void transfers(ActionKind kind, int peer, int k, int mbs_peer, bool peer_is_pred) {
    // (Only this micro-batch's pieces: listing the whole edge per micro-batch was quadratic.)
    const int m = st_.micro_batch_size;
    for (auto [b, c] : edge_pieces(peer_is_pred ? mbs_peer : m, peer_is_pred ? m : mbs_peer, k * m, (k + 1) * m))
      out_.push_back({kind, -1, peer, b, c});
  }
  const plan::Plan& p_;
  const plan::Stage& st_;
  std::vector<Action> out_;
};

// GPipe: every forward, then every backward.
std::vector<Pass> gpipe_order(int micro) {
  std::vector<Pass> out;
  for (int k = 0; k < micro; ++k) out.push_back({ActionKind::forward, k});
  for (int k = 0; k < micro; ++k) out.push_back({ActionKind::backward, k});
  return out;
}

}  // namespace

Schedule build_schedule(const plan::Plan& p, const std::string& kind) {
  std::optional<plan::ScheduleKind> k = plan::find_schedule_kind(kind);
  if (k == plan::ScheduleKind::zb) return build_schedule(p, kind, pass_times_of(p));
  return build_schedule(p, kind, PassTimes{});
}

Schedule build_schedule(const plan::Plan& p, const std::string& kind_name, const PassTimes& times) {
  std::optional<plan::ScheduleKind> kind = plan::find_schedule_kind(kind_name);
  GP_CHECK(kind.has_value(), "unknown schedule kind \"{}\" (valid: {})", kind_name, plan::schedule_kind_names());
  GP_CHECK(p.mini_batch_size >= 1, "plan: mini_batch_size must be >= 1, got {}", p.mini_batch_size);
  for (size_t i = 0; i < p.stages.size(); ++i)
    GP_CHECK(p.stages[i].id == static_cast<int>(i), "plan: stages[{}] has id {}", i, p.stages[i].id);
  Schedule s;
  s.kind = kind_name;
  s.mini_batch_size = p.mini_batch_size;
  // Each stage's compute passes in order; the builder adds their transfers.
  std::vector<std::vector<Pass>> orders;
  if (*kind == plan::ScheduleKind::zb) {
    orders = zero_bubble_order(p, times);
  } else {
    for (const plan::Stage& st : p.stages) {
      const int n = num_micro_batches(st, p.mini_batch_size);
      orders.push_back(*kind == plan::ScheduleKind::gpipe ? gpipe_order(n) : one_f_one_b_order(n, st.in_flight));
    }
  }
  for (const plan::Stage& st : p.stages) {
    StageBuilder b(p, st);
    for (const Pass& ps : orders[static_cast<size_t>(st.id)]) b.pass(ps);
    b.finish();
    s.stages.push_back({st.id, b.take()});
  }
  check_schedule(s, p, fmt::format("{} schedule of the plan", kind_name));
  return s;
}

std::vector<Pass> one_f_one_b_order(int micro, int in_flight) {
  const int warm = std::clamp(in_flight, 1, micro);
  std::vector<Pass> out;
  out.reserve(2 * static_cast<size_t>(micro));
  for (int k = 0; k < warm; ++k) out.push_back({ActionKind::forward, k});
  for (int k = 0; k < micro; ++k) {
    out.push_back({ActionKind::backward, k});
    if (warm + k < micro) out.push_back({ActionKind::forward, warm + k});
  }
  return out;
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> out;
  for (const StageSchedule& st : s.stages) {
    int held = 0, peak = 0;
    for (const Action& a : st.actions) {
      if (a.kind == ActionKind::forward) peak = std::max(peak, ++held);
      if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_weight) --held;
    }
    out.push_back(peak);
  }
  return out;
}

}  // namespace gp::schedule
