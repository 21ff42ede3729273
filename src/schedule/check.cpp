// check_schedule: structure, C4, send/recv matching, symbolic execution (deadlock) and data
// availability. Execution model: sends are buffered (never block), receives block.
#include <deque>
#include <map>
#include <tuple>

#include "schedule/schedule.h"

namespace gp::schedule {

namespace {

bool is_transfer(ActionKind k) {
  return k == ActionKind::send_act || k == ActionKind::recv_act || k == ActionKind::send_grad ||
         k == ActionKind::recv_grad;
}
bool is_send(ActionKind k) { return k == ActionKind::send_act || k == ActionKind::send_grad; }
bool is_grad(ActionKind k) { return k == ActionKind::send_grad || k == ActionKind::recv_grad; }

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string range_str(int b, int e) { return fmt::format("[{},{})", b, e); }

class Checker {
 public:
  Checker(const Schedule& s, const plan::Plan& p, const std::string& where)
      : s_(s), p_(p), where_(where), B_(p.mini_batch_size) {}

  void run() {
    shape();
    for (size_t i = 0; i < s_.stages.size(); ++i) structure(static_cast<int>(i));
    execute();
    for (size_t i = 0; i < s_.stages.size(); ++i) data(static_cast<int>(i));
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw UserError(fmt::format("{}: {}", where_, msg)); }
  [[noreturn]] void fail_at(int st, size_t i, const std::string& msg) const {
    fail(fmt::format("stage {} [{}] {}: {}", st, i, to_string(s_.stages[st].actions[i]), msg));
  }

  void shape() {
    if (s_.mini_batch_size != B_)
      fail(fmt::format("mini_batch_size {} differs from the plan's {}", s_.mini_batch_size, B_));
    if (s_.stages.size() != p_.stages.size())
      fail(fmt::format("{} stages but the plan has {}", s_.stages.size(), p_.stages.size()));
    for (size_t i = 0; i < s_.stages.size(); ++i) {
      if (s_.stages[i].stage != static_cast<int>(i))
        fail(fmt::format("stages[{}] has stage id {}", i, s_.stages[i].stage));
      if (p_.stages[i].id != static_cast<int>(i)) fail(fmt::format("plan stages[{}] has id {}", i, p_.stages[i].id));
      num_micro_batches(p_.stages[i], B_);  // throws when the size does not divide B
    }
  }

