// A training session: option checks, the batch, the accumulate/apply
// bookkeeping, parameter access and checkpoints.
#include "capi/Session.h"

#include "host/ParameterStore.h"
#include "train/Checkpoint.h"
#include "train/TrainingLoop.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace mtrt::capi {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

std::string str(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

const char *backendName(mtrt_backend_t backend) {
  switch (backend) {
  case MTRT_BACKEND_HOST:
    return "host";
  case MTRT_BACKEND_CUDA:
    return "cuda";
  }
  return "unknown";
}

/// Megatron-LM's optimizer settings, checked as megatron-train checks its
/// flags, with messages naming the option field.
train::OptimizerConfig optimizerConfig(const mtrt_session_options_t &o) {
  if (!(o.lr >= 0) || !std::isfinite(o.lr))
    invalid("options.lr: found " + str(o.lr) +
            ", expected a learning rate >= 0 (e.g. 6e-4)");
  if (!(o.min_lr >= 0) || o.min_lr > o.lr)
    invalid("options.min_lr: found " + str(o.min_lr) +
            ", expected a rate in [0, options.lr] = [0, " + str(o.lr) + "]");
  if (!(o.lr_warmup_init >= 0) || o.lr_warmup_init > o.lr)
    invalid("options.lr_warmup_init: found " + str(o.lr_warmup_init) +
            ", expected a rate in [0, options.lr] = [0, " + str(o.lr) + "]");
  train::OptimizerConfig c;
  host::LrSchedule &s = c.schedule;
  s.maxLr = o.lr;
  s.minLr = o.min_lr;
  s.warmupInitLr = o.lr_warmup_init;
  switch (o.lr_decay_style) {
  case MTRT_LR_DECAY_CONSTANT:
    s.style = host::LrDecayStyle::Constant;
    break;
  case MTRT_LR_DECAY_LINEAR:
    s.style = host::LrDecayStyle::Linear;
    break;
  case MTRT_LR_DECAY_COSINE:
    s.style = host::LrDecayStyle::Cosine;
    break;
  default:
    invalid("options.lr_decay_style: found " +
            std::to_string(static_cast<int>(o.lr_decay_style)) +
            ", expected MTRT_LR_DECAY_CONSTANT (0), _LINEAR (1) or _COSINE "
            "(2)");
  }
  if (o.lr_warmup_iters < 0)
    invalid("options.lr_warmup_iters: found " +
            std::to_string(o.lr_warmup_iters) + ", expected an integer >= 0");
  s.warmupIters = o.lr_warmup_iters;
  if (s.style == host::LrDecayStyle::Constant) {
    // A constant schedule never decays; its decay length only has to lie
    // past the warmup.
    s.decayIters = std::max<int64_t>(o.lr_decay_iters, s.warmupIters + 1);
  } else {
    if (o.lr_decay_iters <= o.lr_warmup_iters)
      invalid("options.lr_decay_iters: found " +
              std::to_string(o.lr_decay_iters) +
              ", expected more than options.lr_warmup_iters (" +
              std::to_string(o.lr_warmup_iters) +
              ") for a decaying schedule (megatron-train uses --train-iters)");
    s.decayIters = o.lr_decay_iters;
  }
  if (!(o.weight_decay >= 0))
    invalid("options.weight_decay: found " + str(o.weight_decay) +
            ", expected a coefficient >= 0");
  for (auto [field, beta] :
       {std::pair<const char *, double>{"options.adam_beta1", o.adam_beta1},
        {"options.adam_beta2", o.adam_beta2}})
    if (!(beta >= 0 && beta < 1))
      invalid(std::string(field) + ": found " + str(beta) +
              ", expected a value in [0, 1)");
  if (!(o.adam_eps > 0))
    invalid("options.adam_eps: found " + str(o.adam_eps) +
            ", expected a value > 0");
  if (!(o.clip_grad >= 0))
    invalid("options.clip_grad: found " + str(o.clip_grad) +
            ", expected a norm >= 0 (0 disables clipping)");
  c.weightDecay = o.weight_decay;
  c.beta1 = o.adam_beta1;
  c.beta2 = o.adam_beta2;
  c.eps = o.adam_eps;
  c.clipGrad = o.clip_grad;
  return c;
}

/// fp16 bundles: megatron-train --fp16's loss scaler from the options'
/// fields (its messages name them); other bundles: none, and the fields must
/// keep their defaults.
std::unique_ptr<train::LossScaler>
lossScaler(const Bundle &bundle, const mtrt_session_options_t &o) {
  mtrt_session_options_t defaults;
  mtrt_session_options_initialize(&defaults);
  bool changed = o.loss_scale != defaults.loss_scale ||
                 o.initial_loss_scale != defaults.initial_loss_scale ||
                 o.min_loss_scale != defaults.min_loss_scale ||
                 o.loss_scale_window != defaults.loss_scale_window ||
                 o.hysteresis != defaults.hysteresis;
  std::string precision = bundle.hasModel() ? bundle.model().precision : "";
  if (precision != "fp16") {
    if (changed)
      invalid("options.loss_scale, initial_loss_scale, min_loss_scale, "
              "loss_scale_window and hysteresis apply to fp16 bundles only, "
              "and bundle '" + bundle.name() + "' is compiled for precision " +
              (precision.empty() ? std::string("fp32") : precision) +
              " (no loss scaling): leave them at their defaults "
              "(mtrt_session_options_initialize)");
    return nullptr;
  }
  if (!(o.loss_scale >= 0) || !std::isfinite(o.loss_scale))
    invalid("options.loss_scale: found " + str(o.loss_scale) +
            ", expected 0 (dynamic loss scaling) or a static scale > 0");
  train::LossScalerOptions scaling;
  if (o.loss_scale > 0)
    scaling.staticScale = o.loss_scale;
  scaling.initialScale = o.initial_loss_scale;
  scaling.minScale = o.min_loss_scale;
  scaling.window = o.loss_scale_window;
  scaling.hysteresis = o.hysteresis;
  try {
    return std::make_unique<train::LossScaler>(scaling);
  } catch (const Error &e) {
    // The scaler names megatron-train's flags: name the fields instead.
    std::string message = e.what();
    for (auto [flag, field] :
         {std::pair<const char *, const char *>{"--loss-scale-window",
                                                "options.loss_scale_window"},
          {"--initial-loss-scale", "options.initial_loss_scale"},
          {"--min-loss-scale", "options.min_loss_scale"},
          {"--hysteresis", "options.hysteresis"},
          {"--loss-scale", "options.loss_scale"}})
      for (size_t at = message.find(flag); at != std::string::npos;
           at = message.find(flag, at + std::strlen(field)))
        message.replace(at, std::strlen(flag), field);
    throw Error(e.code(), message);
  }
}

std::vector<int64_t> shapeOf(const mtrt_tensor_t &t) {
  return std::vector<int64_t>(t.shape, t.shape + t.rank);
}

} // namespace

