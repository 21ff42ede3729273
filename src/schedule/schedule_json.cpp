// graphpipe.schedule/1: schedules as hand-editable JSON files, parsed strictly.
#include <set>

#include "plan/schedule_kind.h"
#include "schedule/schedule.h"

namespace gp::schedule {

namespace {
constexpr const char* kFormat = "graphpipe.schedule/1";

constexpr const char* kManualKind = "manual";  // a hand-written schedule (no builder)

bool is_pass(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::backward || k == ActionKind::backward_input ||
         k == ActionKind::backward_weight;
}
bool is_transfer(ActionKind k) {
  return k == ActionKind::send_act || k == ActionKind::recv_act || k == ActionKind::send_grad ||
         k == ActionKind::recv_grad;
}

// Rejects members other than `allowed` (catches typos in hand-written files).
void only_keys(const JsonAt& at, const std::set<std::string>& allowed) {
  at.expect_object();
  for (auto it = at.json().begin(); it != at.json().end(); ++it) {
    if (!allowed.count(it.key())) {
      std::string valid;
      for (auto& k : allowed) valid += (valid.empty() ? "" : ", ") + k;
      at.fail(fmt::format("unexpected field \"{}\" (valid here: {})", it.key(), valid));
    }
  }
}

int small_int(const JsonAt& at, int lo) {
  int64_t v = at.i64();
  if (v < lo || v > (1 << 30)) at.fail(fmt::format("expected an integer >= {}, found {}", lo, v));
  return static_cast<int>(v);
}
}  // namespace

Json schedule_to_json(const Schedule& s) {
  Json stages = Json::array();
  for (const StageSchedule& st : s.stages) {
    Json acts = Json::array();
    for (const Action& a : st.actions) {
      Json j = {{"kind", to_string(a.kind)}};
      if (is_pass(a.kind)) j["micro_batch"] = a.micro_batch;
      if (is_transfer(a.kind)) {
        j["peer"] = a.peer;
        j["sample_begin"] = a.sample_begin;
        j["sample_count"] = a.sample_count;
      }
      acts.push_back(std::move(j));
    }
    stages.push_back({{"stage", st.stage}, {"actions", std::move(acts)}});
  }
  return {{"format", kFormat}, {"kind", s.kind}, {"mini_batch_size", s.mini_batch_size}, {"stages", std::move(stages)}};
}

Schedule schedule_from_json(const Json& j, const std::string& file) {
  JsonAt doc(j, file);
  doc.expect_object();
  expect_format(doc, kFormat);
  only_keys(doc, {"format", "kind", "mini_batch_size", "stages"});
  Schedule s;
  s.kind = doc.at("kind").str();
  if (!plan::find_schedule_kind(s.kind) && s.kind != kManualKind)
    doc.at("kind").fail(
        fmt::format("unknown schedule kind \"{}\" (valid: {}, {})", s.kind, plan::schedule_kind_names(), kManualKind));
  s.mini_batch_size = small_int(doc.at("mini_batch_size"), 1);
  JsonAt stages = doc.at("stages");
  for (size_t i = 0; i < stages.size(); ++i) {
    JsonAt st = stages.at(i);
    only_keys(st, {"stage", "actions"});
    StageSchedule ss;
    ss.stage = small_int(st.at("stage"), 0);
    if (ss.stage != static_cast<int>(i))
      st.at("stage").fail(fmt::format("expected {} (stages are listed in id order)", i));
    JsonAt acts = st.at("actions");
    for (size_t k = 0; k < acts.size(); ++k) {
      JsonAt a = acts.at(k);
      a.expect_object();
      Action act;
      JsonAt kind = a.at("kind");
      try {
        act.kind = action_kind_from_string(kind.str());
      } catch (const UserError& e) {
        kind.fail(e.what());
      }
      if (is_pass(act.kind)) {
        only_keys(a, {"kind", "micro_batch"});
        act.micro_batch = small_int(a.at("micro_batch"), 0);
      } else if (is_transfer(act.kind)) {
        only_keys(a, {"kind", "peer", "sample_begin", "sample_count"});
        act.peer = small_int(a.at("peer"), 0);
        act.sample_begin = small_int(a.at("sample_begin"), 0);
        act.sample_count = small_int(a.at("sample_count"), 1);
      } else {
        only_keys(a, {"kind"});
      }
      ss.actions.push_back(act);
    }
    s.stages.push_back(std::move(ss));
  }
  return s;
}

Schedule load_schedule(const std::string& path) { return schedule_from_json(read_json_file(path), path); }

void save_schedule(const std::string& path, const Schedule& s) { write_json_file(path, schedule_to_json(s)); }

}  // namespace gp::schedule