  // Fields in range, transfers on declared edges, C4, every F once and every micro-batch's
  // backward once (B, or BI then W), all-reduce and optimizer step placement.
  void structure(int sid) {
    const plan::Stage& st = p_.stages[sid];
    const auto& acts = s_.stages[sid].actions;
    int m = st.micro_batch_size, n = B_ / m;
    int next_f = 0, next_b = 0, allreduces = 0, steps = 0;
    // Per micro-batch: its backward so far. B and BI run in micro-batch order (next_b); W of a
    // micro-batch any time after its BI.
    enum Bwd : char { none, whole, input, input_weight };
    std::vector<char> bwd(n, none);
    int pending_w = 0;  // BI done, W not yet
    auto pending = [&] {
      for (int k = 0; k < n; ++k)
        if (bwd[k] == input) return k;
      return -1;
    };
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (steps > 0) fail_at(sid, i, "comes after the optimizer step, which must be last");
      switch (a.kind) {
        case ActionKind::forward:
          if (a.micro_batch != next_f)
            fail_at(sid, i,
                    fmt::format("C4: expected F mb{} next (forwards run in micro-batch "
                                "order, each once; the stage has {} micro-batches)",
                                next_f, n));
          ++next_f;
          break;
        case ActionKind::backward:
        case ActionKind::backward_input:
          if (a.micro_batch >= 0 && a.micro_batch < next_b)
            fail_at(sid, i,
                    fmt::format("C4: mb{} already had its backward ({}; a micro-batch runs "
                                "either B or BI then W, once)",
                                a.micro_batch, bwd[a.micro_batch] == whole ? "B" : "BI"));
          if (a.micro_batch != next_b)
            fail_at(sid, i,
                    fmt::format("C4: expected B or BI mb{} next (backwards run in "
                                "micro-batch order, each once; the stage has {} micro-batches)",
                                next_b, n));
          if (a.micro_batch >= next_f)
            fail_at(sid, i, fmt::format("C4: backward before the forward of mb{}", a.micro_batch));
          bwd[next_b++] = a.kind == ActionKind::backward ? whole : input;
          if (a.kind == ActionKind::backward_input) ++pending_w;
          break;
        case ActionKind::backward_weight: {
          const int k = a.micro_batch;
          if (k < 0 || k >= n) fail_at(sid, i, fmt::format("no micro-batch {} (the stage has {})", k, n));
          if (bwd[k] == none) fail_at(sid, i, fmt::format("backward_weight before the backward_input of mb{}", k));
          if (bwd[k] == whole)
            fail_at(sid, i,
                    fmt::format("mb{} ran its whole backward (B) already; a micro-batch runs "
                                "either B or BI then W",
                                k));
          if (bwd[k] == input_weight) fail_at(sid, i, fmt::format("second backward_weight of mb{}", k));
          bwd[k] = input_weight;
          --pending_w;
          break;
        }
        case ActionKind::allreduce:
          if (st.devices.size() <= 1) fail_at(sid, i, "all-reduce on a stage with one device");
          if (next_b != n) fail_at(sid, i, "all-reduce before the last backward");
          if (pending_w > 0) fail_at(sid, i, fmt::format("all-reduce before the backward_weight of mb{}", pending()));
          ++allreduces;
          break;
        case ActionKind::optimizer_step:
          if (next_b != n) fail_at(sid, i, "optimizer step before the last backward");
          if (pending_w > 0)
            fail_at(sid, i, fmt::format("optimizer step before the backward_weight of mb{}", pending()));
          if (st.devices.size() > 1 && allreduces == 0)
            fail_at(sid, i, "optimizer step before the gradient all-reduce");
          ++steps;
          break;
        default: transfer_fields(sid, i); break;
      }
      if (allreduces > 1) fail_at(sid, i, "second all-reduce");
    }
    if (next_f != n) fail(fmt::format("stage {}: {} of {} forwards (missing F mb{})", sid, next_f, n, next_f));
    if (next_b != n) fail(fmt::format("stage {}: {} of {} backwards (missing B mb{})", sid, next_b, n, next_b));
    if (pending_w > 0)
      fail(fmt::format("stage {}: BI mb{} ran but its backward_weight (W mb{}) is missing", sid, pending(), pending()));
    if (st.devices.size() > 1 && allreduces != 1)
      fail(fmt::format("stage {}: has {} devices but no gradient all-reduce", sid, st.devices.size()));
    if (steps != 1) fail(fmt::format("stage {}: needs exactly one optimizer_step, found {}", sid, steps));
  }

  void transfer_fields(int sid, size_t i) {
    const plan::Stage& st = p_.stages[sid];
    const Action& a = s_.stages[sid].actions[i];
    bool to_succ = a.kind == ActionKind::send_act || a.kind == ActionKind::recv_grad;
    const auto& peers = to_succ ? st.outputs_to : st.inputs_from;
    if (!contains(peers, a.peer))
      fail_at(sid, i,
              fmt::format("stage {} is not a {} of stage {} in the plan", a.peer, to_succ ? "successor" : "predecessor",
                          sid));
    int b = a.sample_begin, e = a.sample_begin + a.sample_count;
    if (a.sample_count < 1 || b < 0 || e > B_)
      fail_at(sid, i, fmt::format("sample range outside the mini-batch [0,{})", B_));
    for (int m : {st.micro_batch_size, p_.stages[a.peer].micro_batch_size})
      if (b / m != (e - 1) / m) fail_at(sid, i, fmt::format("sample range spans two micro-batches of size {}", m));
  }

  // Symbolic execution: every stage runs its list; a receive takes the oldest unmatched send on
  // its channel (edge + act/grad), which must carry the same sample range.
  void execute() {
    using Key = std::tuple<int, int, bool>;  // from stage, to stage, gradient?
    std::map<Key, std::deque<std::pair<int, size_t>>> chan;
    std::vector<size_t> pc(s_.stages.size(), 0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (size_t sid = 0; sid < s_.stages.size(); ++sid) {
        const auto& acts = s_.stages[sid].actions;
        while (pc[sid] < acts.size()) {
          const Action& a = acts[pc[sid]];
          if (is_transfer(a.kind) && is_send(a.kind)) {
            chan[{static_cast<int>(sid), a.peer, is_grad(a.kind)}].emplace_back(sid, pc[sid]);
          } else if (is_transfer(a.kind)) {
            auto& q = chan[{a.peer, static_cast<int>(sid), is_grad(a.kind)}];
            if (q.empty()) break;
            auto [from, j] = q.front();
            const Action& sent = s_.stages[from].actions[j];
            if (sent.sample_begin != a.sample_begin || sent.sample_count != a.sample_count)
              fail_at(static_cast<int>(sid), pc[sid],
                      fmt::format("matches stage {} [{}] {} (sends and receives on an edge must "
                                  "carry the same sample ranges in the same order)",
                                  from, j, to_string(sent)));
            q.pop_front();
          }
          ++pc[sid];
          progress = true;
        }
      }
    }
    for (size_t sid = 0; sid < s_.stages.size(); ++sid)
      if (pc[sid] < s_.stages[sid].actions.size()) deadlock(pc);
    for (auto& [key, q] : chan)
      if (!q.empty())
        fail_at(q.front().first, q.front().second, fmt::format("is never received by stage {}", std::get<1>(key)));
  }