DType toDType(mtrt_dtype_t dtype, const char *what) {
  switch (dtype) {
  case MTRT_DTYPE_F32:
    return DType::F32;
  case MTRT_DTYPE_F64:
    return DType::F64;
  case MTRT_DTYPE_BF16:
    return DType::BF16;
  case MTRT_DTYPE_F16:
    return DType::F16;
  case MTRT_DTYPE_I32:
    return DType::I32;
  case MTRT_DTYPE_I64:
    return DType::I64;
  }
  invalid(std::string(what) + ".dtype: found " +
          std::to_string(static_cast<int>(dtype)) +
          ", which is not an mtrt_dtype_t");
}

mtrt_dtype_t toCDType(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return MTRT_DTYPE_F32;
  case DType::F64:
    return MTRT_DTYPE_F64;
  case DType::BF16:
    return MTRT_DTYPE_BF16;
  case DType::F16:
    return MTRT_DTYPE_F16;
  case DType::I32:
    return MTRT_DTYPE_I32;
  case DType::I64:
    return MTRT_DTYPE_I64;
  case DType::F8E4M3:
  case DType::F8E5M2:
    // FP8 codes live only between an FP8 step's ops, never in its inputs
    // or outputs (mt-fp8-gemms), which the C API exchanges.
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                std::string("a function input or output of dtype ") +
                    dtypeName(dtype) +
                    " (FP8 codes): the C API exchanges f32, f64, bf16, f16, "
                    "i32 and i64 values");
  }
  return MTRT_DTYPE_F32;
}

