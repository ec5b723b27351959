//===- PipelineSchedule.cpp - Static per-rank pipeline schedules ----------===//

#include "megatron/Pipelines/PipelineSchedule.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

using namespace megatron;
using llvm::json::Array;
using llvm::json::Object;

std::optional<ScheduleKind> megatron::parseScheduleKind(llvm::StringRef name) {
  return llvm::StringSwitch<std::optional<ScheduleKind>>(name)
      .Case("gpipe", ScheduleKind::GPipe)
      .Case("1f1b", ScheduleKind::OneFOneB)
      .Case("interleaved", ScheduleKind::Interleaved)
      .Default(std::nullopt);
}

llvm::StringRef megatron::scheduleKindName(ScheduleKind kind) {
  switch (kind) {
  case ScheduleKind::GPipe:
    return "gpipe";
  case ScheduleKind::OneFOneB:
    return "1f1b";
  case ScheduleKind::Interleaved:
    return "interleaved";
  }
  return "";
}

static llvm::StringRef actionName(ScheduleAction::Kind kind) {
  switch (kind) {
  case ScheduleAction::Forward:
    return "forward";
  case ScheduleAction::Backward:
    return "backward";
  case ScheduleAction::SendActivation:
    return "send_activation";
  case ScheduleAction::RecvActivation:
    return "recv_activation";
  case ScheduleAction::SendGradient:
    return "send_gradient";
  case ScheduleAction::RecvGradient:
    return "recv_gradient";
  }
  return "";
}

std::string ScheduleAction::describe() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  switch (kind) {
  case Forward:
  case Backward:
    os << actionName(kind);
    break;
  case SendActivation:
  case SendGradient:
  case RecvActivation:
  case RecvGradient:
    os << (isSend() ? "send " : "recv ")
       << (kind == SendActivation || kind == RecvActivation ? "activation"
                                                            : "gradient");
    break;
  }
  os << " of stage " << stage << ", micro-batch " << microBatch;
  if (!isCompute())
    os << (isSend() ? " to rank " : " from rank ") << peer;
  return text;
}

llvm::json::Value PipelineSchedule::toJSON() const {
  Array rankArrays;
  for (const std::vector<ScheduleAction> &actions : ranks) {
    Array steps;
    for (const ScheduleAction &action : actions) {
      Object step{{"op", actionName(action.kind)},
                  {"stage", action.stage},
                  {"micro_batch", action.microBatch}};
      if (!action.isCompute())
        step["peer"] = action.peer;
      steps.push_back(std::move(step));
    }
    rankArrays.push_back(std::move(steps));
  }
  return Object{{"schedule", scheduleKindName(kind)},
                {"micro_batches", microBatches},
                {"virtual_stages", virtualSize},
                {"ranks", std::move(rankArrays)}};
}

namespace {
struct Compute {
  bool forward;
  int64_t stage, microBatch;
};
} // namespace

/// The order of one rank's forward and backward passes.
static std::vector<Compute> computeOrder(ScheduleKind kind, int64_t p,
                                         int64_t v, int64_t m, int64_t r) {
  std::vector<Compute> order;
  if (kind == ScheduleKind::GPipe) {
    for (int64_t i = 0; i < m; ++i)
      order.push_back({true, r, i});
    for (int64_t i = 0; i < m; ++i)
      order.push_back({false, r, i});
    return order;
  }
  // 1F1B is interleaving with one chunk. Megatron-LM's order: the i-th
  // forward of a rank is chunk (i / p) % v of micro-batch
  // (i / (p v)) p + i % p; backward passes take the chunks in reverse.
  int64_t total = m * v;
  auto microBatchOf = [&](int64_t i) { return (i / (p * v)) * p + i % p; };
  auto forward = [&](int64_t i) {
    return Compute{true, ((i / p) % v) * p + r, microBatchOf(i)};
  };
  auto backward = [&](int64_t i) {
    return Compute{false, (v - 1 - (i / p) % v) * p + r, microBatchOf(i)};
  };
  int64_t warmup;
  if (v == 1)
    warmup = std::min(p - r - 1, m);
  else if (m == p)
    warmup = total;
  else
    warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  for (int64_t i = 0; i < warmup; ++i)
    order.push_back(forward(i));
  for (int64_t i = 0; i < total - warmup; ++i) {
    order.push_back(forward(warmup + i));
    order.push_back(backward(i));
  }
  for (int64_t i = total - warmup; i < total; ++i)
    order.push_back(backward(i));
  return order;
}

