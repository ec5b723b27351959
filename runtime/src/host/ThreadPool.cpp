// The host backend's thread pool: static assignment of chunks to workers.
#include "host/ThreadPool.h"

#include <algorithm>

namespace mtrt::host {

namespace {
// The pool whose chunk the current thread is running, if any, so that nested
// parallelFor calls run serially instead of waiting on themselves.
thread_local const ThreadPool *currentPool = nullptr;

struct CurrentPoolScope {
  const ThreadPool *saved;
  explicit CurrentPoolScope(const ThreadPool *pool) : saved(currentPool) {
    currentPool = pool;
  }
  ~CurrentPoolScope() { currentPool = saved; }
};
} // namespace

ThreadPool::ThreadPool(unsigned numThreads) {
  if (numThreads == 0)
    numThreads = std::max(1u, std::thread::hardware_concurrency());
  numThreads_ = numThreads;
  workers_.reserve(numThreads_ - 1);
  for (unsigned i = 1; i < numThreads_; ++i)
    workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread &worker : workers_)
    worker.join();
}

int64_t ThreadPool::chunkCount(int64_t n, int64_t grain, unsigned threads) {
  if (n <= 0)
    return 0;
  grain = std::max<int64_t>(grain, 1);
  int64_t byGrain = (n + grain - 1) / grain;
  return std::min<int64_t>(byGrain, threads);
}

void ThreadPool::runChunk(int64_t chunk) {
  // n * chunk fits: n < 2^62 for any buffer, chunk < thread count.
  int64_t chunkBegin = begin_ + length_ * chunk / chunks_;
  int64_t chunkEnd = begin_ + length_ * (chunk + 1) / chunks_;
  try {
    CurrentPoolScope scope(this);
    thunk_(context_, chunkBegin, chunkEnd);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_)
      error_ = std::current_exception();
  }
}

void ThreadPool::run(int64_t begin, int64_t end, int64_t grain, Thunk thunk,
                     void *context) {
  int64_t n = end - begin;
  int64_t chunks = chunkCount(n, grain, numThreads_);
  if (chunks == 0)
    return;
  if (chunks == 1 || currentPool == this) {
    CurrentPoolScope scope(this);
    thunk(context, begin, end);
    return;
  }

  std::lock_guard<std::mutex> submit(submitMutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    thunk_ = thunk;
    context_ = context;
    begin_ = begin;
    length_ = n;
    chunks_ = chunks;
    error_ = nullptr;
    pending_ = chunks - 1;
    ++generation_;
  }
  wake_.notify_all();
  runChunk(0);

  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    error = error_;
    error_ = nullptr;
  }
  if (error)
    std::rethrow_exception(error);
}

void ThreadPool::workerLoop(unsigned workerIndex) {
  uint64_t seen = 0;
  for (;;) {
    int64_t chunk;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_)
        return;
      seen = generation_;
      chunk = workerIndex;
      if (chunk >= chunks_)
        continue;
    }
    runChunk(chunk);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0)
        done_.notify_one();
    }
  }
}

} // namespace mtrt::host