std::string describe(const mtrt_tensor_t &t) {
  std::string text = "[";
  for (int d = 0; d < t.rank && d < MTRT_MAX_RANK; ++d)
    text += (d ? ", " : "") + std::to_string(t.shape[d]);
  text += "] ";
  text += mtrt_dtype_name(t.dtype);
  if (t.backend == MTRT_BACKEND_HOST)
    text += " in host memory";
  else
    text += std::string(" on ") + backendName(t.backend) + " device " +
            std::to_string(t.device);
  return text;
}

Session::Session(std::shared_ptr<const Bundle> bundle,
                 const mtrt_session_options_t &options,
                 comm::Communicator *world)
    : bundle_(std::move(bundle)) {
  const Bundle &b = *bundle_;
  SessionBackendOptions backendOptions;
  backendOptions.optimizer = optimizerConfig(options);
  optimizer_ = backendOptions.optimizer;
  seed_ = options.seed;
  lossScaler_ = lossScaler(b, options);
  if (options.threads < 0 || options.threads > 4096)
    invalid("options.threads: found " + std::to_string(options.threads) +
            ", expected 0 (one per core) to 4096");
  if (options.device < 0)
    invalid("options.device: found " + std::to_string(options.device) +
            ", expected a device index >= 0");
  backendOptions.threads = options.threads;
  backendOptions.device = options.device;
  backendOptions.tf32 = options.tf32 != 0;
  backendOptions.seed = options.seed;

  int64_t ranks = b.rankCount();
  if (world) {
    if (ranks == 1)
      invalid("options.communicator: bundle '" + b.name() +
              "' is compiled for one rank and takes no communicator; pass "
              "NULL");
    if (world->size() != ranks)
      invalid("options.communicator: its world has " +
              std::to_string(world->size()) + " ranks but bundle '" +
              b.name() + "' is compiled for " + std::to_string(ranks) +
              " (grid " + shapeString(b.gridShape()) +
              "); create the world with that many ranks");
  } else if (ranks > 1) {
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "bundle '" + b.name() + "' is compiled for " +
                    std::to_string(ranks) + " ranks (grid " +
                    shapeString(b.gridShape()) +
                    "); pass each rank's communicator in "
                    "options.communicator (mtrt_communicator_create_in_"
                    "process makes them)");
  }

  // A pipeline bundle's first stage reads the tokens (its last the labels,
  // of the same shape).
  const Function *train =
      b.pipeline() ? &b.functions()[b.pipeline()->stages.front().forward]
                   : b.findFunction("train_step");
  if (!train)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + b.name() +
                    "' has no train_step; compile the model with "
                    "megatron-compile, which emits it");
  const TensorType &tokens = train->values[train->inputs[0]];
  if ((!b.pipeline() && train->inputs.size() != 2) ||
      tokens.shape.size() != 2)
    invalid("bundle '" + b.name() + "': " + train->name +
            " does not take (tokens, labels) of shape "
            "[micro_batch, seq_length]; recompile it with megatron-compile");
  microBatch_ = tokens.shape[0];
  seqLength_ = tokens.shape[1];
  idType_ = tokens.dtype;
  batchShape_ = tokens.shape;
  if (const Function *eval = b.findFunction("eval_step")) {
    const TensorType &evalTokens = eval->values[eval->inputs[0]];
    if (evalTokens.shape != tokens.shape || evalTokens.dtype != tokens.dtype)
      invalid("bundle '" + b.name() + "': eval_step's tokens are " +
              evalTokens.str() + " but train_step's are " + tokens.str() +
              "; recompile the bundle");
  }

  switch (options.backend) {
  case MTRT_BACKEND_HOST:
    if (world)
      rank_ = std::make_unique<comm::RankContext>(*world, b.gridShape());
    backend_ = createHostBackend(b, backendOptions, rank_.get());
    break;
  case MTRT_BACKEND_CUDA:
    if (world)
      rank_ = std::make_unique<comm::RankContext>(*world, b.gridShape());
    backend_ = createCudaBackend(b, backendOptions, rank_.get());
    break;
  default:
    invalid("options.backend: found " +
            std::to_string(static_cast<int>(options.backend)) +
            ", expected MTRT_BACKEND_HOST (0) or MTRT_BACKEND_CUDA (1)");
  }
  for (size_t i = 0; i < b.parameters().size(); ++i)
    parameterIndex_.emplace(b.parameters()[i].name, i);
  if (lossScaler_) {
    // megatron-train --fp16's check: the seed the scale multiplies (pipeline
    // stages take it as an input).
    bool seeded = b.pipeline() != nullptr;
    for (const Instruction &inst : train->instructions)
      seeded |= inst.op == Op::Fill && inst.attrs.lossSeed;
    if (!seeded)
      invalid("bundle '" + b.name() +
              "' is fp16, but its train_step has no fill marked loss_seed "
              "(the loss's gradient, which loss scaling multiplies; bundles "
              "before format version 5 lack it): recompile it with this "
              "megatron-compile");
    backend_->setLossScale(lossScaler_->scale());
  }
}

