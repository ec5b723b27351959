// One rank's communicator in an in-process world (ranks as threads).
#ifndef MTRT_SRC_COMM_INPROCESSCOMMUNICATOR_H
#define MTRT_SRC_COMM_INPROCESSCOMMUNICATOR_H

#include "comm/Communicator.h"

#include <memory>
#include <mutex>
#include <vector>

namespace mtrt::comm {

class InProcessState;
struct InProcessGroup;

/// Made by InProcessWorld::communicator and by split(). Takes f32 and f64.
/// Each call copies straight from the other ranks' buffers into this rank's
/// output (through a scratch buffer when the output overlaps an input, as in
/// place); every rank computes a reduction in full, in the fixed order of
/// FixedOrderReduce.h, so all get the same bits.
class InProcessCommunicator final : public Communicator {
public:
  InProcessCommunicator(std::shared_ptr<InProcessState> state,
                        std::shared_ptr<InProcessGroup> group, int member);
  ~InProcessCommunicator() override;

  int rank() const override { return member_; }
  int size() const override;
  int worldRank() const override;
  const std::string &name() const override;
  const std::vector<int> &members() const override;
  uint64_t inProcessGroupId() const override;
  void abort(std::string_view reason) override;

protected:
  void execute(const Call &call) override;
  std::unique_ptr<Communicator> executeSplit(const Call &call) override;
  bool supportsDType(DType dtype) const override {
    return dtype == DType::F32 || dtype == DType::F64;
  }

private:
  /// Runs a collective through the group's two-phase rendezvous; for a
  /// split, returns this rank's new group and rank in it.
  std::pair<std::shared_ptr<InProcessGroup>, int> collective(const Call &call);
  /// Called by the last rank to arrive: checks that all calls match, and
  /// makes a split's groups.
  void completeArrivalLocked(uint64_t seq);
  /// Reads the other ranks' inputs into `out` (no lock held).
  void compute(const Call &call, void *out);
  void pointToPoint(const Call &call);
  /// Copies the posted send of `channel` into `call`'s buffer, after
  /// checking that they agree; `from` is the sending group rank.
  void receiveLocked(std::unique_lock<std::mutex> &lock, const Call &call,
                     int from);

  std::shared_ptr<InProcessState> state_;
  std::shared_ptr<InProcessGroup> group_;
  int member_;
  uint64_t collectives_ = 0;
  std::vector<unsigned char> scratch_;
  std::vector<const void *> inputs_;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_INPROCESSCOMMUNICATOR_H
