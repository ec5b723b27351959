//===- PrintOverlap.cpp - What each collective hides behind ----------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <tuple>

namespace mlir::mt {
#define GEN_PASS_DEF_PRINTOVERLAPPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {
/// One collective of the simulated run.
struct Row {
  CollectiveCost cost;
  std::string axes;
  double begin = 0, end = 0, exposed = 0;
  /// The compute ops that ran while it did: kind -> microseconds hidden.
  llvm::MapVector<StringRef, double> behind;
  /// A gradient bucket's reduction: its index in its buffer, else -1.
  int64_t bucket = -1;
  /// --overlap-param-gather: the bucket whose parameters it gathers, else
  /// -1.
  int64_t gather = -1;
  /// A chunk of --tp-comm-overlap: "c<j>/<chunks>", else empty.
  std::string chunk;
};

/// A gradient bucket of --overlap-grad-reduce (mt-plan-gradient-reduction):
/// its function's collective (an all-reduce, or the distributed
/// optimizer's reduce-scatter), the gradients it waits for, and with
/// --overlap-param-gather the all-gather of its parameters that the next
/// step waits for where it first reads one.
struct Bucket {
  int64_t index = 0;
  Operation *collective = nullptr;
  Operation *gather = nullptr;
  llvm::StringSet<> members;
};
} // namespace

/// The gradient buckets of the module, by their buffer's reduce function.
static SmallVector<Bucket> bucketsOf(ModuleOp module) {
  SmallVector<Bucket> buckets;
  llvm::StringMap<int64_t> counts;
  for (auto function : module.getOps<func::FuncOp>()) {
    auto of = function->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_of");
    auto members = function->getAttrOfType<ArrayAttr>("mt.gradient_bucket");
    if (!of || !members || function.isExternal())
      continue;
    Bucket bucket;
    bucket.index = counts[of.getValue()]++;
    function.walk([&](Operation *op) {
      if (isa<shard::AllReduceOp, shard::ReduceScatterOp>(op))
        bucket.collective = op;
    });
    if (auto gather =
            function->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_gather"))
      if (auto gatherFunction =
              module.lookupSymbol<func::FuncOp>(gather.getValue());
          gatherFunction && !gatherFunction.isExternal() &&
          gatherFunction->hasAttr("mt.overlap_param_gather"))
        gatherFunction.walk([&](shard::AllGatherOp op) { bucket.gather = op; });
    for (auto member : members.getAsRange<FlatSymbolRefAttr>())
      bucket.members.insert(member.getValue());
    if (bucket.collective)
      buckets.push_back(std::move(bucket));
  }
  return buckets;
}

/// Per op of `function`, the buckets whose last gradient it makes: every
/// member of the bucket is a gradient result of the function.
static DenseMap<Operation *, SmallVector<size_t>>
bucketStarts(func::FuncOp function, ArrayRef<Bucket> buckets,
             llvm::DenseSet<size_t> &simulated) {
  DenseMap<Operation *, SmallVector<size_t>> starts;
  auto ret = cast<func::ReturnOp>(function.getBody().front().getTerminator());
  llvm::StringMap<Operation *> producer;
  for (OpOperand &result : ret->getOpOperands())
    if (auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
            result.getOperandNumber(), "mt.gradient"))
      producer[parameter.getValue()] = result.get().getDefiningOp();
  for (auto [index, bucket] : llvm::enumerate(buckets)) {
    Operation *last = nullptr;
    bool complete = true;
    for (const auto &member : bucket.members) {
      Operation *op = producer.lookup(member.getKey());
      if (!op) {
        complete = false;
        break;
      }
      if (!last || last->isBeforeInBlock(op))
        last = op;
    }
    if (!complete || !last)
      continue;
    // A split collective's result is written at its start.
    if (auto wait = dyn_cast<CollectiveWaitOp>(last))
      last = wait.getFuture().getDefiningOp();
    starts[last].push_back(index);
    simulated.insert(index);
  }
  return starts;
}

static std::string axesOf(Operation *collective) {
  std::string text;
  llvm::raw_string_ostream os(text);
  auto axes = collective->getAttrOfType<DenseI16ArrayAttr>("grid_axes");
  os << "[";
  if (axes)
    llvm::interleaveComma(axes.asArrayRef(), os);
  os << "]";
  return text;
}