Session::~Session() = default;

bool Session::checkMemory(const mtrt_tensor_t &t, const char *what) const {
  if (t.backend == MTRT_BACKEND_HOST)
    return false;
  if (t.backend == MTRT_BACKEND_CUDA &&
      backend_->backend() == MTRT_BACKEND_CUDA &&
      t.device == backend_->device())
    return true;
  invalid(std::string(what) + " is " + describe(t) + ", but this " +
          backendName(backend_->backend()) + " session reads " +
          (backend_->backend() == MTRT_BACKEND_HOST
               ? std::string("host memory only")
               : "host memory or cuda device " +
                     std::to_string(backend_->device()) + "'s memory"));
}

void Session::setBatch(const mtrt_tensor_t &tokens,
                       const mtrt_tensor_t &labels, mtrt_batch_mode_t mode) {
  if (mode != MTRT_BATCH_COPY && mode != MTRT_BATCH_BIND)
    invalid("mode: found " + std::to_string(static_cast<int>(mode)) +
            ", expected MTRT_BATCH_COPY (0) or MTRT_BATCH_BIND (1)");
  std::string expected = shapeString(batchShape_) + " " + dtypeName(idType_);
  Batch next;
  for (int which = 0; which < 2; ++which) {
    const mtrt_tensor_t &t = which ? labels : tokens;
    const char *what = which ? "labels" : "tokens";
    DType dtype = toDType(t.dtype, what);
    if (t.rank != 2 || shapeOf(t) != batchShape_ ||
        (dtype != DType::I32 && dtype != DType::I64))
      invalid(std::string(what) + " is " + describe(t) + "; bundle '" +
              bundle_->name() + "' takes " + expected +
              " (i64 is also accepted with MTRT_BATCH_COPY)");
    if (!t.data)
      invalid(std::string(what) + ".data is NULL");
    bool onDevice = checkMemory(t, what);
    if (mode == MTRT_BATCH_BIND || onDevice) {
      if (dtype != idType_)
        invalid(std::string(what) + " is " + describe(t) + "; bundle '" +
                bundle_->name() + "' takes " + expected + ", and " +
                (onDevice ? "device batches" : "bound batches") +
                " are not converted: pass " + dtypeName(idType_) + " ids");
    }
    if (which == 1 && onDevice != next.view.onDevice)
      invalid("tokens and labels must both be in host memory or both on "
              "the device; tokens are " +
              describe(tokens) + ", labels " + describe(labels));
    next.view.onDevice = onDevice;
  }

  size_t count = static_cast<size_t>(microBatch_ * seqLength_);
  size_t bytes = count * dtypeSize(idType_);
  const mtrt_tensor_t *tensors[2] = {&tokens, &labels};
  host::TensorView *views[2] = {&next.view.tokens, &next.view.labels};
  if (mode == MTRT_BATCH_BIND) {
    for (int k = 0; k < 2; ++k)
      *views[k] = {idType_, batchShape_, tensors[k]->data};
  } else if (next.view.onDevice) {
    for (int k = 0; k < 2; ++k) {
      void *buffer = backend_->batchBuffer(k, bytes);
      backend_->copy(buffer, true, tensors[k]->data, true, bytes);
      *views[k] = {idType_, batchShape_, buffer};
    }
  } else {
    // Converted into the session's buffers; checked before any is changed.
    std::vector<uint8_t> converted[2];
    for (int k = 0; k < 2; ++k) {
      const mtrt_tensor_t &t = *tensors[k];
      converted[k].resize(bytes);
      DType from = toDType(t.dtype, "");
      if (from == idType_) {
        std::memcpy(converted[k].data(), t.data, bytes);
      } else if (from == DType::I32) {
        const auto *in = static_cast<const int32_t *>(t.data);
        auto *out = reinterpret_cast<int64_t *>(converted[k].data());
        for (size_t i = 0; i < count; ++i)
          out[i] = in[i];
      } else {
        const auto *in = static_cast<const int64_t *>(t.data);
        auto *out = reinterpret_cast<int32_t *>(converted[k].data());
        for (size_t i = 0; i < count; ++i) {
          if (in[i] < std::numeric_limits<int32_t>::min() ||
              in[i] > std::numeric_limits<int32_t>::max())
            throw Error(MTRT_STATUS_OUT_OF_RANGE,
                        std::string(k ? "labels" : "tokens") + "[" +
                            std::to_string(i / seqLength_) + ", " +
                            std::to_string(i % seqLength_) + "] = " +
                            std::to_string(in[i]) +
                            " does not fit the bundle's i32 ids");
          out[i] = static_cast<int32_t>(in[i]);
        }
      }
    }
    tokens_ = std::move(converted[0]);
    labels_ = std::move(converted[1]);
    next.view.tokens = {idType_, batchShape_, tokens_.data()};
    next.view.labels = {idType_, batchShape_, labels_.data()};
  }
  next.set = true;
  batch_ = std::move(next);
}

