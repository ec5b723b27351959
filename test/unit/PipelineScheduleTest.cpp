// Pipeline schedules: every generated schedule verifies, its predicted bubble
// for uniform stages is the classic formula, and 1F1B bounds the stash.
#include "megatron/Pipelines/PipelineSchedule.h"

#include "gtest/gtest.h"

using namespace megatron;

namespace {

std::vector<StageSignature> uniformSignatures(int64_t stages) {
  std::vector<StageSignature> signatures(stages);
  for (int64_t k = 0; k < stages; ++k) {
    if (k > 0)
      signatures[k].input = "4x32x64xf32";
    if (k + 1 < stages)
      signatures[k].output = "4x32x64xf32";
  }
  return signatures;
}

PipelineSchedule build(ScheduleKind kind, int64_t p, int64_t v, int64_t m) {
  llvm::Expected<PipelineSchedule> schedule =
      buildPipelineSchedule(kind, p, v, m);
  EXPECT_TRUE(static_cast<bool>(schedule))
      << llvm::toString(schedule.takeError());
  return std::move(*schedule);
}

std::string verify(const PipelineSchedule &schedule) {
  llvm::Error error = verifyPipelineSchedule(
      schedule, uniformSignatures(schedule.numStages()));
  return error ? llvm::toString(std::move(error)) : "<verified>";
}

TEST(PipelineScheduleTest, UniformBubbleIsTheFormula) {
  for (int64_t p : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 4, 8, 16}) {
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        PipelineSchedule schedule = build(kind, p, 1, m);
        ASSERT_EQ(verify(schedule), "<verified>");
        ScheduleTimeline timeline = simulatePipelineSchedule(
            schedule, std::vector<double>(p, 1.0));
        // (p - 1) / (m + p - 1) on every rank.
        for (double idle : timeline.idleFraction)
          EXPECT_NEAR(idle, double(p - 1) / (m + p - 1), 1e-12)
              << scheduleKindName(kind).str() << " p=" << p << " m=" << m;
      }
      if (m % p != 0)
        continue;
      for (int64_t v : {2, 4}) {
        PipelineSchedule schedule = build(ScheduleKind::Interleaved, p, v, m);
        ASSERT_EQ(verify(schedule), "<verified>");
        ScheduleTimeline timeline = simulatePipelineSchedule(
            schedule, std::vector<double>(p * v, 1.0 / v));
        // The bubble time (p - 1)(f + b) divided by v.
        EXPECT_NEAR(timeline.meanIdleFraction(),
                    analyticBubbleFraction(ScheduleKind::Interleaved, p, v, m),
                    1e-12)
            << "p=" << p << " v=" << v << " m=" << m;
      }
    }
}

TEST(PipelineScheduleTest, OneFOneBStashesAtMostPMicroBatches) {
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {4, 8, 16}) {
      ScheduleTimeline oneF = simulatePipelineSchedule(
          build(ScheduleKind::OneFOneB, p, 1, m), std::vector<double>(p, 1.0));
      ScheduleTimeline gpipe = simulatePipelineSchedule(
          build(ScheduleKind::GPipe, p, 1, m), std::vector<double>(p, 1.0));
      EXPECT_EQ(oneF.peakStashed[0], std::min(p, m));
      EXPECT_EQ(oneF.peakStashed[p - 1], 1);
      for (int64_t r = 0; r < p; ++r)
        EXPECT_EQ(gpipe.peakStashed[r], m);
    }
}

// The generated schedules keep Megatron-LM's count of forward passes in
// flight on every rank (what --report memory sets beside its stash).
TEST(PipelineScheduleTest, InFlightForwardsAreMegatronLMs) {
  for (int64_t p : {2, 3, 4, 8})
    for (int64_t m : {1, 2, 4, 8, 16})
      for (auto [kind, v] :
           {std::pair{ScheduleKind::GPipe, int64_t(1)},
            std::pair{ScheduleKind::OneFOneB, int64_t(1)},
            std::pair{ScheduleKind::Interleaved, int64_t(2)},
            std::pair{ScheduleKind::Interleaved, int64_t(3)}}) {
        if (kind == ScheduleKind::Interleaved && m % p != 0)
          continue;
        ScheduleTimeline timeline = simulatePipelineSchedule(
            build(kind, p, v, m), std::vector<double>(p * v, 1.0));
        for (int64_t r = 0; r < p; ++r)
          EXPECT_EQ(timeline.peakStashed[r],
                    megatronForwardsInFlight(kind, p, v, m, r))
              << scheduleKindName(kind).str() << " p=" << p << " v=" << v
              << " m=" << m << " r=" << r;
      }
}

TEST(PipelineScheduleTest, RejectsWhatCannotRun) {
  auto message = [](llvm::Expected<PipelineSchedule> schedule) {
    return schedule ? std::string("<built>")
                    : llvm::toString(schedule.takeError());
  };
  EXPECT_EQ(message(buildPipelineSchedule(ScheduleKind::Interleaved, 4, 2, 6)),
            "the interleaved schedule needs the micro-batches per iteration "
            "(6) to be a multiple of pipeline_model_parallel_size (4), as in "
            "Megatron-LM; change global_batch_size, or use "
            "--pipeline-schedule 1f1b");
  EXPECT_EQ(message(buildPipelineSchedule(ScheduleKind::Interleaved, 4, 1, 8)),
            "--pipeline-schedule interleaved needs virtual stages: set "
            "--virtual-pipeline-model-parallel-size (or "
            "--num-virtual-stages-per-pipeline-rank) to 2 or more");

  // A backward pass moved before its gradient arrives.
  PipelineSchedule schedule = build(ScheduleKind::OneFOneB, 2, 1, 2);
  auto &rank0 = schedule.ranks[0];
  auto recv = std::find_if(rank0.begin(), rank0.end(), [](auto &a) {
    return a.kind == ScheduleAction::RecvGradient;
  });
  std::rotate(rank0.begin(), recv, recv + 1);
  EXPECT_EQ(verify(schedule),
            "pipeline schedule rejected: it deadlocks: rank 0 step 0 (recv "
            "gradient of stage 0, micro-batch 0 from rank 1) waits for rank 1 "
            "step 0 (recv activation of stage 1, micro-batch 0 from rank 0); "
            "rank 1 step 0 (recv activation of stage 1, micro-batch 0 from "
            "rank 0) waits for rank 0 step 0 (recv gradient of stage 0, "
            "micro-batch 0 from rank 1)");
}

} // namespace
