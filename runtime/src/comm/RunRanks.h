// Runs a function on every rank of an in-process world, one thread per rank.
#ifndef MTRT_SRC_COMM_RUNRANKS_H
#define MTRT_SRC_COMM_RUNRANKS_H

#include "comm/InProcessWorld.h"

#include <exception>
#include <functional>
#include <vector>

namespace mtrt::comm {

/// Calls fn(communicator) on one thread per rank of `world`, with the rank's
/// world communicator (taken here, so once per world), and waits for all.
/// A rank that throws aborts the world ("rank 2 aborted: <what>"), so the
/// others stop instead of waiting for it; a rank that ends is marked
/// finished. Returns each rank's exception, null for a rank that returned;
/// world.abortReason() then says what went wrong first.
std::vector<std::exception_ptr>
runRanks(InProcessWorld &world, const std::function<void(Communicator &)> &fn);

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_RUNRANKS_H