std::string Session::scheduleCount(const PipelineInfo &pipeline) const {
  return "bundle '" + bundle_->name() + "''s pipeline schedule takes " +
         std::to_string(pipeline.microBatches) +
         " micro-batches per optimizer step, and " +
         std::to_string(accumulated_) + " are accumulated: ";
}

double Session::accumulate() {
  if (!batch_.set)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "no batch: call mtrt_session_set_batch first");
  if (const PipelineInfo *pipeline = bundle_->pipeline()) {
    // The schedule interleaves the micro-batches' stages: it runs at
    // apply, over a copy of each micro-batch taken now.
    if (accumulated_ == pipeline->microBatches)
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  scheduleCount(*pipeline) + "call mtrt_session_apply first");
    size_t bytes = static_cast<size_t>(microBatch_ * seqLength_) *
                   dtypeSize(idType_);
    std::vector<uint8_t> &tokens = pendingTokens_.emplace_back(bytes);
    std::vector<uint8_t> &labels = pendingLabels_.emplace_back(bytes);
    backend_->copy(tokens.data(), false, batch_.view.tokens.data,
                   batch_.view.onDevice, bytes);
    backend_->copy(labels.data(), false, batch_.view.labels.data,
                   batch_.view.onDevice, bytes);
    ++accumulated_;
    return std::numeric_limits<double>::quiet_NaN();
  }
  // This rank's rows of the global micro-batch that starts at the samples
  // consumed so far (its data offset is the bundle's tile).
  double loss = backend_->run(true, batch_.view, {microStep_, consumedSamples_},
                              reportedSum_);
  ++microStep_;
  consumedSamples_ += static_cast<uint64_t>(
      microBatch_ * std::max<int64_t>(bundle_->model().dataParallelSize, 1));
  ++accumulated_;
  lossSum_ += loss;
  return loss;
}