llvm::Expected<PipelineSchedule>
megatron::buildPipelineSchedule(ScheduleKind kind, int64_t p, int64_t v,
                                int64_t m) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
  };
  if (p < 2 || m < 1 || v < 1)
    return fail("a pipeline schedule needs pipeline_model_parallel_size >= 2 "
                "(got " + llvm::Twine(p) + ") and at least one micro-batch (got " +
                llvm::Twine(m) + ")");
  if (kind == ScheduleKind::Interleaved && v < 2)
    return fail("--pipeline-schedule interleaved needs virtual stages: set "
                "--virtual-pipeline-model-parallel-size (or "
                "--num-virtual-stages-per-pipeline-rank) to 2 or more");
  if (kind != ScheduleKind::Interleaved && v > 1)
    return fail("--pipeline-schedule " + scheduleKindName(kind) +
                " runs one stage per rank, but the model has " +
                llvm::Twine(v) +
                " virtual stages per rank; use --pipeline-schedule "
                "interleaved, or remove --virtual-pipeline-model-parallel-size");
  if (kind == ScheduleKind::Interleaved && m % p != 0)
    return fail("the interleaved schedule needs the micro-batches per "
                "iteration (" + llvm::Twine(m) +
                ") to be a multiple of pipeline_model_parallel_size (" +
                llvm::Twine(p) +
                "), as in Megatron-LM; change global_batch_size, or use "
                "--pipeline-schedule 1f1b");
  PipelineSchedule schedule;
  schedule.kind = kind;
  schedule.pipelineSize = p;
  schedule.virtualSize = v;
  schedule.microBatches = m;
  int64_t last = p * v - 1;
  for (int64_t r = 0; r < p; ++r) {
    std::vector<ScheduleAction> actions;
    for (const Compute &c : computeOrder(kind, p, v, m, r)) {
      // Each pass receives its input just before it and sends its output
      // just after it.
      if (c.forward && c.stage > 0)
        actions.push_back({ScheduleAction::RecvActivation, c.stage,
                           c.microBatch, schedule.rankOf(c.stage - 1)});
      if (!c.forward && c.stage < last)
        actions.push_back({ScheduleAction::RecvGradient, c.stage,
                           c.microBatch, schedule.rankOf(c.stage + 1)});
      actions.push_back({c.forward ? ScheduleAction::Forward
                                   : ScheduleAction::Backward,
                         c.stage, c.microBatch, -1});
      if (c.forward && c.stage < last)
        actions.push_back({ScheduleAction::SendActivation, c.stage,
                           c.microBatch, schedule.rankOf(c.stage + 1)});
      if (!c.forward && c.stage > 0)
        actions.push_back({ScheduleAction::SendGradient, c.stage,
                           c.microBatch, schedule.rankOf(c.stage - 1)});
    }
    schedule.ranks.push_back(std::move(actions));
  }
  return schedule;
}