/// The text of "behind": the ops that hid it, longest first, three at most.
static std::string describeBehind(const Row &row) {
  if (row.behind.empty())
    return "-";
  SmallVector<std::pair<StringRef, double>> kinds(row.behind.begin(),
                                                  row.behind.end());
  llvm::stable_sort(kinds, [](auto &a, auto &b) { return a.second > b.second; });
  std::string text;
  llvm::raw_string_ostream os(text);
  for (auto [index, kind] : llvm::enumerate(kinds)) {
    if (index == 3) {
      os << " +" << (kinds.size() - 3) << " kinds";
      break;
    }
    os << (index ? ", " : "") << kind.first
       << llvm::format(" %.1f", kind.second);
  }
  return text;
}

/// The ranks that run `function`: every rank of its grid, at one pipeline
/// stage if it is one's.
static std::string ranksOf(ModuleOp module, func::FuncOp function) {
  std::string text;
  llvm::raw_string_ostream os(text);
  auto grids = llvm::to_vector(module.getOps<shard::GridOp>());
  int64_t ranks = 1;
  if (!grids.empty()) {
    os << "grid ";
    llvm::interleave(grids.front().getShape(), os, "x");
    for (int64_t size : grids.front().getShape())
      ranks *= size;
  } else {
    os << "one rank";
  }
  auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
  if (stage)
    os << ", pipeline stage " << stage.getInt();
  os << " (" << ranks << (ranks == 1 ? " rank" : " ranks")
     << (stage ? " of the stage" : "") << " alike)";
  return text;
}

