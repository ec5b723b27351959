// How a multi-process run finds its ranks: the launcher's environment
// (torchrun's or an MPI launcher's) and a TCP rendezvous through rank 0 that
// hands every rank the same bytes (NCCL's unique id).
#ifndef MTRT_SRC_COMM_RENDEZVOUS_H
#define MTRT_SRC_COMM_RENDEZVOUS_H

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mtrt::comm {

/// One process's place in a multi-process run.
struct LaunchEnvironment {
  int rank = 0;
  int worldSize = 1;
  /// The rank among the processes of its host: its CUDA device.
  int localRank = 0;
  /// Where rank 0 serves the rendezvous.
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  /// "torchrun" (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
  /// "Open MPI" (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK) or "PMI"
  /// (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID or PMI_LOCAL_RANK), for messages.
  std::string launcher;
};

/// Reads the launcher's variables through `getenv` (std::getenv by
/// default): torchrun's first, else Open MPI's, else PMI's (MPICH, Intel
/// MPI). Under an MPI launcher MASTER_ADDR and MASTER_PORT still say where
/// rank 0 listens (defaults 127.0.0.1 and 29500: one host); LOCAL_RANK
/// defaults to the launcher's local rank, else the rank. Returns nullopt when
/// no launcher variable is set (a single-process run). Throws Error
/// (INVALID_ARGUMENT) naming the variable, its value and what is expected
/// for a value that is not a number in range, or a rank set without a size.
std::optional<LaunchEnvironment> readLaunchEnvironment(
    const std::function<const char *(const char *)> &getenv = {});

/// Gives every rank rank 0's `bytes`: rank 0 listens on
/// env.masterPort (all interfaces) and answers every other rank once it has
/// connected and said its rank and world size; the others connect to
/// env.masterAddr:masterPort, retrying until `timeout`. Rank 0 returns
/// `bytes`; the others return what it sent (`bytes` is ignored there, only
/// its size must agree). A world of one returns at once.
///
/// Throws Error: DEADLINE_EXCEEDED when rank 0 has not heard from every rank
/// (naming those missing), or a rank could not reach rank 0 (naming the
/// address and the last error), within `timeout`; INVALID_ARGUMENT when a
/// rank reports another world size, a rank out of range or one already
/// seen, or rank 0 cannot listen on the port (naming it, and the fix);
/// UNAVAILABLE for other socket errors.
std::vector<uint8_t> rendezvous(const LaunchEnvironment &env,
                                const std::vector<uint8_t> &bytes,
                                std::chrono::milliseconds timeout);

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_RENDEZVOUS_H