llvm::Expected<PipelineSchedule>
megatron::parsePipelineSchedule(const llvm::json::Value &value,
                                ScheduleKind kind, int64_t p, int64_t v,
                                int64_t m) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "pipeline schedule: " + message);
  };
  const Object *root = value.getAsObject();
  const Array *ranks = root ? root->getArray("ranks") : nullptr;
  if (!ranks)
    return fail("expected an object with \"ranks\": one list of steps per "
                "pipeline rank");
  if (static_cast<int64_t>(ranks->size()) != p)
    return fail("\"ranks\" has " + llvm::Twine(ranks->size()) +
                " lists, expected one per pipeline rank (" + llvm::Twine(p) +
                ")");
  PipelineSchedule schedule;
  schedule.kind = kind;
  schedule.pipelineSize = p;
  schedule.virtualSize = v;
  schedule.microBatches = m;
  for (auto [r, rank] : llvm::enumerate(*ranks)) {
    const Array *steps = rank.getAsArray();
    if (!steps)
      return fail("ranks[" + llvm::Twine(r) + "] is not a list");
    std::vector<ScheduleAction> actions;
    for (auto [i, step] : llvm::enumerate(*steps)) {
      const Object *object = step.getAsObject();
      std::optional<llvm::StringRef> op =
          object ? object->getString("op") : std::nullopt;
      std::optional<int64_t> stage =
          object ? object->getInteger("stage") : std::nullopt;
      std::optional<int64_t> microBatch =
          object ? object->getInteger("micro_batch") : std::nullopt;
      std::optional<int64_t> peer =
          object ? object->getInteger("peer") : std::nullopt;
      std::optional<ScheduleAction::Kind> kindOfStep;
      for (auto k : {ScheduleAction::Forward, ScheduleAction::Backward,
                     ScheduleAction::SendActivation,
                     ScheduleAction::RecvActivation,
                     ScheduleAction::SendGradient,
                     ScheduleAction::RecvGradient})
        if (op && *op == actionName(k))
          kindOfStep = k;
      std::string where =
          "ranks[" + std::to_string(r) + "][" + std::to_string(i) + "]";
      if (!kindOfStep || !stage || !microBatch)
        return fail(where + ": expected {\"op\": forward|backward|"
                            "send_activation|recv_activation|send_gradient|"
                            "recv_gradient, \"stage\", \"micro_batch\"[, "
                            "\"peer\"]}");
      ScheduleAction action{*kindOfStep, *stage, *microBatch, peer.value_or(-1)};
      if (*stage < 0 || *stage >= p * v || *microBatch < 0 ||
          *microBatch >= m || (!action.isCompute() && (!peer || *peer < 0 ||
                                                       *peer >= p)))
        return fail(where + ": stage, micro-batch or peer out of range (" +
                    llvm::Twine(p * v) + " stages, " + llvm::Twine(m) +
                    " micro-batches, " + llvm::Twine(p) + " ranks)");
      actions.push_back(action);
    }
    schedule.ranks.push_back(std::move(actions));
  }
  return schedule;
}

namespace {

/// A message between stages: an activation going from stage `from` to
/// from + 1, or a gradient going from `from` to from - 1.
struct Message {
  bool activation;
  int64_t from, microBatch;
  bool operator<(const Message &o) const {
    return std::tie(activation, from, microBatch) <
           std::tie(o.activation, o.from, o.microBatch);
  }
  bool operator==(const Message &o) const {
    return !(*this < o) && !(o < *this);
  }
};

Message messageOf(const ScheduleAction &a) {
  switch (a.kind) {
  case ScheduleAction::SendActivation:
    return {true, a.stage, a.microBatch};
  case ScheduleAction::RecvActivation:
    return {true, a.stage - 1, a.microBatch};
  case ScheduleAction::SendGradient:
    return {false, a.stage, a.microBatch};
  default:
    return {false, a.stage + 1, a.microBatch};
  }
}

} // namespace

