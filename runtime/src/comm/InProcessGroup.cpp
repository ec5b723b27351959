// The in-process group's constructor: its name and empty rendezvous state.
#include "comm/InProcessGroup.h"

#include <atomic>

namespace mtrt::comm {

namespace {
std::atomic<uint64_t> lastGroupId{0};
} // namespace

InProcessGroup::InProcessGroup(std::string baseName, std::vector<int> ranks)
    : name(groupName(baseName, ranks)), id(++lastGroupId),
      members(std::move(ranks)), slots(members.size(), nullptr),
      splitResults(members.size()), channels(members.size() * members.size()) {}

} // namespace mtrt::comm
