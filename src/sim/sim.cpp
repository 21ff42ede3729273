// The discrete-event engine: devices run their stage's actions; transfers reserve ports and
// node network interfaces first-come first-served; receives and all-reduces block.
#include "sim/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <tuple>

namespace gp::sim {

using schedule::Action;
using schedule::ActionKind;

namespace {

/// Samples [lo, hi) of micro-batch `mb` that replica r of a stage processes.
std::pair<int, int> share(const plan::Stage& st, int r, int mb) {
  int m = st.micro_batch_size, d = static_cast<int>(st.devices.size());
  return {mb * m + r * m / d, mb * m + (r + 1) * m / d};
}

struct Ev {
  double t;
  long seq;
  int device;  // device to wake (resume or arrival)
  bool operator>(const Ev& o) const { return std::tie(t, seq) > std::tie(o.t, o.seq); }
};

class Engine {
 public:
  Engine(const plan::Plan& p, const schedule::Schedule& s, const SimCosts& c, bool events)
      : p_(p), s_(s), c_(c), events_on_(events) {
    GP_CHECK(c.stages.size() == p.stages.size(), "sim: costs for {} stages, plan has {}", c.stages.size(),
             p.stages.size());
    for (const plan::Stage& st : p.stages) {
      GP_CHECK(c.stages[st.id].out_bytes_per_sample.size() == st.outputs_to.size(),
               "sim: stage {}: {} edge sizes for {} successors", st.id, c.stages[st.id].out_bytes_per_sample.size(),
               st.outputs_to.size());
      for (size_t r = 0; r < st.devices.size(); ++r) {
        int d = st.devices[r];
        GP_CHECK(d >= 0 && d < p.num_devices, "sim: stage {}: device {} outside [0,{})", st.id, d, p.num_devices);
        devs_.push_back({d, st.id, static_cast<int>(r)});
      }
    }
    dev_index_.assign(p.num_devices, -1);
    for (size_t i = 0; i < devs_.size(); ++i) dev_index_[devs_[i].device] = static_cast<int>(i);
    int nodes = 1;
    if (c.cluster.devices_per_node > 0)
      nodes = (p.num_devices + c.cluster.devices_per_node - 1) / c.cluster.devices_per_node;
    out_port_.assign(p.num_devices, 0);
    nic_out_.resize(nodes);
    nic_in_.resize(nodes);
  }

  SimResult run() {
    for (size_t i = 0; i < devs_.size(); ++i) push(0, static_cast<int>(i));
    while (!q_.empty()) {
      Ev e = q_.top();
      q_.pop();
      Dev& d = devs_[e.device];
      if (d.busy_until > e.t) continue;  // a stale wake-up; the device resumes later
      advance(e.device, e.t);
    }
    SimResult r;
    r.peak_memory_bytes.assign(p_.num_devices, 0);
    r.busy_s.assign(p_.num_devices, 0);
    r.peak_in_flight = schedule::peak_in_flight(s_);
    for (const Dev& d : devs_) {
      const auto& acts = s_.stages[d.stage].actions;
      if (d.pc < acts.size())
        throw UserError(
            fmt::format("sim: device {} (stage {}) is stuck at [{}] {}; run "
                        "`graphpipe schedule check` on this schedule",
                        d.device, d.stage, d.pc, schedule::to_string(acts[d.pc])));
      r.iteration_time_s = std::max(r.iteration_time_s, d.busy_until);
      r.busy_s[d.device] = d.busy;
      const StageTimes& t = c_.stages[d.stage];
      r.peak_memory_bytes[d.device] = t.state_bytes +
                                      std::max(r.peak_in_flight[d.stage] * t.act_bytes_per_mb + t.other_bytes,
                                               t.step_bytes);
    }
    double total = r.iteration_time_s * static_cast<double>(devs_.size()), busy = 0;
    for (double b : r.busy_s) busy += b;
    r.bubble_fraction = total > 0 ? std::max(0.0, 1 - busy / total) : 0;
    r.throughput_samples_per_s = r.iteration_time_s > 0 ? p_.mini_batch_size / r.iteration_time_s : 0;
    std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) {
      return std::tie(a.device, a.track, a.start_s) < std::tie(b.device, b.track, b.start_s);
    });
    r.events = std::move(events_);
    return r;
  }

