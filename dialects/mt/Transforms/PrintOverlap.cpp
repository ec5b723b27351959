//===- PrintOverlap.cpp - What each collective hides behind ----------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

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
};
} // namespace

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
  for (auto function : module.getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    // The simulated run: one compute stream, one communication stream that
    // runs collectives in issue order.
    double now = 0, commFree = 0, compute = 0;
    SmallVector<Row> rows;
    DenseMap<Operation *, size_t> rowOf;
    SmallVector<size_t> inFlight;
    auto issue = [&](Operation *collective) {
      Row row;
      row.cost = model.collective(collective);
      row.axes = axesOf(collective);
      row.begin = std::max(now, commFree);
      row.end = row.begin + row.cost.us;
      commFree = row.end;
      rows.push_back(std::move(row));
      return rows.size() - 1;
    };
    auto finish = [&](size_t index) {
      Row &row = rows[index];
      row.exposed = std::max(0.0, row.end - now);
      now = std::max(now, row.end);
      llvm::erase(inFlight, index);
    };
    for (Operation &op : function.getBody().front()) {
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
      double us = model.opMicroseconds(&op);
      if (us <= 0)
        continue;
      // The time of this op that overlaps each collective in flight.
      for (size_t index : inFlight) {
        Row &row = rows[index];
        double overlap =
            std::min(now + us, row.end) - std::max(now, row.begin);
        if (overlap > 0)
          row.behind[op.getName().stripDialect()] += overlap;
      }
      now += us;
      compute += us;
    }
    if (rows.empty())
      continue;
    any = true;
    os << "\n" << function.getSymName() << ": " << ranksOf(module, function)
       << "\n";
    os << llvm::formatv("  {0,-3} {1,-15} {2,-6} {3,5} {4,-7} {5,12} "
                        "{6,12} {7,10} {8,11}  {9}\n",
                        "#", "collective", "axes", "ranks", "link", "bytes",
                        "predicted_us", "hidden_us", "exposed_us",
                        "behind (op us)");
    double total = 0, exposed = 0;
    for (auto [index, row] : llvm::enumerate(rows)) {
      total += row.cost.us;
      exposed += row.exposed;
      os << llvm::formatv(
          "  {0,-3} {1,-15} {2,-6} {3,5} {4,-7} {5,12} {6,12:F1} {7,10:F1} "
          "{8,11:F1}  {9}\n",
          index, row.cost.kind, row.axes, row.cost.groupSize,
          row.cost.network ? "network" : "nvlink", row.cost.bytes, row.cost.us,
          std::max(0.0, row.cost.us - row.exposed), row.exposed,
          describeBehind(row));
    }
    os << llvm::formatv("  exposed communication: {0:F1} us of {1:F1} us "
                        "({2:F0}% hidden); computation {3:F1} us; step "
                        "{4:F1} us\n",
                        exposed, total,
                        total > 0
                            ? 100.0 * std::max(0.0, total - exposed) / total
                            : 100.0,
                        compute, now);
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
