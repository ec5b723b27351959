// One thread per in-process rank; a failing rank aborts the world.
#include "comm/RunRanks.h"

#include <memory>
#include <string>
#include <thread>

namespace mtrt::comm {

std::vector<std::exception_ptr>
runRanks(InProcessWorld &world, const std::function<void(Communicator &)> &fn) {
  int n = world.size();
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int r = 0; r < n; ++r)
    communicators.push_back(world.communicator(r));
  std::vector<std::exception_ptr> errors(n);
  auto body = [&](int r) {
    Communicator &communicator = *communicators[r];
    try {
      fn(communicator);
    } catch (const std::exception &e) {
      errors[r] = std::current_exception();
      communicator.abort(e.what());
    } catch (...) {
      errors[r] = std::current_exception();
      communicator.abort("an exception of unknown type");
    }
    world.rankFinished(r);
  };
  std::vector<std::thread> threads;
  try {
    for (int r = 0; r < n; ++r)
      threads.emplace_back(body, r);
  } catch (...) {
    // Could not start every thread: release those that did.
    world.abort("could not start a thread for every rank");
    for (std::thread &thread : threads)
      thread.join();
    throw;
  }
  for (std::thread &thread : threads)
    thread.join();
  return errors;
}

} // namespace mtrt::comm
