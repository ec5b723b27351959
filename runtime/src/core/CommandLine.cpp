// The command-line mechanism of the runtime's tools (core/CommandLine.h).
#include "core/CommandLine.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace mtrt {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

} // namespace

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknownFlagMessage(const std::string &flag,
                               const std::vector<std::string> &candidates,
                               const std::string &tool) {
  std::string best;
  size_t bestDistance = std::numeric_limits<size_t>::max();
  for (const std::string &candidate : candidates)
    if (size_t d = editDistance(flag, candidate); d < bestDistance) {
      bestDistance = d;
      best = candidate;
    }
  std::string message = "unknown flag " + flag;
  if (bestDistance <= std::max<size_t>(3, flag.size() / 3))
    message += "; did you mean " + best + "?";
  return message + " (" + tool + " --help lists the flags)";
}

int64_t parseIntFlag(const std::string &flag, const std::string &text,
                     int64_t min) {
  errno = 0;
  char *end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    invalid(flag + ": found '" + text + "', expected an integer");
  if (value < min)
    invalid(flag + ": found " + text +
            ", expected an integer >= " + std::to_string(min));
  return value;
}

std::string flagUsageLine(const char *name, const char *metavar,
                          const char *help, size_t column) {
  std::string line = std::string("  ") + name;
  if (metavar)
    line += std::string(" ") + metavar;
  if (line.size() < column)
    line += std::string(column - line.size(), ' ');
  else
    line += "\n" + std::string(column, ' ');
  return line + help + "\n";
}

namespace detail {

bool isPositional(const std::string &arg) {
  return arg.size() < 2 || arg[0] != '-';
}

FlagArgument splitFlagArgument(const std::string &arg) {
  FlagArgument flag;
  flag.name = arg;
  if (size_t eq = arg.find('='); eq != std::string::npos) {
    flag.name = arg.substr(0, eq);
    flag.value = arg.substr(eq + 1);
    flag.inlineValue = true;
  }
  return flag;
}

void takeFlagValue(const std::vector<std::string> &args, size_t &i,
                   const char *metavar, FlagArgument &flag) {
  if (!metavar) {
    if (flag.inlineValue)
      invalid(flag.name + " takes no value");
  } else if (!flag.inlineValue) {
    if (i + 1 >= args.size())
      invalid(flag.name + " needs a value: " + flag.name + " " + metavar);
    flag.value = args[++i];
  }
}

} // namespace detail

} // namespace mtrt
