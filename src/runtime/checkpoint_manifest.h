// What a checkpoint was written for (its "identity": model, plan or --single batch, stage, rank,
// optimizer), compared on --resume so that a checkpoint is never silently loaded into another
// run. Torch-free: the identity is JSON stored in the checkpoint's manifest (docs/runtime.md).
#pragma once
#include <string>

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

/// The first difference between a checkpoint's identity and this run's, as "what: X in the
/// checkpoint, Y in this run"; "" when they agree. Fields are compared from the most to the least
/// telling (model name and size before its hash, plan sizes before the plan hash). With
/// `plan_level_only`, stage and rank are not compared (another file of the same run).
std::string identity_difference(const Json& saved, const Json& now, bool plan_level_only = false);

}  // namespace gp::runtime
