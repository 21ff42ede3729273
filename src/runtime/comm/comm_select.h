// Which communication backend the pipeline workers use (--comm). Torch-free: the rules are plain
// data, unit-tested without LibTorch; comm/comm.h builds the chosen communicator.
#pragma once
#include <string>

namespace gp::runtime {

/// gloo: c10d Gloo, tags match messages, GPU tensors staged through host memory.
/// nccl: c10d NCCL, GPU to GPU, one directed channel per pair of ranks, messages in order.
/// gloo_pairs: NCCL's channels, message order and framing over Gloo (tests the NCCL path's logic on
/// CPUs; not faster than gloo).
enum class CommKind { gloo, nccl, gloo_pairs };

struct CommChoice {
  CommKind kind = CommKind::gloo;
  std::string why;             // one phrase for the user: "CPU tensors", "one GPU per rank", ...
  bool nccl_possible = false;  // this rank could use NCCL (auto and nccl: every rank must agree)
};

/// Whether this build has c10d's NCCL process group (built against a CUDA LibTorch).
bool nccl_built();

/// The name --comm and the train summary use: "gloo", "nccl", "gloo-pairs".
std::string comm_name(CommKind k);

/// This rank's choice for --comm `requested` ("auto", "gloo", "nccl", "gloo-pairs") with --device
/// `device`, `local_world` ranks on this host (0: unknown, taken as 1), `gpus` GPUs visible and NCCL
/// compiled in or not. UserError (exit 2) for an unknown value and for nccl without --device cuda or
/// without NCCL in this build. Whether this host has a GPU per rank is not an error here: it sets
/// nccl_possible, and settle_comm decides for every rank alike.
CommChoice choose_comm(const std::string& requested, const std::string& device, int local_world, int gpus,
                       bool nccl_built);

/// The one choice of all `world` ranks, of which `nccl_votes` could use NCCL: nccl when every rank
/// can and `mine` asked for it (auto or nccl), else gloo. UserError when --comm nccl was asked for and
/// some rank cannot (`mine.why` says why this one cannot, when it cannot).
CommChoice settle_comm(const std::string& requested, const CommChoice& mine, int nccl_votes, int world);

}  // namespace gp::runtime