void mt::printOverlap(ModuleOp module, const CostModel &model,
                      llvm::raw_ostream &os) {
  os << "overlap: each collective's predicted time on one rank, the part "
        "hidden behind computation, and what hides it (cost model: "
     << model.deviceName << "; NVLink "
     << llvm::format("%.0f", model.nvlink.bytesPerUs / 1e3) << " GB/s, "
     << llvm::format("%.0f", model.nvlink.latencyUs) << " us; network "
     << llvm::format("%.0f", model.network.bytesPerUs / 1e3) << " GB/s, "
     << llvm::format("%.0f", model.network.latencyUs) << " us; "
     << model.gpusPerNode << " GPUs a node)\n";
  bool any = false;
  SmallVector<Bucket> buckets = bucketsOf(module);
  llvm::DenseSet<size_t> simulated;
  llvm::StringSet<> bucketed, gathered;
  for (auto function : module.getOps<func::FuncOp>())
    if (auto of = function->getAttrOfType<FlatSymbolRefAttr>("mt.bucket_of")) {
      bucketed.insert(of.getValue());
      // Per-bucket shards: the buckets' gathers replace the whole buffer's.
      if (auto reduce = module.lookupSymbol<func::FuncOp>(of.getValue()))
        if (function->hasAttr("mt.bucket_gather"))
          if (auto layout =
                  reduce->getAttrOfType<ArrayAttr>("mt.gradient_buffer")) {
            for (auto candidate : module.getOps<func::FuncOp>())
              if (candidate->getAttr("mt.parameter_buffer") == layout &&
                  candidate->getAttr("mt.pipeline_rank") ==
                      reduce->getAttr("mt.pipeline_rank"))
                bucketed.insert(candidate.getSymName());
          }
    }
  // --overlap-param-gather: train_step waits for each bucket's gather
  // where it first reads the bucket's parameters.
  for (const Bucket &bucket : buckets)
    if (bucket.gather)
      gathered.insert(
          bucket.gather->getParentOfType<func::FuncOp>().getSymName());
  // The training functions first, so that the buckets they reduce are
  // shown there; the bucket functions they cover are left out below.
  SmallVector<func::FuncOp> functions;
  for (auto function : module.getOps<func::FuncOp>())
    if (!function->hasAttr("mt.bucket_of"))
      functions.push_back(function);
  for (auto function : module.getOps<func::FuncOp>())
    if (function->hasAttr("mt.bucket_of"))
      functions.push_back(function);
  for (auto function : functions) {
    if (function.isExternal())
      continue;
    // With buckets, the whole-buffer reduction (and gather) does not run;
    // the gathers train_step waits for are shown there.
    if (bucketed.contains(function.getSymName()) ||
        gathered.contains(function.getSymName()))
      continue;
    if (function->hasAttr("mt.bucket_of")) {
      bool shown = false;
      for (auto [index, bucket] : llvm::enumerate(buckets))
        if (simulated.contains(index) &&
            bucket.collective->getParentOfType<func::FuncOp>() == function)
          shown = true;
      if (shown)
        continue;
    }
    DenseMap<Operation *, SmallVector<size_t>> startsAt =
        bucketStarts(function, buckets, simulated);
    CommunicationTimeline timeline;
    double chunkCopies = 0;
    SmallVector<Row> rows;
    DenseMap<Operation *, size_t> rowOf;
    SmallVector<size_t> inFlight;
    auto issue = [&](Operation *collective) {
      Row row;
      row.cost = model.collective(collective);
      row.axes = axesOf(collective);
      if (auto chunk =
              collective->getAttrOfType<DenseI64ArrayAttr>(
                  kCollectiveChunkAttrName);
          chunk && chunk.size() == 2)
        row.chunk = ("c" + llvm::Twine(chunk[0]) + "/" + llvm::Twine(chunk[1]))
                        .str();
      std::tie(row.begin, row.end) = timeline.issue(row.cost.us);
      rows.push_back(std::move(row));
      return rows.size() - 1;
    };
    auto finish = [&](size_t index) {
      Row &row = rows[index];
      row.exposed = timeline.wait(row.end);
      llvm::erase(inFlight, index);
    };
    // With buckets, each gradient is accumulated right after the op that
    // makes it (the bundle's order), not by the return at the end.
    DenseMap<Operation *, double> accumulateUs;
    if (!startsAt.empty()) {
      auto ret =
          cast<func::ReturnOp>(function.getBody().front().getTerminator());
      for (OpOperand &result : ret->getOpOperands()) {
        Operation *producer = result.get().getDefiningOp();
        if (!producer ||
            !function.getResultAttr(result.getOperandNumber(), "mt.gradient"))
          continue;
        if (auto wait = dyn_cast<CollectiveWaitOp>(producer))
          producer = wait.getFuture().getDefiningOp();
        accumulateUs[producer] +=
            model.gradientAccumulationMicroseconds(result.get());
      }
    }
    // --overlap-param-gather: every bucket's gather is issued as the step
    // starts, in the order the step first reads them, and each is waited
    // for by the first op that reads one of its parameters.
    DenseMap<Value, size_t> gatherOf;
    if (function.getSymName() == "train_step" && !gathered.empty()) {
      DenseMap<Value, size_t> bucketOfArgument;
      for (BlockArgument argument : function.getArguments())
        if (auto parameter = function.getArgAttrOfType<FlatSymbolRefAttr>(
                argument.getArgNumber(), "mt.parameter"))
          for (auto [b, bucket] : llvm::enumerate(buckets))
            if (bucket.gather && bucket.members.contains(parameter.getValue()))
              bucketOfArgument[argument] = b;
      SmallVector<size_t> order;
      for (Operation &op : function.getBody().front())
        for (Value operand : op.getOperands())
          if (auto b = bucketOfArgument.find(operand);
              b != bucketOfArgument.end() &&
              !llvm::is_contained(order, b->second))
            order.push_back(b->second);
      DenseMap<size_t, size_t> rowOfBucket;
      for (size_t b : order) {
        size_t index = issue(buckets[b].gather);
        rows[index].gather = buckets[b].index;
        inFlight.push_back(index);
        rowOfBucket[b] = index;
      }
      for (auto [argument, b] : bucketOfArgument)
        if (rowOfBucket.count(b))
          gatherOf[argument] = rowOfBucket[b];
    }
    for (Operation &op : function.getBody().front()) {
      if (!startsAt.empty() && isa<func::ReturnOp>(op))
        continue;
      for (Value operand : op.getOperands())
        if (auto row = gatherOf.find(operand); row != gatherOf.end())
          if (llvm::is_contained(inFlight, row->second))
            finish(row->second);
      if (auto start = dyn_cast<CollectiveStartOp>(op)) {
        size_t index = issue(start.getCollective());
        rowOf[start.getWait()] = index;
        inFlight.push_back(index);
        continue;
      }
      if (isa<CollectiveWaitOp>(op)) {
        finish(rowOf.lookup(&op));
        continue;
      }
      if (isa<shard::AllReduceOp, shard::AllGatherOp, shard::ReduceScatterOp>(
              op)) {
        finish(issue(&op));
        continue;
      }
      // Megatron-LM's --overlap-grad-reduce: a bucket's reduction starts
      // once its last gradient is made (in the last micro-batch) and is
      // waited for at the step's end.
      auto issueBuckets = [&] {
        for (size_t b : startsAt.lookup(&op)) {
          size_t index = issue(buckets[b].collective);
          rows[index].bucket = buckets[b].index;
          inFlight.push_back(index);
        }
      };
      double us = model.opMicroseconds(&op) + accumulateUs.lookup(&op);
      if (us <= 0) {
        issueBuckets();
        continue;
      }
      // The time of this op that overlaps each collective in flight.
      for (size_t index : inFlight) {
        Row &row = rows[index];
        double overlap = std::min(timeline.now + us, row.end) -
                         std::max(timeline.now, row.begin);
        if (overlap > 0)
          row.behind[op.getName().stripDialect()] += overlap;
      }
      timeline.compute(us);
      if (op.hasAttr(kChunkCopyAttrName))
        chunkCopies += us;
      issueBuckets();
    }
    for (size_t index : SmallVector<size_t>(inFlight))
      if (rows[index].bucket >= 0 || rows[index].gather >= 0)
        finish(index);
    if (rows.empty())
      continue;
    any = true;
    os << "\n" << function.getSymName() << ": " << ranksOf(module, function)
       << "\n";
    os << llvm::formatv("  {0,-3} {1,-19} {2,-6} {3,5} {4,-7} {5,12} "
                        "{6,12} {7,10} {8,11}  {9}\n",
                        "#", "collective", "axes", "ranks", "link", "bytes",
                        "predicted_us", "hidden_us", "exposed_us",
                        "behind (op us)");
    double total = 0, exposed = 0;
    for (auto [index, row] : llvm::enumerate(rows)) {
      total += row.cost.us;
      exposed += row.exposed;
      os << llvm::formatv(
          "  {0,-3} {1,-19} {2,-6} {3,5} {4,-7} {5,12} {6,12:F1} {7,10:F1} "
          "{8,11:F1}  {9}\n",
          index,
          row.bucket >= 0
              ? ("b" + llvm::Twine(row.bucket) + ":" + row.cost.kind).str()
          : row.gather >= 0
              ? ("g" + llvm::Twine(row.gather) + ":" + row.cost.kind).str()
          : !row.chunk.empty() ? row.chunk + ":" + row.cost.kind.str()
                               : row.cost.kind.str(),
          row.axes, row.cost.groupSize, row.cost.network ? "network" : "nvlink",
          row.cost.bytes, row.cost.us, std::max(0.0, row.cost.us - row.exposed),
          row.exposed, describeBehind(row));
    }
    os << llvm::formatv("  exposed communication: {0:F1} us of {1:F1} us "
                        "({2:F0}% hidden); computation {3:F1} us; step "
                        "{4:F1} us\n",
                        exposed, total,
                        total > 0
                            ? 100.0 * std::max(0.0, total - exposed) / total
                            : 100.0,
                        timeline.computeUs, timeline.now);
    if (chunkCopies > 0)
      os << llvm::formatv("  of the computation, the slices and joins of "
                          "--tp-comm-overlap's chunks: {0:F1} us\n",
                          chunkCopies);
  }
  if (!any)
    os << "no collectives in any function: nothing to overlap (a pipeline's "
          "sends and receives are not IR yet; --report schedule shows "
          "them)\n";
}

namespace {
struct PrintOverlapPass : mt::impl::PrintOverlapPassBase<PrintOverlapPass> {
  using Base::Base;
  void runOnOperation() override {
    llvm::Expected<CostModel> model = CostModel::load(costModel);
    if (!model) {
      getOperation().emitError()
          << llvm::toString(model.takeError());
      return signalPassFailure();
    }
    printOverlap(getOperation(), *model, llvm::outs());
    markAllAnalysesPreserved();
  }
};
} // namespace
