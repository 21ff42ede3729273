// The costs a plan was made with (graphpipe.plan/1 "costs"): recorded by `graphpipe plan`, read
// back by `simulate` and `train` so that they use the cluster and profile the plan was made with
// without being given `--cluster` / `--profile` again. See docs/cost-model.md ("Costs in plans").
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "cost/profile.h"
#include "plan/plan.h"

namespace gp::plan {

/// Profiles whose compact JSON is at most this many bytes are embedded in the plan; a larger one is
/// recorded by path and content hash only (`simulate` then reads the file and checks the hash).
/// Profiles hold one entry per distinct op signature, a few KB to a few hundred KB in practice.
inline constexpr size_t kMaxEmbeddedProfileBytes = size_t{4} << 20;

/// The content hash a plan records: sha256 of profile_to_json(p).dump() (compact), so the same
/// measurements hash the same however the file was formatted.
std::string profile_sha256(const cost::Profile& p);

/// Records in p.costs the cluster the plan was made on and the profile (nullptr: none) that was
/// read from `profile_path`.
void record_costs(Plan& p, const cost::Cluster& c, const cost::Profile* prof, const std::string& profile_path,
                  size_t max_embedded_bytes = kMaxEmbeddedProfileBytes);

/// The cluster and profile to rebuild a plan's cost model with, and where each came from.
struct CostSource {
  cost::Cluster cluster;
  std::shared_ptr<const cost::Profile> profile;  // nullptr: no profile (roofline everywhere)
  std::string cluster_from;                      // e.g. "the plan's recorded cluster", "--cluster summit"
  std::string profile_from;                      // e.g. "the plan's embedded profile (profile.json)", "none"
  /// One line each, for stderr: an explicit flag that replaces the recorded costs, or a plan that
  /// records none (older files).
  std::vector<std::string> notes;
};

/// The plan's recorded cluster and profile. An explicit `cluster_arg` / `profile_arg` (empty: not
/// given) wins; when it differs from what the plan recorded, a note says so, e.g.
/// "simulate: using --profile b.json instead of the profile the plan was made with (a.json)".
/// A plan without recorded costs loads its cluster.spec and no profile (as before), with a note.
/// `who` prefixes the notes ("simulate"); errors (exit 2) name `plan_file`.
CostSource plan_costs(const Plan& p, const std::string& plan_file, const std::string& who,
                      const std::string& cluster_arg = "", const std::string& profile_arg = "");

/// Whether the plan's predicted times describe this machine, and why (for `train`, which compares
/// them with measured times): yes when the plan was made with a profile measured on this machine's
/// CPU model, or (without a profile) on this machine's `cpu` preset at the plan's device count.
struct PredictionScope {
  bool here = false;
  std::string why;  // e.g. "made with a profile measured on this machine's CPU (cpu: AMD EPYC (1 thread))"
};
PredictionScope prediction_scope(const Plan& p, const std::string& plan_file);

// graphpipe.plan/1 "costs" (used by plan_to_json / plan_from_json).
Json costs_to_json(const Costs& c);
/// Strict: the cluster and profile must parse as their formats, the cluster must have the plan's
/// `num_devices`, and an embedded profile must match its recorded hash.
Costs costs_from_json(const JsonAt& j, int num_devices);

}  // namespace gp::plan
