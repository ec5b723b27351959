//===- PipelineSchedule.h - Static per-rank pipeline schedules -*- C++ -*-===//
//
// What each pipeline rank does, in order, for one training iteration: the
// forward and backward passes of its virtual stages over the micro-batches,
// and the send/recv of activations and their gradients between stages.
// Built for GPipe, 1F1B and interleaved 1F1B; checked by simulation; timed
// by a cost model for the bubble and stash predictions (docs/Pipeline.md).
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_PIPELINES_PIPELINESCHEDULE_H
#define MEGATRON_PIPELINES_PIPELINESCHEDULE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved };
std::optional<ScheduleKind> parseScheduleKind(llvm::StringRef name);
llvm::StringRef scheduleKindName(ScheduleKind kind);

/// One step of a rank's schedule. `stage` is the rank's own virtual stage:
/// the one that computes, sends its output (activation, to stage + 1) or
/// its input's gradient (to stage - 1), or receives its input (activation
/// from stage - 1) or its output's gradient (from stage + 1). A recv blocks
/// until its message was sent; a send returns at once (Megatron-LM's isend;
/// the runtime's Communicator::sendAsync).
struct ScheduleAction {
  enum Kind {
    Forward,
    Backward,
    SendActivation,
    RecvActivation,
    SendGradient,
    RecvGradient
  };
  Kind kind = Forward;
  int64_t stage = 0;
  int64_t microBatch = 0;
  /// The other pipeline rank of a send or recv.
  int64_t peer = -1;

  bool isCompute() const { return kind == Forward || kind == Backward; }
  bool isSend() const { return kind == SendActivation || kind == SendGradient; }
  /// "forward of stage 1, micro-batch 3", "send activation of stage 1,
  /// micro-batch 3 to rank 2".
  std::string describe() const;
};

/// The messages' types, for checking that each send and its recv agree: per
/// virtual stage, the forward's input and output activations ("8x128x64xf32";
/// empty where there is none).
struct StageSignature {
  std::string input, output;
};

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int64_t pipelineSize = 1, virtualSize = 1, microBatches = 1;
  /// Per pipeline rank, its steps in order.
  std::vector<std::vector<ScheduleAction>> ranks;

  int64_t numStages() const { return pipelineSize * virtualSize; }
  /// Megatron-LM's interleaving: virtual stage k runs on rank k % p.
  int64_t rankOf(int64_t stage) const { return stage % pipelineSize; }

  llvm::json::Value toJSON() const;
};

/// The schedule of `kind` for p ranks, v virtual stages per rank and m
/// micro-batches. Fails, naming the numbers, where the kind does not apply
/// (interleaving needs v >= 2 and m a multiple of p; the others v = 1).
llvm::Expected<PipelineSchedule> buildPipelineSchedule(ScheduleKind kind,
                                                       int64_t p, int64_t v,
                                                       int64_t m);

/// Reads a schedule's `ranks` from JSON in toJSON's form (a hand-written or
/// tuned schedule), for the given sizes.
llvm::Expected<PipelineSchedule>
parsePipelineSchedule(const llvm::json::Value &value, ScheduleKind kind,
                      int64_t p, int64_t v, int64_t m);

/// Proves that the schedule runs to the end under blocking receives and
/// asynchronous sends (each rank in its order; a recv waits until its
/// message was sent): every forward and backward pass of every stage
/// and micro-batch runs once on its rank after its inputs arrived, every
/// send meets the recv that expects it (same message, type and peer) in
/// per-pair FIFO order, and no set of ranks waits on each other. The error
/// names the rank, the step and the op.
llvm::Error verifyPipelineSchedule(const PipelineSchedule &schedule,
                                   const std::vector<StageSignature> &stages);

/// The timeline the cost model predicts: per rank, each compute step's start
/// and end (seconds), given per virtual stage the forward time; a backward
/// pass takes twice its forward; sends do not block the sender (NCCL's are
/// asynchronous) and take no time.
struct ScheduleTimeline {
  struct Slot {
    const ScheduleAction *action = nullptr;
    double start = 0, end = 0;
  };
  std::vector<std::vector<Slot>> ranks;
  double makespan = 0;
  /// Per rank, the fraction of the makespan it computes nothing.
  std::vector<double> idleFraction;
  /// Per rank, the most micro-batches whose activations it holds at once
  /// (forward done, backward not yet), over all its virtual stages.
  std::vector<int64_t> peakStashed;
  double meanIdleFraction() const;
};
ScheduleTimeline simulatePipelineSchedule(const PipelineSchedule &schedule,
                                          const std::vector<double> &forwardSeconds);

/// The bubble fraction of the classic analysis for uniform stages:
/// (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v m + p - 1) for
/// interleaved 1F1B (the bubble time divided by v).
double analyticBubbleFraction(ScheduleKind kind, int64_t p, int64_t v,
                              int64_t m);

/// Megatron-LM's count of the forward passes rank r keeps in flight (forward
/// done, backward pending; interleaved: counted per chunk): its warm-up
/// forwards plus one, at most all of them. GPipe m; 1F1B min(p - r, m);
/// interleaved 2 (p - r - 1) + (v - 1) p + 1, at most v m (all of them
/// when m = p, where Megatron-LM warms up with every forward).
int64_t megatronForwardsInFlight(ScheduleKind kind, int64_t p, int64_t v,
                                 int64_t m, int64_t r);

/// Each rank's steps as text, one compute step per column ("F1.3": forward
/// of stage 1, micro-batch 3; "B..." backward; "." waiting), in the
/// timeline's order.
void printScheduleText(const PipelineSchedule &schedule,
                       const ScheduleTimeline &timeline, llvm::raw_ostream &os);
/// The timeline as an SVG picture: one row per rank, a box per compute step.
void printScheduleSvg(const PipelineSchedule &schedule,
                      const ScheduleTimeline &timeline, llvm::raw_ostream &os);

} // namespace megatron

#endif // MEGATRON_PIPELINES_PIPELINESCHEDULE_H
