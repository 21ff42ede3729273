// Starting training: run_single (one process, the whole model) and run_pipeline. Under a cluster
// launcher (torchrun, mpirun, srun) a process is one worker; otherwise run_pipeline spawns one local
// worker process per device and supervises them. Torch-free.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/train.h"

namespace gp::runtime {

/// The single-process reference: the whole model as one stage, one micro-batch = the mini-batch.
/// Prints "step K loss L time T s" per step; returns the exit code (0). Bad input throws UserError;
/// a non-finite loss or gradient (unless allow_nonfinite) or a failed checkpoint save throws
/// RuntimeFailure.
int run_single(const TrainOptions& opt);

/// Pipelined training of a plan: spawns (or, under a launcher, becomes) one worker per device.
int run_pipeline(const TrainOptions& opt);

/// This process's place as read from a launcher's environment.
struct LaunchEnv {
  int rank = 0, world = 1, local_rank = 0;
  int local_world = 0;       // ranks on this host (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
                             // SLURM_NTASKS_PER_NODE); 0 when the launcher does not say
  std::string master_addr;   // MASTER_ADDR (required)
  int master_port = 0;       // MASTER_PORT (required)
  bool agent_store = false;  // a store already listens at MASTER_ADDR:PORT (torchrun's agent store,
                             // our local launcher); otherwise rank 0 hosts it
  std::string source;        // "torchrun", "mpirun", "srun" or "graphpipe"
};

/// RANK/WORLD_SIZE (torchrun and our launcher), OMPI_COMM_WORLD_RANK/SIZE (mpirun),
/// SLURM_PROCID/NTASKS (srun), in that order; nullopt when none is set. UserError when a rank is
/// set but MASTER_ADDR/MASTER_PORT are missing or malformed.
std::optional<LaunchEnv> launch_env_from_environment();

/// The arguments of the hidden `graphpipe worker` subcommand that reproduce `opt`
/// (without the program name and the subcommand).
std::vector<std::string> worker_args(const TrainOptions& opt);

/// Spawns `world` processes of this executable running `args` (subcommand first) in one new
/// process group (posix_spawn, never fork), with torchrun-style RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT=`port`, GP_AGENT_STORE=1, GP_STATUS_FILE=`status_dir`/rank<r>
/// and GP_LAUNCHER_PID. Returns their pids (index = rank); RuntimeFailure when one cannot start.
std::vector<int> spawn_local_workers(const std::vector<std::string>& args, int world, int port,
                                     const std::string& status_dir);

/// Runs this process as one worker of the plan (rank and rendezvous from the environment).
/// Returns the exit code: 0 done, 1 own failure, 2 bad input, 3 a peer failed or timed out (under our
/// launcher, which blames that peer; under torchrun, mpirun or srun that is 1, CONTRACT.md's code).
int run_worker(const TrainOptions& opt);

/// Worker exit code when a peer failed or stopped responding (the launcher blames that peer).
inline constexpr int kExitPeerFailure = 3;

}  // namespace gp::runtime
