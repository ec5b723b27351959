// Runs a pipeline bundle's static schedule on one rank.
#include "pipeline/PipelineRunner.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <chrono>

namespace mtrt::pipeline {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}
std::string messageLabel(const char *what, int64_t stage, int64_t microBatch) {
  return std::string(what) + " of stage " + std::to_string(stage) +
         ", micro-batch " + std::to_string(microBatch);
}
} // namespace

PipelineRunner::PipelineRunner(const Bundle &bundle,
                               host::ParameterStore &parameters,
                               host::ThreadPool &pool, comm::RankContext &rank)
    : bundle_(bundle), pipeline_(*bundle.pipeline()), parameters_(parameters),
      rank_(rank), floatType_(parameters.floatType()) {
  pipelineRank_ = rank.coordinates()[pipeline_.axis];
  lastStage_ = static_cast<int64_t>(pipeline_.stages.size()) - 1;
  pipelineGroup_ = &rank.group({pipeline_.axis});
  for (const PipelineStageInfo &info : pipeline_.stages) {
    if (info.rank != pipelineRank_)
      continue;
    Stage &stage = stages_[info.stage];
    stage.info = &info;
    const auto &functions = bundle.functions();
    stage.forward = std::make_unique<host::Executor>(
        bundle, functions[info.forward].name, parameters, pool, &rank);
    stage.backward = std::make_unique<host::Executor>(
        bundle, functions[info.backward].name, parameters, pool, &rank);
    stage.eval = std::make_unique<host::Executor>(
        bundle, functions[info.eval].name, parameters, pool, &rank);
  }
}

PipelineRunner::~PipelineRunner() = default;

int PipelineRunner::peerWorldRank(int64_t pipelineRank) const {
  std::vector<int64_t> coordinates = rank_.coordinates();
  coordinates[pipeline_.axis] = pipelineRank;
  int64_t linear = 0;
  for (size_t a = 0; a < coordinates.size(); ++a)
    linear = linear * rank_.gridShape()[a] + coordinates[a];
  return static_cast<int>(linear);
}

host::TensorView PipelineRunner::view(const host::Tensor &tensor) const {
  return {tensor.dtype, tensor.shape, tensor.buffer.data()};
}

double PipelineRunner::scalar(const host::Tensor &tensor) const {
  return tensor.dtype == DType::F64
             ? tensor.data<double>()[0]
             : static_cast<double>(tensor.data<float>()[0]);
}

host::Tensor PipelineRunner::receive(int64_t peer, const TensorType &type,
                                     const std::string &label, uint64_t step) {
  host::Tensor tensor(floatType_, type.shape);
  rank_.world().recv(tensor.buffer.data(), tensor.numElements(), floatType_,
                     peerWorldRank(peer),
                     comm::CallInfo{label, static_cast<int64_t>(step)});
  return tensor;
}

void PipelineRunner::send(int64_t peer, const host::Tensor &tensor,
                          const std::string &label, uint64_t step) {
  rank_.world().sendAsync(tensor.buffer.data(), tensor.numElements(),
                          floatType_, peerWorldRank(peer),
                          comm::CallInfo{label, static_cast<int64_t>(step)});
}