mtrt_step_metrics_t Session::apply() {
  if (accumulated_ == 0)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "no micro-batch was accumulated since the last optimizer "
                "step: call mtrt_session_accumulate (or "
                "mtrt_session_train_step) first");
  if (const PipelineInfo *pipeline = bundle_->pipeline()) {
    if (accumulated_ != pipeline->microBatches)
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  scheduleCount(*pipeline) + "accumulate " +
                      std::to_string(pipeline->microBatches -
                                     accumulated_) +
                      " more (or compile the bundle with the global batch "
                      "you want)");
    std::vector<BatchView> batches;
    for (size_t m = 0; m < pendingTokens_.size(); ++m)
      batches.push_back({{idType_, batchShape_, pendingTokens_[m].data()},
                         {idType_, batchShape_, pendingLabels_[m].data()},
                         false});
    uint64_t globalBatch = static_cast<uint64_t>(
        microBatch_ * std::max<int64_t>(bundle_->model().dataParallelSize, 1));
    lossSum_ = backend_->runSchedule(batches, {microStep_, consumedSamples_},
                                     globalBatch, reportedSum_);
    microStep_ += static_cast<uint64_t>(accumulated_);
    consumedSamples_ += static_cast<uint64_t>(accumulated_) * globalBatch;
    pendingTokens_.clear();
    pendingLabels_.clear();
  }
  int64_t iteration = iteration_ + 1;
  backend_->reduceGradients();
  // megatron-train's order (train::Trainer): unscale and check every
  // gradient element, agree over the ranks, update the scale, skip the
  // update on an overflow. Skipped steps move neither the schedule nor
  // AdamW's step.
  train::IterationResult result;
  bool skip = false;
  if (lossScaler_) {
    bool found = backend_->unscaleAndCheckFinite(1.0 / lossScaler_->scale(),
                                                 iteration);
    skip = train::skipOnOverflow(*lossScaler_, found, iteration, skipped_,
                                 optimizer_.schedule, result);
  }
  if (!skip)
    result.step = backend_->step(iteration - skipped_,
                                 1.0 / static_cast<double>(accumulated_));
  iteration_ = iteration;
  metrics_ = {};
  metrics_.struct_size = sizeof(mtrt_step_metrics_t);
  metrics_.iteration = iteration_;
  metrics_.micro_batches = accumulated_;
  metrics_.loss = lossSum_ / static_cast<double>(accumulated_);
  metrics_.grad_norm = result.step.gradNorm;
  metrics_.learning_rate = result.step.learningRate;
  metrics_.loss_scale = result.lossScale;
  metrics_.skipped = result.skipped ? 1 : 0;
  // An MoE model's reported losses (Megatron-LM's logged values); NaN for
  // a kind the bundle does not report.
  train::meanOf(reportedSum_, accumulated_);
  metrics_.lm_loss = train::languageModelLoss(metrics_.loss, reportedSum_);
  metrics_.load_balancing_loss = metrics_.z_loss =
      std::numeric_limits<double>::quiet_NaN();
  for (const auto &[name, value] : reportedSum_) {
    if (name == "load_balancing_loss" || name == "seq_load_balancing_loss")
      metrics_.load_balancing_loss = value;
    if (name == "z_loss")
      metrics_.z_loss = value;
  }
  reportedSum_.clear();
  if (lossScaler_)
    backend_->setLossScale(lossScaler_->scale());
  accumulated_ = 0;
  lossSum_ = 0;
  backend_->zeroGradients();
  return metrics_;
}

