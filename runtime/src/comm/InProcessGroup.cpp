// The in-process group's constructor: its name and empty rendezvous state.
#include "comm/InProcessGroup.h"

namespace mtrt::comm {

InProcessGroup::InProcessGroup(std::string baseName, std::vector<int> ranks)
    : name(groupName(baseName, ranks)), members(std::move(ranks)),
      slots(members.size(), nullptr), splitResults(members.size()),
      channels(members.size() * members.size()) {}

} // namespace mtrt::comm
