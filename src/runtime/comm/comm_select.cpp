#include "runtime/comm/comm_select.h"

#include <fmt/format.h>

#include "support/error.h"

namespace gp::runtime {

bool nccl_built() { return GP_HAVE_NCCL != 0; }

std::string comm_name(CommKind k) {
  switch (k) {
    case CommKind::gloo: return "gloo";
    case CommKind::nccl: return "nccl";
    case CommKind::gloo_pairs: return "gloo-pairs";
  }
  return "?";
}

CommChoice choose_comm(const std::string& requested, const std::string& device, int local_world, int gpus,
                       bool nccl_built) {
  GP_CHECK(requested == "auto" || requested == "gloo" || requested == "nccl" || requested == "gloo-pairs",
           "--comm: expected auto, gloo, nccl or gloo-pairs, found \"{}\"", requested);
  if (requested == "gloo") return {CommKind::gloo, "--comm gloo", false};
  if (requested == "gloo-pairs") return {CommKind::gloo_pairs, "--comm gloo-pairs", false};
  if (requested == "nccl") {
    GP_CHECK(device == "cuda", "--comm nccl moves GPU tensors: it needs --device cuda (found --device {})", device);
    GP_CHECK(nccl_built,
             "--comm nccl: this graphpipe was built without NCCL (its LibTorch has no CUDA); rebuild against "
             "a CUDA LibTorch (docs/runtime.md, \"Which LibTorch\") or use --comm gloo");
  }
  if (device != "cuda") return {CommKind::gloo, "CPU tensors", false};
  if (!nccl_built) return {CommKind::gloo, "this build has no NCCL; GPU tensors go through host memory", false};
  const int local = local_world > 0 ? local_world : 1;
  if (gpus < local)
    return {CommKind::gloo,
            fmt::format("{} ranks on this host share {} GPU{}: NCCL needs one GPU per rank; GPU tensors go "
                        "through host memory",
                        local, gpus, gpus == 1 ? "" : "s"),
            false};
  return {CommKind::nccl, "one GPU per rank", true};
}

CommChoice settle_comm(const std::string& requested, const CommChoice& mine, int nccl_votes, int world) {
  if (mine.kind != CommKind::nccl && !mine.nccl_possible && requested != "nccl") return mine;
  if (nccl_votes == world) return {CommKind::nccl, "one GPU per rank", true};
  if (requested == "nccl")
    throw UserError(fmt::format("--comm nccl: {} of {} ranks cannot use NCCL{}; use --comm gloo or --comm auto",
                                world - nccl_votes, world, mine.nccl_possible ? "" : " (this one: " + mine.why + ")"));
  if (mine.kind == CommKind::nccl)
    return {CommKind::gloo,
            fmt::format("{} of {} ranks have no GPU of their own: every rank uses Gloo", world - nccl_votes, world),
            false};
  return mine;
}

}  // namespace gp::runtime