double Session::evaluate() {
  if (!backend_->hasEvalStep())
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + bundle_->name() +
                    "' has no eval_step; compile the model with "
                    "megatron-compile, which emits it");
  if (!batch_.set)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "no batch: call mtrt_session_set_batch first");
  train::ReportedLosses none;
  return backend_->run(false, batch_.view, {}, none);
}

size_t Session::parameterIndex(const std::string &name) const {
  auto it = parameterIndex_.find(name);
  if (it != parameterIndex_.end())
    return it->second;
  std::string known;
  size_t shown = 0;
  for (const Parameter &p : bundle_->parameters()) {
    if (shown == 3) {
      known += ", ...";
      break;
    }
    known += (shown++ ? ", '" : "'") + p.name + "'";
  }
  throw Error(MTRT_STATUS_NOT_FOUND,
              "bundle '" + bundle_->name() + "' has no parameter '" + name +
                  "'; it has " + std::to_string(parameterCount()) + " (" +
                  known + "; mtrt_session_parameter_name lists them)");
}

mtrt_tensor_t Session::parameterView(size_t i) {
  const Parameter &parameter = bundle_->parameters()[i];
  if (parameter.pipelineRank >= 0 &&
      rank_->coordinates()[0] != parameter.pipelineRank)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "parameter '" + parameter.name +
                    "' lives on pipeline rank " +
                    std::to_string(parameter.pipelineRank) +
                    " and this session is pipeline rank " +
                    std::to_string(rank_->coordinates()[0]) +
                    ": read it from that rank's session");
  const TensorType &type = parameter.localType;
  mtrt_tensor_t view{};
  view.data = backend_->value(i);
  view.dtype = MTRT_DTYPE_F32;
  view.backend = backend_->backend();
  view.device = backend_->device();
  view.rank = static_cast<int>(type.shape.size());
  for (size_t d = 0; d < type.shape.size(); ++d)
    view.shape[d] = type.shape[d];
  return view;
}

void Session::copyParameter(size_t i, const mtrt_tensor_t &t, bool toCaller) {
  mtrt_tensor_t own = parameterView(i);
  const std::string &name = bundle_->parameters()[i].name;
  const char *what = toCaller ? "destination" : "source";
  if (t.dtype != own.dtype || t.rank != own.rank ||
      shapeOf(t) != shapeOf(own))
    invalid(std::string(what) + " is " + describe(t) + " but parameter '" +
            name + "' is " + shapeString(shapeOf(own)) + " " +
            mtrt_dtype_name(own.dtype));
  if (!t.data)
    invalid(std::string(what) + ".data is NULL");
  bool onDevice = checkMemory(t, what);
  size_t bytes = static_cast<size_t>(bundle_->parameters()[i]
                                         .localType.numElements) *
                 sizeof(float);
  bool ownOnDevice = own.backend == MTRT_BACKEND_CUDA;
  if (toCaller)
    backend_->copy(t.data, onDevice, own.data, ownOnDevice, bytes);
  else
    backend_->copy(own.data, ownOnDevice, t.data, onDevice, bytes);
}