 private:
  /// Busy windows of a shared resource (a node's network interface), in time order.
  struct Busy {
    std::deque<std::pair<double, double>> windows;
    // Earliest t' >= t with [t', t'+d) free; windows ending by `now` are forgotten (requests
    // never start before the simulation's current time).
    double earliest(double t, double d, double now) {
      while (!windows.empty() && windows.front().second <= now) windows.pop_front();
      for (auto [s, e] : windows) {
        if (t + d <= s) break;
        t = std::max(t, e);
      }
      return t;
    }
    void add(double s, double e) {
      auto it = std::lower_bound(windows.begin(), windows.end(), std::make_pair(s, e));
      windows.insert(it, {s, e});
    }
  };
  struct Dev {
    int device, stage, replica;
    size_t pc = 0;
    double busy_until = 0;   // the device's own work ends here
    double wait_since = -1;  // when it started waiting at a receive / all-reduce
    double busy = 0;
  };
  // A transfer lands in the mailbox of (receiver device, from stage, gradient?, sample_begin).
  using MailKey = std::tuple<int, int, bool, int>;

  void push(double t, int dev) { q_.push({t, seq_++, dev}); }

  void record(const Dev& d, int track, double start, double end) {
    if (!events_on_) return;
    const Action& a = s_.stages[d.stage].actions[d.pc];
    events_.push_back({d.device, d.stage, static_cast<int>(d.pc), track,
                       fmt::format("s{} {}", d.stage, schedule::to_string(a)), a.kind, a.micro_batch, start, end});
  }

  // Runs device i from time `now` until it computes (resumes later), blocks, or finishes.
  void advance(int i, double now) {
    Dev& d = devs_[i];
    const auto& acts = s_.stages[d.stage].actions;
    const StageTimes& t = c_.stages[d.stage];
    while (d.pc < acts.size()) {
      const Action& a = acts[d.pc];
      double dur = -1, from = now;  // the device works [from, now + dur)
      switch (a.kind) {
        case ActionKind::forward: dur = t.fwd_s; break;
        case ActionKind::backward: dur = t.bwd_s; break;
        case ActionKind::backward_input: dur = t.bwd_input_s; break;
        case ActionKind::backward_weight: dur = t.bwd_weight_s; break;
        case ActionKind::optimizer_step: dur = t.optimizer_s; break;
        case ActionKind::send_act:
        case ActionKind::send_grad:
          // Packing and posting the messages holds the device (LinkSpec::cpu; 0 elsewhere).
          if (double hold = send(d, a, now); hold > 0) dur = hold;
          break;
        case ActionKind::recv_act:
        case ActionKind::recv_grad: {
          const double wait_since = d.wait_since < 0 ? now : d.wait_since;
          double take = 0;
          if (!received(d, a, now, &take)) return;
          if (take > 0) {  // taking the messages holds it too: one slice, wait and all
            dur = take;
            from = wait_since;
          }
          break;
        }
        case ActionKind::allreduce:
          if (!allreduce(d, now)) return;
          return;  // all replicas resume when the all-reduce ends
      }
      if (dur >= 0) {
        record(d, 0, from, now + dur);
        d.busy += dur;
        d.busy_until = now + dur;
        ++d.pc;
        push(d.busy_until, i);
        return;
      }
      ++d.pc;
    }
  }

  // The replicas of the peer stage whose samples of this piece overlap ours, with the overlap.
  std::vector<std::pair<int, int>> partners(const Dev& d, const Action& a) const {
    const plan::Stage& me = p_.stages[d.stage];
    const plan::Stage& peer = p_.stages[a.peer];
    int b = a.sample_begin, e = a.sample_begin + a.sample_count;
    auto [lo, hi] = share(me, d.replica, b / me.micro_batch_size);
    std::vector<std::pair<int, int>> out;  // (peer replica, samples)
    for (size_t r = 0; r < peer.devices.size(); ++r) {
      auto [plo, phi] = share(peer, static_cast<int>(r), b / peer.micro_batch_size);
      int n = std::min({e, hi, phi}) - std::max({b, lo, plo});
      if (n > 0) out.emplace_back(static_cast<int>(r), n);
    }
    return out;
  }

  double bytes_per_sample(int from, int to) const {
    const plan::Stage& u = p_.stages[from];
    auto it = std::find(u.outputs_to.begin(), u.outputs_to.end(), to);
    GP_ASSERT(it != u.outputs_to.end(), "no edge s{}->s{}", from, to);
    return c_.stages[from].out_bytes_per_sample[it - u.outputs_to.begin()];
  }

  double link_time(int a, int b, double bytes) const {
    if (c_.p2p_time) return c_.p2p_time(a, b, bytes);
    const cost::LinkSpec& l = c_.cluster.same_node(a, b) ? c_.cluster.intra : c_.cluster.inter;
    return l.latency_s + bytes / l.bandwidth_Bps;
  }

