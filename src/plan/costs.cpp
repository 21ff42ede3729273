// graphpipe.plan/1 "costs": what a plan was made with, and the same costs rebuilt from it.
#include "plan/costs.h"

#include <filesystem>
#include <optional>

#include "support/sha256.h"

namespace gp::plan {
namespace {

std::string describe_cluster(const cost::Cluster& c) {
  return fmt::format("{}: {} x {}", c.name, c.num_devices(), c.device.name);
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// The recorded profile when the plan does not embed it: read from its path (as given to
/// `plan --profile`, else next to the plan file) and checked against the recorded hash.
cost::Profile load_recorded_profile(const Costs& rc, const std::string& plan_file) {
  std::string path = rc.profile_path;
  if (!std::filesystem::exists(path) && std::filesystem::path(path).is_relative()) {
    auto beside = std::filesystem::path(plan_file).parent_path() / path;
    if (std::filesystem::exists(beside)) path = beside.string();
  }
  cost::Profile prof;
  try {
    prof = cost::load_profile(path);
  } catch (const UserError& e) {
    throw UserError(
        fmt::format("{}: costs.profile_path: the plan records its profile by path only, and it "
                    "cannot be read ({}); pass --profile FILE",
                    plan_file, e.what()));
  }
  std::string h = profile_sha256(prof);
  GP_CHECK(h == rc.profile_sha256,
           "{}: costs.profile_sha256: {} has changed since the plan was made (sha256 {}, the plan "
           "records {}); pass --profile {} to use it anyway",
           plan_file, path, h, rc.profile_sha256, path);
  return prof;
}

}  // namespace

std::string profile_sha256(const cost::Profile& p) { return sha256_hex(cost::profile_to_json(p).dump()); }

void record_costs(Plan& p, const cost::Cluster& c, const cost::Profile* prof, const std::string& profile_path,
                  size_t max_embedded_bytes) {
  p.costs = Costs{};
  p.costs.cluster = cost::cluster_to_json(c);
  if (prof == nullptr) return;
  Json pj = cost::profile_to_json(*prof);
  std::string compact = pj.dump();
  p.costs.profile_sha256 = sha256_hex(compact);
  p.costs.profile_path = profile_path;
  // Without a path the plan could not find a large profile again: embed it whatever its size.
  if (compact.size() <= max_embedded_bytes || profile_path.empty()) p.costs.profile = std::move(pj);
}

CostSource plan_costs(const Plan& p, const std::string& plan_file, const std::string& who,
                      const std::string& cluster_arg, const std::string& profile_arg) {
  const Costs& rc = p.costs;
  CostSource out;
  std::optional<cost::Cluster> recorded;
  if (rc.recorded()) recorded = cost::cluster_from_json(JsonAt(rc.cluster, plan_file, "costs.cluster"));

  if (!cluster_arg.empty()) {
    out.cluster = cost::load_cluster(cluster_arg, p.num_devices);
    out.cluster_from = "--cluster " + cluster_arg;
    if (recorded && cost::cluster_to_json(out.cluster) != rc.cluster)
      out.notes.push_back(fmt::format("{}: using --cluster {} ({}) instead of the cluster the plan was made with ({})",
                                      who, cluster_arg, describe_cluster(out.cluster), describe_cluster(*recorded)));
  } else if (recorded) {
    out.cluster = *recorded;
    out.cluster_from = fmt::format("the plan's recorded cluster ({})", describe_cluster(out.cluster));
  } else {
    GP_CHECK(!p.cluster_spec.empty(), "{}: the plan records no costs and has no cluster.spec; pass --cluster SPEC",
             plan_file);
    out.cluster = cost::load_cluster(p.cluster_spec, p.num_devices);
    out.cluster_from = "cluster.spec " + p.cluster_spec;
  }

  std::string recorded_profile = rc.profile_path.empty() ? "embedded in the plan" : rc.profile_path;
  if (!profile_arg.empty()) {
    auto prof = std::make_shared<cost::Profile>(cost::load_profile(profile_arg));
    out.profile_from = "--profile " + profile_arg;
    if (rc.recorded() && !rc.has_profile())
      out.notes.push_back(fmt::format("{}: using --profile {}; the plan was made without a profile", who, profile_arg));
    else if (rc.has_profile() && profile_sha256(*prof) != rc.profile_sha256)
      out.notes.push_back(fmt::format("{}: using --profile {} instead of the profile the plan was made with ({})", who,
                                      profile_arg, recorded_profile));
    out.profile = std::move(prof);
  } else if (rc.has_profile() && !rc.profile.is_null()) {
    out.profile = std::make_shared<cost::Profile>(
        cost::profile_from_json(JsonAt(rc.profile, plan_file, "costs.profile")));
    out.profile_from = fmt::format("the plan's embedded profile ({})", recorded_profile);
  } else if (rc.has_profile()) {
    out.profile = std::make_shared<cost::Profile>(load_recorded_profile(rc, plan_file));
    out.profile_from = fmt::format("the plan's profile {} (hash checked)", rc.profile_path);
  } else {
    out.profile_from = rc.recorded() ? "none (the plan was made without a profile)" : "none";
  }

  if (!rc.recorded())
    out.notes.push_back(
        fmt::format("{}: {} does not record the costs it was made with (an older plan); using {} "
                    "and profile {}",
                    who, plan_file, out.cluster_from, out.profile_from));
  return out;
}

PredictionScope prediction_scope(const Plan& p, const std::string& plan_file) {
  if (!p.costs.recorded()) {
    // Older plans: only the cluster spec says where the prediction was made for.
    const std::string& spec = p.cluster_spec;
    bool here = spec.empty() || spec == "cpu" || spec.find(".json") != std::string::npos;
    return {here, here ? fmt::format("made for cluster \"{}\" (an older plan that records no costs; assumed to be "
                                     "this machine)",
                                     spec)
                       : fmt::format("made for cluster \"{}\" (an older plan that records no costs)", spec)};
  }
  CostSource cs;
  try {
    cs = plan_costs(p, plan_file, "train");
  } catch (const UserError& e) {
    return {false, fmt::format("made with costs that cannot be read here ({})", e.what())};
  }
  std::string cpu = cost::local_cpu_model();
  if (cs.profile) {
    // The profile replaces op times (and links, when it has fits): it decides where the times hold.
    bool here = cs.profile->device.rfind("cpu: " + cpu + " (", 0) == 0;
    return {here, here ? fmt::format("made with a profile measured on this machine's CPU ({})", cs.profile->device)
                       : fmt::format("made with a profile measured on \"{}\", not this machine's CPU ({})",
                                     cs.profile->device, cpu)};
  }
  cost::Cluster local = cost::load_cluster("cpu", p.num_devices);
  if (cost::cluster_to_json(local) == cost::cluster_to_json(cs.cluster))
    return {true, fmt::format("made for this machine's cpu preset ({}; roofline estimates, no profile)",
                              describe_cluster(local))};
  // A calibrated preset names the CPU model and core count before ", calibrated <date>": another
  // calibration of this machine (GRAPHPIPE_CALIBRATION=refresh since the plan) still describes it.
  auto machine = [](const std::string& name) { return name.substr(0, name.find(", calibrated ")); };
  const std::string& planned = cs.cluster.device.name;
  if (cs.cluster.name == "cpu" && planned.find(", calibrated ") != std::string::npos &&
      machine(planned) == machine(local.device.name))
    return {true, fmt::format("made for this machine's calibrated cpu preset ({}; roofline estimates, no profile; "
                              "calibrated again since)",
                              describe_cluster(cs.cluster))};
  if (cs.cluster.name == "cpu")
    return {false, fmt::format("made for the cpu preset of another machine ({}; here: {})",
                               describe_cluster(cs.cluster), describe_cluster(local))};
  return {false, fmt::format("made for cluster {}", describe_cluster(cs.cluster))};
}

Json costs_to_json(const Costs& c) {
  Json j = Json::object();
  j["cluster"] = c.cluster;
  j["profile"] = c.profile;
  if (!c.profile_path.empty()) j["profile_path"] = c.profile_path;
  if (!c.profile_sha256.empty()) j["profile_sha256"] = c.profile_sha256;
  return j;
}

Costs costs_from_json(const JsonAt& j, int num_devices) {
  j.expect_object();
  Costs c;
  JsonAt cl = j.at("cluster");
  cost::Cluster cluster = cost::cluster_from_json(cl);
  if (cluster.num_devices() != num_devices)
    cl.fail(
        fmt::format("has {} devices, but the plan's cluster.num_devices is {}", cluster.num_devices(), num_devices));
  c.cluster = cost::cluster_to_json(cluster);
  if (j.has("profile_path")) c.profile_path = j.at("profile_path").str();
  if (j.has("profile_sha256")) {
    JsonAt h = j.at("profile_sha256");
    c.profile_sha256 = h.str();
    if (!is_sha256_hex(c.profile_sha256))
      h.fail(fmt::format("expected 64 lowercase hex digits, found \"{}\"", c.profile_sha256));
  }
  if (j.has("profile") && !j.json()["profile"].is_null()) {
    cost::Profile prof = cost::profile_from_json(j.at("profile"));
    std::string h = profile_sha256(prof);
    if (c.profile_sha256.empty()) c.profile_sha256 = h;  // a hand-written plan may leave the hash out
    else if (h != c.profile_sha256)
      j.at("profile_sha256")
          .fail(fmt::format("does not match the embedded profile (whose sha256 is {}); remove "
                            "\"profile_sha256\" to accept an edited profile",
                            h));
    c.profile = cost::profile_to_json(prof);
  } else if (c.profile_sha256.empty() != c.profile_path.empty()) {
    j.fail("a profile that is not embedded needs both \"profile_path\" and \"profile_sha256\"");
  }
  return c;
}

}  // namespace gp::plan
