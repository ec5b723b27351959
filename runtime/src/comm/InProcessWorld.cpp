// The in-process world: hands out each rank's communicator; aborts them.
#include "comm/InProcessWorld.h"

#include "comm/InProcessCommunicator.h"
#include "comm/InProcessState.h"

namespace mtrt::comm {

namespace {
// Far more ranks than threads a process should run; it bounds the
// size * size channel table of a group.
constexpr int kMaxRanks = 4096;
} // namespace

InProcessWorld::InProcessWorld(int size, InProcessOptions options)
    : size_(size) {
  if (size < 1 || size > kMaxRanks)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "InProcessWorld: size " + std::to_string(size) +
                    " is out of range; use 1 to " + std::to_string(kMaxRanks) +
                    " ranks");
  state_ = std::make_shared<InProcessState>(size, options);
}

InProcessWorld::~InProcessWorld() = default;

std::unique_ptr<Communicator> InProcessWorld::communicator(int rank) {
  if (rank < 0 || rank >= size_)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "InProcessWorld::communicator: rank " + std::to_string(rank) +
                    " is not in the world of " + std::to_string(size_) +
                    " ranks (0 to " + std::to_string(size_ - 1) + ")");
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->taken[rank])
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "InProcessWorld::communicator: rank " + std::to_string(rank) +
                    "'s communicator was already taken; each rank takes its "
                    "own once, since it counts the rank's collectives");
  state_->taken[rank] = true;
  return std::make_unique<InProcessCommunicator>(state_, state_->world, rank);
}

void InProcessWorld::abort(std::string_view reason) {
  state_->abort("the world was aborted from outside its ranks: " +
                std::string(reason));
}

void InProcessWorld::rankFinished(int rank) {
  if (rank < 0 || rank >= size_)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "InProcessWorld::rankFinished: rank " + std::to_string(rank) +
                    " is not in the world of " + std::to_string(size_) +
                    " ranks");
  state_->rankFinished(rank);
}

bool InProcessWorld::aborted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->abortedLocked();
}

std::string InProcessWorld::abortReason() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->abortReasonLocked();
}

} // namespace mtrt::comm