  // Reserves the links for one transfer requested at `now`; returns its (start, end). The
  // sender's port carries one transfer at a time in the sender's program order. A transfer that
  // leaves its node also passes through both nodes' network interfaces at the injection
  // bandwidth, shared by all their devices: it takes the earliest window free at both.
  std::pair<double, double> transfer(int a, int b, double bytes, double now) {
    double start = std::max(now, out_port_[a]);
    double end = start + link_time(a, b, bytes);
    const cost::Cluster& cl = c_.cluster;
    if (!cl.same_node(a, b) && cl.node_injection_Bps > 0) {
      Busy& out = nic_out_[cl.node_of(a)];
      Busy& in = nic_in_[cl.node_of(b)];
      double d = bytes / cl.node_injection_Bps, t = start;
      while (true) {
        double t1 = out.earliest(t, d, now), t2 = in.earliest(t1, d, now);
        t = t2;
        if (t2 == t1) break;
      }
      out.add(t, t + d);
      in.add(t, t + d);
      end = std::max(end, t + d);
    }
    out_port_[a] = end;
    return {start, end};
  }

  const cost::LinkSpec& link(int a, int b) const {
    return c_.cluster.same_node(a, b) ? c_.cluster.intra : c_.cluster.inter;
  }

  // Posts the action's messages at `now`; returns the CPU time they hold the sender.
  double send(Dev& d, const Action& a, double now) {
    bool grad = a.kind == ActionKind::send_grad;
    double bps = grad ? bytes_per_sample(a.peer, d.stage) : bytes_per_sample(d.stage, a.peer);
    double first = -1, last = now, hold = 0;
    for (auto [r, n] : partners(d, a)) {
      int to = p_.stages[a.peer].devices[r];
      hold += link(d.device, to).cpu.send(n * bps);
      auto [start, end] = transfer(d.device, to, n * bps, now);
      if (first < 0) first = start;
      last = std::max(last, end);
      MailKey key{to, d.stage, grad, a.sample_begin};
      auto& box = mail_[key];
      box.first += 1;
      box.second = std::max(box.second, end);
      push(end, dev_index_[to]);
    }
    record(d, 1, first < 0 ? now : first, last);
    return hold;
  }

  // True once every message of the action has arrived by `now`; `*take`: the CPU time taking them
  // costs the receiver (the caller records the wait then).
  bool received(Dev& d, const Action& a, double now, double* take) {
    bool grad = a.kind == ActionKind::recv_grad;
    const auto from = partners(d, a);
    size_t expected = from.size();
    auto it = mail_.find({d.device, a.peer, grad, a.sample_begin});
    size_t got = it == mail_.end() ? 0 : it->second.first;
    double ready = it == mail_.end() ? 0 : it->second.second;
    if (d.wait_since < 0) d.wait_since = now;
    if (got < expected || ready > now) return false;
    const double bps = grad ? bytes_per_sample(d.stage, a.peer) : bytes_per_sample(a.peer, d.stage);
    *take = 0;
    for (auto [r, n] : from) *take += link(p_.stages[a.peer].devices[r], d.device).cpu.recv(n * bps);
    if (*take <= 0) record(d, 0, d.wait_since, now);
    d.wait_since = -1;
    if (it != mail_.end()) mail_.erase(it);
    return true;
  }

  bool allreduce(Dev& d, double now) {
    auto& [count, latest] = barrier_[d.stage];
    if (d.wait_since < 0) {
      d.wait_since = now;
      ++count;
      latest = std::max(latest, now);
    }
    const plan::Stage& st = p_.stages[d.stage];
    if (count < static_cast<int>(st.devices.size())) return false;
    double end = latest + c_.stages[d.stage].allreduce_s;
    for (int dev : st.devices) {
      Dev& r = devs_[dev_index_[dev]];
      record(r, 0, latest, end);
      r.busy += end - latest;
      r.busy_until = end;
      r.wait_since = -1;
      ++r.pc;
      push(end, dev_index_[dev]);
    }
    return true;
  }

  const plan::Plan& p_;
  const schedule::Schedule& s_;
  const SimCosts& c_;
  std::vector<Dev> devs_;
  std::vector<int> dev_index_;
  std::vector<double> out_port_;
  std::vector<Busy> nic_out_, nic_in_;
  std::map<MailKey, std::pair<size_t, double>> mail_;
  std::map<int, std::pair<int, double>> barrier_;
  std::priority_queue<Ev, std::vector<Ev>, std::greater<>> q_;
  std::vector<Event> events_;
  bool events_on_ = true;
  long seq_ = 0;
};

}  // namespace

SimResult simulate(const plan::Plan& p, const schedule::Schedule& s, const SimCosts& costs, const SimOptions& opt) {
  schedule::check_schedule(s, p);
  return Engine(p, s, costs, opt.events).run();
}

}  // namespace gp::sim