  // Names the cycle of stages waiting on each other (or a wait on a stage that already finished).
  [[noreturn]] void deadlock(const std::vector<size_t>& pc) const {
    auto waiting = [&](int sid) {
      return fmt::format("stage {} waits at [{}] {}", sid, pc[sid], to_string(s_.stages[sid].actions[pc[sid]]));
    };
    int start = 0;
    while (pc[start] >= s_.stages[start].actions.size()) ++start;
    std::vector<int> path;
    std::vector<int> seen(s_.stages.size(), -1);
    int cur = start;
    while (true) {
      if (pc[cur] >= s_.stages[cur].actions.size()) {
        fail(fmt::format("{} but stage {} finished without sending it", waiting(path.back()), cur));
      }
      if (seen[cur] >= 0) break;
      seen[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      cur = s_.stages[cur].actions[pc[cur]].peer;
    }
    std::string msg = "deadlock: ";
    for (size_t i = seen[cur]; i < path.size(); ++i)
      msg += (i == static_cast<size_t>(seen[cur]) ? "" : " while ") + waiting(path[i]);
    fail(msg);
  }

  // Passes run only on data that has arrived; sends carry only computed data; every edge carries
  // every sample of the mini-batch exactly once, in order.
  void data(int sid) {
    const plan::Stage& st = p_.stages[sid];
    const auto& acts = s_.stages[sid].actions;
    int m = st.micro_batch_size;
    std::map<std::pair<int, ActionKind>, int> cursor;  // (peer, kind) -> next sample
    int fwd_done = 0, bwd_done = 0;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (is_transfer(a.kind)) {
        int& c = cursor[{a.peer, a.kind}];
        if (a.sample_begin != c)
          fail_at(sid, i, fmt::format("out of order: the next samples on this edge start at {}", c));
        c += a.sample_count;
        int produced = (a.kind == ActionKind::send_act ? fwd_done : bwd_done) * m;
        if (is_send(a.kind) && c > produced)
          fail_at(sid, i, fmt::format("sends samples not computed yet (done: [0,{}))", produced));
      } else if (a.kind == ActionKind::forward || a.kind == ActionKind::backward ||
                 a.kind == ActionKind::backward_input) {
        bool fwd = a.kind == ActionKind::forward;
        const auto& peers = fwd ? st.inputs_from : st.outputs_to;
        ActionKind recv = fwd ? ActionKind::recv_act : ActionKind::recv_grad;
        int need = (a.micro_batch + 1) * m;
        for (int peer : peers) {
          int have = cursor[{peer, recv}];
          if (have < need)
            fail_at(sid, i,
                    fmt::format("runs before its {} from stage {} for samples {} arrived",
                                fwd ? "activations" : "gradients", peer, range_str(have, need)));
        }
        (fwd ? fwd_done : bwd_done) += 1;
      }
    }
    auto expect_all = [&](const std::vector<int>& peers, ActionKind k) {
      for (int peer : peers) {
        int c = cursor[{peer, k}];
        if (c != B_)
          fail(fmt::format("stage {}: {} with stage {} covers samples [0,{}) of [0,{})", sid, to_string(k), peer, c,
                           B_));
      }
    };
    expect_all(st.inputs_from, ActionKind::recv_act);
    expect_all(st.inputs_from, ActionKind::send_grad);
    expect_all(st.outputs_to, ActionKind::send_act);
    expect_all(st.outputs_to, ActionKind::recv_grad);
  }

  const Schedule& s_;
  const plan::Plan& p_;
  std::string where_;
  int B_;
};

}  // namespace

void check_schedule(const Schedule& s, const plan::Plan& p, const std::string& where) { Checker(s, p, where).run(); }

}  // namespace gp::schedule
