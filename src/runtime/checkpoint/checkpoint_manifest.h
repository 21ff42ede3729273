// What a checkpoint was written for (its "identity": model, plan or --single batch, stage, rank,
// optimizer), compared on --resume so that a checkpoint is never silently loaded into another
// run. Torch-free: the identity is JSON stored in the checkpoint's manifest (docs/runtime.md).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/model.h"
#include "plan/plan.h"
#include "support/json.h"

namespace gp::runtime {

/// The manifest's format tag; a checkpoint without a manifest predates checksums.
inline constexpr const char* kCheckpointFormat = "graphpipe.checkpoint/1";

/// Hex XXH64 of the model's graphpipe.model/1 JSON: ops, shapes, attributes (not weights).
std::string model_hash(const ir::Graph& g);
/// Hex XXH64 of what decides the stages' weights and the arithmetic of a step: mini-batch, device
/// count and each stage's ops, devices and micro-batch size (not predictions, in-flight counts or
/// search times, so re-planning the same strategy resumes).
std::string plan_hash(const plan::Plan& p);

/// Identity of stage `stage`'s file of rank `rank` in a pipelined run.
Json pipeline_identity(const ir::Graph& g, const plan::Plan& p, int stage, int rank, const std::string& optimizer);
/// Identity of `train --single` with mini-batch `batch`.
Json single_identity(const ir::Graph& g, int batch, const std::string& optimizer);

/// The run-level fields every file carries besides model and plan (added by with_run_fields):
/// `--seed`, the training data (`data_identity`) and the stage's initial weights (per parameter
/// "op/param" -> hex XXH64 of its values before training, and one hash over them all).
Json with_run_fields(Json identity, uint64_t seed, const Json& data, const Json& initial_weights);

/// What trains on: {"kind": "synthetic"} (seeded samples) or {"kind": "npy", "shuffle": bool,
/// "hash": ...}: XXH64 over the `<input>.npy` file of every graph input of `g` in `data_dir`
/// (name, size and contents; a file over 256 MiB by its size, its first MiB and 64 spread MiB).
Json data_identity(const std::string& data_dir, bool shuffle, const ir::Graph& g);

/// {"xxh64": hash over all, "params": {"op/param": hex XXH64}} from (name, hash) pairs.
Json initial_weights_identity(const std::vector<std::pair<std::string, std::string>>& param_hashes);

/// [[op name, hex XXH64 of the op's graphpipe.model/1 JSON], ...] in model order: recorded with a
/// checkpoint generation so that a checkpoint of another model is refused naming the op.
Json model_op_hashes(const ir::Graph& g);
/// "op NAME: ..." for the first op that one list has and the other lacks or holds differently; "".
std::string first_op_difference(const Json& saved_ops, const Json& now_ops);

/// Which fields identity_difference compares.
enum class IdentityScope {
  file,   // everything: this file of this run (stage, rank, the stage's initial weights)
  plan,   // not the per-file fields: another file of the same run
  model,  // not the plan's layout either (stages, devices, micro-batches): a run of the same model,
          // seed, data, mini-batch and optimizer under another plan (resharding)
};

/// The first difference between a checkpoint's identity and this run's, as "what: X in the
/// checkpoint, Y in this run"; "" when they agree. Fields are compared from the most to the least
/// telling (model name and size before its hash, plan sizes before the plan hash). Fields a
/// checkpoint from before them does not record (seed, data, initial weights) are not compared.
std::string identity_difference(const Json& saved, const Json& now, IdentityScope scope = IdentityScope::file);
/// Compatibility form: `plan_level_only` is IdentityScope::plan.
inline std::string identity_difference(const Json& saved, const Json& now, bool plan_level_only) {
  return identity_difference(saved, now, plan_level_only ? IdentityScope::plan : IdentityScope::file);
}

}  // namespace gp::runtime