llvm::Error
megatron::verifyPipelineSchedule(const PipelineSchedule &schedule,
                                 const std::vector<StageSignature> &stages) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "pipeline schedule rejected: " + message);
  };
  const int64_t p = schedule.pipelineSize, last = schedule.numStages() - 1;
  auto at = [&](int64_t r, size_t i) {
    return "rank " + std::to_string(r) + " step " + std::to_string(i) + " (" +
           schedule.ranks[r][i].describe() + ")";
  };
  // Static checks: stages on their ranks, peers the neighbours' ranks.
  for (int64_t r = 0; r < p; ++r) {
    const auto &actions = schedule.ranks[r];
    for (size_t i = 0; i < actions.size(); ++i) {
      const ScheduleAction &a = actions[i];
      if (schedule.rankOf(a.stage) != r)
        return fail(at(r, i) + ": stage " + llvm::Twine(a.stage) +
                    " runs on rank " + llvm::Twine(schedule.rankOf(a.stage)));
      if (!a.isCompute()) {
        Message message = messageOf(a);
        int64_t to = message.activation ? message.from + 1 : message.from - 1;
        if (to < 0 || to > last)
          return fail(at(r, i) + ": stage " + llvm::Twine(a.stage) +
                      " has no neighbour to exchange this with");
        int64_t other = a.isSend() ? schedule.rankOf(to)
                                   : schedule.rankOf(message.from);
        if (a.peer != other)
          return fail(at(r, i) + ": the other side runs on rank " +
                      llvm::Twine(other));
      }
    }
  }

  // Run the ranks: a recv blocks until its message was sent; sends do not
  // wait for their recv (asynchronous, as Megatron-LM's isend).
  std::vector<size_t> position(p, 0);
  std::vector<std::set<std::tuple<bool, int64_t, int64_t>>> computed(p);
  std::vector<std::set<Message>> arrived(p);
  // Per (from, to): the messages sent, with the step that sent each, and
  // how many were received.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<Message, size_t>>>
      inFlight;
  std::map<std::pair<int64_t, int64_t>, size_t> taken;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      const auto &actions = schedule.ranks[r];
      for (; position[r] < actions.size(); ++position[r], progress = true) {
        size_t i = position[r];
        const ScheduleAction &a = actions[i];
        bool forward = a.kind == ScheduleAction::Forward;
        if (a.isSend()) {
          if (!computed[r].count({a.kind == ScheduleAction::SendActivation,
                                  a.stage, a.microBatch}))
            return fail(at(r, i) + ": sends before the pass that computes it");
          inFlight[{r, a.peer}].push_back({messageOf(a), i});
          continue;
        }
        if (!a.isCompute()) {
          auto &queue = inFlight[{a.peer, r}];
          size_t &next = taken[{a.peer, r}];
          if (next >= queue.size())
            break;
          auto [message, sentAt] = queue[next];
          if (!(message == messageOf(a)))
            return fail(at(r, i) + " would receive what " +
                        at(a.peer, sentAt) + " sends: both are message #" +
                        llvm::Twine(next) + " from rank " +
                        llvm::Twine(a.peer) + " to rank " + llvm::Twine(r));
          const std::string &sentType = message.activation
                                            ? stages[message.from].output
                                            : stages[message.from].input;
          const std::string &expected = message.activation
                                            ? stages[message.from + 1].input
                                            : stages[message.from - 1].output;
          if (sentType != expected)
            return fail(at(a.peer, sentAt) + " sends " + sentType + " but " +
                        at(r, i) + " expects " + expected);
          ++next;
          arrived[r].insert(message);
          continue;
        }
        if (!computed[r].insert({forward, a.stage, a.microBatch}).second)
          return fail(at(r, i) + ": runs a second time");
        if (forward && a.stage > 0 &&
            !arrived[r].count({true, a.stage - 1, a.microBatch}))
          return fail(at(r, i) + ": its input activation was not received "
                                 "before it");
        if (!forward && !computed[r].count({true, a.stage, a.microBatch}))
          return fail(at(r, i) + ": runs before the forward pass of the same "
                                 "stage and micro-batch");
        if (!forward && a.stage < last &&
            !arrived[r].count({false, a.stage + 1, a.microBatch}))
          return fail(at(r, i) + ": its output's gradient was not received "
                                 "before it");
      }
    }
  }

  std::string stuck;
  for (int64_t r = 0; r < p; ++r) {
    if (position[r] >= schedule.ranks[r].size())
      continue;
    int64_t q = schedule.ranks[r][position[r]].peer;
    std::string other =
        position[q] >= schedule.ranks[q].size()
            ? "rank " + std::to_string(q) + ", which has finished"
            : at(q, position[q]);
    stuck += (stuck.empty() ? "" : "; ") + at(r, position[r]) + " waits for " +
             other;
  }
  if (!stuck.empty())
    return fail("it deadlocks: " + stuck);
  for (auto &[pair, queue] : inFlight)
    if (taken[pair] < queue.size())
      return fail(at(pair.first, queue[taken[pair]].second) +
                  ": rank " + llvm::Twine(pair.second) + " never receives it");
  for (int64_t k = 0; k <= last; ++k)
    for (int64_t mb = 0; mb < schedule.microBatches; ++mb)
      for (bool forward : {true, false})
        if (!computed[schedule.rankOf(k)].count({forward, k, mb}))
          return fail("rank " + llvm::Twine(schedule.rankOf(k)) +
                      " never runs the " + (forward ? "forward" : "backward") +
                      " of stage " + llvm::Twine(k) + ", micro-batch " +
                      llvm::Twine(mb));
  return llvm::Error::success();
}