// Checkpoints are the checkpoint module's (train/Checkpoint.h,
// docs/Checkpoints.md), in megatron-train's format: a session's checkpoint
// loads with megatron-train --load and the other way round.
void Session::saveCheckpoint(const std::string &directory) {
  std::vector<train::CheckpointTensor> tensors =
      backend_->checkpointTensors(rank_ != nullptr);
  const Bundle &b = *bundle_;
  const ModelConfig &model = b.model();
  train::CheckpointState state;
  state.iteration = iteration_;
  state.consumedSamples = static_cast<int64_t>(consumedSamples_);
  state.seed = seed_;
  state.microStep = microStep_;
  state.optimizerStep = iteration_ - skipped_;
  state.optimizer = train::optimizerState(optimizer_);
  state.lossScale = lossScaler_ ? lossScaler_->state()
                                : nlohmann::json{{"kind", "none"},
                                                 {"scale", 1.0}};
  state.dataPath = "(batches given through the C API)";
  state.globalBatchSize = microBatch_ *
                          std::max<int64_t>(model.dataParallelSize, 1) *
                          std::max<int64_t>(metrics_.micro_batches, 1);
  state.microBatchesPerIteration = std::max<int64_t>(metrics_.micro_batches, 1);
  state.tensorModelParallelSize = std::max<int64_t>(model.tensorModelParallelSize, 1);
  state.pipelineModelParallelSize =
      std::max<int64_t>(model.pipelineModelParallelSize, 1);
  state.dataParallelSize = std::max<int64_t>(model.dataParallelSize, 1);
  state.grid = b.gridShape();
  train::recordBundle(state, b);
  train::saveCheckpoint(directory, state, tensors,
                        rank_ ? &rank_->world() : nullptr);
}

void Session::loadCheckpoint(const std::string &directory) {
  std::vector<std::string> notes;
  std::optional<std::string> found =
      train::findLatestCheckpoint(directory, notes);
  if (!found)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "'" + directory +
                    "' holds no checkpoint (no " +
                    train::kLatestCheckpointFile +
                    " and no iter_NNNNNNN directory); write one with "
                    "mtrt_session_save_checkpoint or megatron-train --save");
  train::CheckpointManifest manifest = train::readCheckpointManifest(*found);
  std::string differences =
      train::startsRun(manifest.state)
          ? ""
          : train::optimizerDifferences(manifest.state.optimizer,
                                        train::optimizerState(optimizer_));
  if (!differences.empty())
    invalid("checkpoint '" + *found +
            "': the optimizer's hyper-parameters differ: " + differences +
            "; create the session with the checkpoint's values (the options "
            "fields of the same names) to resume its schedule");
  std::vector<train::CheckpointTensor> tensors =
      backend_->checkpointTensors(rank_ != nullptr);
  train::loadCheckpointTensors(manifest, tensors,
                               !rank_ || rank_->rank() == 0);
  const train::CheckpointState &saved = manifest.state;
  if (saved.optimizerStep < 0 || saved.optimizerStep > saved.iteration)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "checkpoint '" + *found + "': optimizer_step is " +
                    std::to_string(saved.optimizerStep) +
                    ", expected the updates of its " +
                    std::to_string(saved.iteration) +
                    " iterations (0 to the iteration)");
  backend_->checkpointLoaded();
  // fp16: the scaler's state, and the steps that skipped their update.
  skipped_ = saved.iteration - saved.optimizerStep;
  if (lossScaler_) {
    lossScaler_->restore(saved.lossScale);
    backend_->setLossScale(lossScaler_->scale());
  }
  iteration_ = manifest.state.iteration;
  microStep_ = manifest.state.microStep;
  pendingTokens_.clear();
  pendingLabels_.clear();
  consumedSamples_ = static_cast<uint64_t>(manifest.state.consumedSamples);
  accumulated_ = 0;
  lossSum_ = 0;
  metrics_ = {};
  backend_->zeroGradients();
}

#if !MTRT_HAVE_CUDA
std::unique_ptr<SessionBackend>
createCudaBackend(const Bundle &, const SessionBackendOptions &,
                  comm::RankContext *) {
  throw Error(MTRT_STATUS_UNAVAILABLE,
              "the CUDA backend is unavailable because the mtrt runtime was "
              "built without CUDA; reconfigure with -DMTRT_ENABLE_CUDA=ON");
}
#endif

} // namespace mtrt::capi