double PipelineRunner::train(const MicroBatchSource &source,
                             uint64_t firstStep) {
  Clock::time_point start = Clock::now();
  double lossSum = 0;
  using Kind = PipelineStep::Kind;
  for (const PipelineStep &step : pipeline_.ranks[pipelineRank_]) {
    Key key{step.stage, step.microBatch};
    Stage &stage = stages_.at(step.stage);
    const Function &forward = stage.forward->function();
    const Function &backward = stage.backward->function();
    uint64_t dropoutStep = firstStep + static_cast<uint64_t>(step.microBatch);
    switch (step.kind) {
    case Kind::RecvActivation:
      inputs_[key] = receive(step.peer, forward.values[forward.inputs[0]],
                             messageLabel("activation", step.stage - 1,
                                          step.microBatch),
                             dropoutStep);
      break;
    case Kind::RecvGradient:
      outputGradients_[key] = receive(
          step.peer, backward.values[backward.inputs.back()],
          messageLabel("gradient", step.stage + 1, step.microBatch),
          dropoutStep);
      break;
    case Kind::SendActivation:
      send(step.peer, outputs_.at(key),
           messageLabel("activation", step.stage, step.microBatch),
           dropoutStep);
      outputs_.erase(key);
      break;
    case Kind::SendGradient:
      send(step.peer, inputGradients_.at(key),
           messageLabel("gradient", step.stage, step.microBatch), dropoutStep);
      inputGradients_.erase(key);
      break;
    case Kind::Forward: {
      std::vector<host::TensorView> inputs;
      std::pair<host::TensorView, host::TensorView> batch;
      if (step.stage == 0 || step.stage == lastStage_)
        batch = source(step.microBatch);
      inputs.push_back(step.stage == 0 ? batch.first
                                       : view(inputs_.at(key)));
      if (step.stage == lastStage_)
        inputs.push_back(batch.second);
      Clock::time_point begin = Clock::now();
      std::vector<host::Tensor> outputs = stage.forward->run(inputs, dropoutStep);
      computeSeconds_ += since(begin);
      inputs_.erase(key);
      if (step.stage == lastStage_)
        lossSum += scalar(outputs[0]);
      else
        outputs_[key] = std::move(outputs[0]);
      outputs.erase(outputs.begin());
      stash_[key] = std::move(outputs);
      break;
    }
    case Kind::Backward: {
      std::vector<host::TensorView> inputs;
      for (const host::Tensor &stashed : stash_.at(key))
        inputs.push_back(view(stashed));
      // The last stage's loss gradient is 1 (times fp16's loss scale): the
      // optimizer divides the accumulated gradients by the micro-batches,
      // as Megatron-LM does.
      host::Tensor seed(floatType_, {});
      if (floatType_ == DType::F64)
        seed.data<double>()[0] = lossScale_;
      else
        seed.data<float>()[0] = static_cast<float>(lossScale_);
      inputs.push_back(step.stage == lastStage_
                           ? view(seed)
                           : view(outputGradients_.at(key)));
      Clock::time_point begin = Clock::now();
      std::vector<host::Tensor> outputs =
          stage.backward->run(inputs, dropoutStep);
      computeSeconds_ += since(begin);
      stash_.erase(key);
      outputGradients_.erase(key);
      if (step.stage > 0)
        inputGradients_[key] = std::move(outputs[0]);
      break;
    }
    }
  }
  // The loss is on the last stage's rank; every rank reports it.
  double loss = pipelineRank_ == pipeline_.stages.back().rank ? lossSum : 0;
  pipelineGroup_->allReduce<double>(&loss, &loss, 1, comm::ReduceOp::Sum,
                                    comm::CallInfo{"pipeline loss", -1});
  wallSeconds_ += since(start);
  return loss;
}

double PipelineRunner::evaluate(const MicroBatchSource &source,
                                int64_t microBatches) {
  double lossSum = 0;
  for (int64_t m = 0; m < microBatches; ++m) {
    host::Tensor activation;
    for (int64_t k = 0; k <= lastStage_; ++k) {
      auto found = stages_.find(k);
      if (found == stages_.end())
        continue;
      host::Executor &eval = *found->second.eval;
      const Function &function = eval.function();
      int64_t previous = (k - 1) % pipeline_.size;
      int64_t next = (k + 1) % pipeline_.size;
      std::string label = messageLabel("eval activation", k, m);
      if (k > 0)
        activation = receive(previous, function.values[function.inputs[0]],
                             messageLabel("eval activation", k - 1, m), 0);
      std::pair<host::TensorView, host::TensorView> batch;
      if (k == 0 || k == lastStage_)
        batch = source(m);
      std::vector<host::TensorView> inputs = {k == 0 ? batch.first
                                                     : view(activation)};
      if (k == lastStage_)
        inputs.push_back(batch.second);
      std::vector<host::Tensor> outputs = eval.run(inputs, 0);
      if (k == lastStage_)
        lossSum += scalar(outputs[0]);
      else
        send(next, outputs[0], label, 0);
    }
  }
  double loss = pipelineRank_ == pipeline_.stages.back().rank ? lossSum : 0;
  pipelineGroup_->allReduce<double>(&loss, &loss, 1, comm::ReduceOp::Sum,
                                    comm::CallInfo{"pipeline eval loss", -1});
  return loss;
}

double PipelineRunner::idleFraction() const {
  return wallSeconds_ > 0 ? 1 - computeSeconds_ / wallSeconds_ : 0;
}

std::vector<double> PipelineRunner::gatherIdleFractions() {
  std::vector<double> fractions(static_cast<size_t>(pipeline_.size), 0.0);
  int64_t replicas = rank_.world().size() / pipeline_.size;
  fractions[pipelineRank_] = idleFraction() / static_cast<double>(replicas);
  rank_.world().allReduce<double>(fractions.data(), fractions.data(),
                                  pipeline_.size, comm::ReduceOp::Sum,
                                  comm::CallInfo{"pipeline idle fractions", -1});
  return fractions;
}

} // namespace mtrt::pipeline