ScheduleTimeline
megatron::simulatePipelineSchedule(const PipelineSchedule &schedule,
                                   const std::vector<double> &forwardSeconds) {
  const int64_t p = schedule.pipelineSize;
  ScheduleTimeline timeline;
  timeline.ranks.resize(p);
  std::vector<double> clock(p, 0), busy(p, 0);
  std::vector<size_t> position(p, 0);
  std::map<Message, double> sentAt;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      const auto &actions = schedule.ranks[r];
      while (position[r] < actions.size()) {
        const ScheduleAction &a = actions[position[r]];
        if (a.isCompute()) {
          double seconds = forwardSeconds[a.stage] *
                           (a.kind == ScheduleAction::Forward ? 1 : 2);
          timeline.ranks[r].push_back({&a, clock[r], clock[r] + seconds});
          clock[r] += seconds;
          busy[r] += seconds;
        } else if (a.isSend()) {
          sentAt[messageOf(a)] = clock[r];
        } else {
          auto it = sentAt.find(messageOf(a));
          if (it == sentAt.end())
            break;
          clock[r] = std::max(clock[r], it->second);
        }
        ++position[r];
        progress = true;
      }
    }
  }
  timeline.makespan = *std::max_element(clock.begin(), clock.end());
  for (int64_t r = 0; r < p; ++r) {
    timeline.idleFraction.push_back(
        timeline.makespan > 0 ? 1 - busy[r] / timeline.makespan : 0);
    int64_t held = 0, peak = 0;
    for (const ScheduleAction &a : schedule.ranks[r]) {
      if (a.kind == ScheduleAction::Forward)
        peak = std::max(peak, ++held);
      else if (a.kind == ScheduleAction::Backward)
        --held;
    }
    timeline.peakStashed.push_back(peak);
  }
  return timeline;
}

double ScheduleTimeline::meanIdleFraction() const {
  double sum = 0;
  for (double f : idleFraction)
    sum += f;
  return idleFraction.empty() ? 0 : sum / idleFraction.size();
}

int64_t megatron::megatronForwardsInFlight(ScheduleKind kind, int64_t p,
                                           int64_t v, int64_t m, int64_t r) {
  switch (kind) {
  case ScheduleKind::GPipe:
    return m;
  case ScheduleKind::OneFOneB:
    return std::min(p - r, m);
  case ScheduleKind::Interleaved:
    if (m == p)
      return v * m;
    return std::min(2 * (p - r - 1) + (v - 1) * p + 1, v * m);
  }
  return m;
}

double megatron::analyticBubbleFraction(ScheduleKind kind, int64_t p,
                                        int64_t v, int64_t m) {
  double steps = kind == ScheduleKind::Interleaved ? double(v) * m : double(m);
  return (p - 1) / (steps + p - 1);
}

