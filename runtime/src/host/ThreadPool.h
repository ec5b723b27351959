// A small fixed pool of threads that runs a loop's contiguous chunks in parallel.
#ifndef MTRT_SRC_HOST_THREADPOOL_H
#define MTRT_SRC_HOST_THREADPOOL_H

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace mtrt::host {

/// A fixed set of worker threads for the host kernels.
///
/// parallelFor splits [begin, end) into contiguous chunks, in a set that
/// depends only on the range, the grain and the pool's size, and runs each
/// chunk once. Kernels never let a result depend on the chunking: every output
/// element is written by one chunk with a fixed order of accumulation.
///
/// Thread-safety: parallelFor may be called from several threads at once;
/// calls are run one after the other. A parallelFor called from inside a
/// chunk of the same pool runs serially on the calling thread. Exceptions
/// thrown by a chunk are rethrown from parallelFor (the first one, the others
/// are dropped) after every chunk has finished.
class ThreadPool {
public:
  /// A pool of `numThreads` threads counting the caller's (numThreads - 1
  /// workers are started); 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(unsigned numThreads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  /// The number of threads that run chunks, the caller's included.
  unsigned size() const { return numThreads_; }

  /// Calls fn(chunkBegin, chunkEnd) over a partition of [begin, end) into
  /// min(size(), ceil((end - begin) / grain)) contiguous chunks of nearly
  /// equal size (the first ones one longer); the calling thread runs the
  /// first. With one chunk, fn runs on the caller. Returns when all are done.
  template <typename Fn>
  void parallelFor(int64_t begin, int64_t end, Fn &&fn, int64_t grain = 1) {
    using FnType = std::remove_reference_t<Fn>;
    run(begin, end, grain,
        [](void *context, int64_t chunkBegin, int64_t chunkEnd) {
          (*static_cast<FnType *>(context))(chunkBegin, chunkEnd);
        },
        const_cast<void *>(static_cast<const void *>(&fn)));
  }

  /// The chunk boundaries parallelFor uses: chunk c of `chunks` covers
  /// [begin + c * n / chunks, begin + (c + 1) * n / chunks), n = end - begin.
  static int64_t chunkCount(int64_t n, int64_t grain, unsigned threads);

private:
  using Thunk = void (*)(void *context, int64_t chunkBegin, int64_t chunkEnd);

  void run(int64_t begin, int64_t end, int64_t grain, Thunk thunk,
           void *context);
  void workerLoop(unsigned workerIndex);
  void runChunk(int64_t chunk);

  unsigned numThreads_;
  std::vector<std::thread> workers_;

  // One job at a time; submitMutex_ serializes callers.
  std::mutex submitMutex_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  int64_t pending_ = 0;

  // The job of the current generation, read by the workers under mutex_.
  Thunk thunk_ = nullptr;
  void *context_ = nullptr;
  int64_t begin_ = 0;
  int64_t length_ = 0;
  int64_t chunks_ = 0;
  std::exception_ptr error_;
};

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_THREADPOOL_H
