// The groups of a grid rank, split from the world communicator.
#include "comm/RankContext.h"

#include <set>

#include <algorithm>

namespace mtrt::comm {

RankContext::RankContext(Communicator &world, std::vector<int64_t> gridShape)
    : world_(world), gridShape_(std::move(gridShape)) {
  int64_t ranks = 1;
  for (int64_t size : gridShape_)
    ranks *= size;
  if (ranks != world.size())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "RankContext: the grid " + shapeString(gridShape_) + " has " +
                    std::to_string(ranks) + " ranks but the world has " +
                    std::to_string(world.size()));
  coordinates_ = gridCoordinates(gridShape_, world.rank());
}

RankContext::~RankContext() = default;

Communicator &RankContext::group(const std::vector<int64_t> &axes) {
  auto it = groups_.find(axes);
  if (it != groups_.end())
    return *it->second;
  std::vector<int64_t> others;
  for (int64_t axis = 0; axis < static_cast<int64_t>(gridShape_.size()); ++axis)
    if (std::find(axes.begin(), axes.end(), axis) == axes.end())
      others.push_back(axis);
  int color =
      static_cast<int>(gridGroupIndex(gridShape_, coordinates_, others));
  int key = static_cast<int>(gridGroupIndex(gridShape_, coordinates_, axes));
  // [dp, tp] grids name their groups as Megatron-LM does.
  std::string name;
  for (int64_t axis : axes) {
    if (!name.empty())
      name += "_";
    name += gridShape_.size() == 2 ? (axis == 0 ? "dp" : "tp")
                                   : "axis" + std::to_string(axis);
  }
  if (name.empty())
    name = "self";
  std::string label = "split for grid axes " + shapeString(axes);
  std::unique_ptr<Communicator> comm =
      world_.split(color, key, name, CallInfo{label, -1});
  Communicator &result = *comm;
  groups_.emplace(axes, std::move(comm));
  return result;
}

/// The instructions that call a group of the grid.
static bool isCollective(Op op) {
  switch (op) {
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::Shift:
  case Op::AllToAll:
    return true;
  default:
    return false;
  }
}

void RankContext::prepare(const Bundle &bundle) {
  for (const Function &function : bundle.functions()) {
    for (const Instruction &inst : function.instructions)
      if (isCollective(inst.op))
        group(inst.attrs.gridAxes);
    std::vector<int64_t> connected = connectedAxes(function);
    if (!connected.empty())
      group(connected);
  }
}

std::vector<int64_t> RankContext::connectedAxes(const Function &function) {
  std::set<int64_t> axes;
  for (const Instruction &inst : function.instructions)
    if (isCollective(inst.op))
      axes.insert(inst.attrs.gridAxes.begin(), inst.attrs.gridAxes.end());
  return std::vector<int64_t>(axes.begin(), axes.end());
}

} // namespace mtrt::comm