static std::string label(const ScheduleAction &a, const PipelineSchedule &s) {
  std::string text = (a.kind == ScheduleAction::Forward ? "F" : "B") +
                     std::to_string(a.microBatch);
  if (s.virtualSize > 1)
    text += "." + std::to_string(a.stage / s.pipelineSize);
  return text;
}

void megatron::printScheduleText(const PipelineSchedule &schedule,
                                 const ScheduleTimeline &timeline,
                                 llvm::raw_ostream &os) {
  // One column per shortest pass; F<m>[.<chunk>] forward, B backward.
  double unit = 0;
  for (const auto &slots : timeline.ranks)
    for (const auto &slot : slots)
      if (unit == 0 || slot.end - slot.start < unit)
        unit = slot.end - slot.start;
  const int width = schedule.virtualSize > 1 ? 6 : 4;
  for (int64_t r = 0; r < schedule.pipelineSize; ++r) {
    os << llvm::format("rank %-3lld|", (long long)r);
    int64_t column = 0;
    for (const auto &slot : timeline.ranks[r]) {
      int64_t start = static_cast<int64_t>(slot.start / unit + 0.5);
      int64_t end = static_cast<int64_t>(slot.end / unit + 0.5);
      for (; column < start; ++column)
        os << std::string(width - 1, ' ') << '.';
      std::string text = label(*slot.action, schedule);
      int64_t cells = std::max<int64_t>(end - start, 1);
      std::string cell = text + std::string(cells * width - text.size(), ' ');
      os << cell;
      column = start + cells;
    }
    os << "|\n";
  }
}

void megatron::printScheduleSvg(const PipelineSchedule &schedule,
                                const ScheduleTimeline &timeline,
                                llvm::raw_ostream &os) {
  const double width = 960, row = 28, left = 64;
  const double height = row * schedule.pipelineSize + 40;
  os << llvm::format("<svg xmlns=\"http://www.w3.org/2000/svg\" "
                     "width=\"%.0f\" height=\"%.0f\" font-family=\"monospace\" "
                     "font-size=\"10\">\n",
                     width + left + 8, height);
  os << "<title>" << scheduleKindName(schedule.kind) << " schedule: "
     << schedule.pipelineSize << " ranks, " << schedule.virtualSize
     << " virtual stage" << (schedule.virtualSize > 1 ? "s" : "")
     << " per rank, " << schedule.microBatches
     << " micro-batches</title>\n";
  double scale = timeline.makespan > 0 ? width / timeline.makespan : 0;
  for (int64_t r = 0; r < schedule.pipelineSize; ++r) {
    double y = 8 + r * row;
    os << llvm::format("<text x=\"4\" y=\"%.1f\">rank %lld</text>\n",
                       y + row / 2 + 3, (long long)r);
    for (const auto &slot : timeline.ranks[r]) {
      bool forward = slot.action->kind == ScheduleAction::Forward;
      int64_t chunk = slot.action->stage / schedule.pipelineSize;
      const char *fill = forward ? (chunk % 2 ? "#9ecae1" : "#4e79a7")
                                 : (chunk % 2 ? "#a1d99b" : "#59a14f");
      double x = left + slot.start * scale, w = (slot.end - slot.start) * scale;
      os << llvm::format("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                         "height=\"%.1f\" fill=\"%s\" stroke=\"white\"/>",
                         x, y, w, row - 4, fill);
      os << llvm::format("<text x=\"%.2f\" y=\"%.1f\" fill=\"white\">%s</text>\n",
                         x + 2, y + row / 2 + 1,
                         label(*slot.action, schedule).c_str());
    }
  }
  os << llvm::format("<text x=\"%.1f\" y=\"%.1f\">idle (mean) %.4f; forward "
                     "blue, backward green</text>\n",
                     left, height - 8, timeline.meanIdleFraction());
  os << "</svg>\n";
}
