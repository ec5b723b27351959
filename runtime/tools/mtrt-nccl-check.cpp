// mtrt-nccl-check: checks a multi-process launch end to end. Started once per
// rank by torchrun, mpirun or by hand (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, or an MPI launcher's variables), it joins the
// world through the TCP rendezvous and the NCCL communicator and runs every
// collective for a number of steps, checking each result against values
// computed here from every rank's formula. Faults for the watchdog's tests:
// --stall-at-step keeps this rank's stream busy (a hung rank), and killing
// a rank mid-run leaves the others waiting; either way every rank must exit
// within --collective-timeout (plus the watchdog's poll) naming the rank,
// the call and the step.
//
// --rendezvous-only stops after the rendezvous (no GPU or NCCL needed).
#include "comm/NcclCommunicator.h"
#include "comm/Rendezvous.h"
#include "core/Error.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

cudaError_t launchStall(cudaStream_t stream, double seconds);

namespace {

using namespace mtrt;
using namespace mtrt::comm;

struct Options {
  int steps = 5;
  int64_t count = 1 << 16;
  double collectiveTimeout = 300;
  int stallAtStep = -1;
  int stepMilliseconds = 0;
  bool rendezvousOnly = false;
};

[[noreturn]] void usage(const std::string &problem) {
  std::cerr << "mtrt-nccl-check: " << problem
            << "\nusage: mtrt-nccl-check [--steps N] [--count N] "
               "[--collective-timeout SECONDS] [--stall-at-step N] "
               "[--step-ms N] [--rendezvous-only]\n";
  std::exit(2);
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> double {
      if (i + 1 >= argc)
        usage(flag + " needs a value");
      char *end = nullptr;
      double v = std::strtod(argv[++i], &end);
      if (*end || !(v >= 0))
        usage(flag + ": found '" + argv[i] + "', expected a number >= 0");
      return v;
    };
    if (flag == "--steps")
      o.steps = static_cast<int>(value());
    else if (flag == "--count")
      o.count = std::max<int64_t>(1, static_cast<int64_t>(value()));
    else if (flag == "--collective-timeout")
      o.collectiveTimeout = value();
    else if (flag == "--stall-at-step")
      o.stallAtStep = static_cast<int>(value());
    else if (flag == "--step-ms")
      o.stepMilliseconds = static_cast<int>(value());
    else if (flag == "--rendezvous-only")
      o.rendezvousOnly = true;
    else
      usage("unknown flag '" + flag + "'");
  }
  return o;
}

void check(cudaError_t error, const char *what) {
  if (error != cudaSuccess)
    throw Error(MTRT_STATUS_INTERNAL, std::string(what) + ": " +
                                          cudaGetErrorString(error));
}

/// Rank r's contribution at element i of step s: exact in fp32 sums.
float value(int rank, int64_t i, int step) {
  return static_cast<float>((rank + 1) * 1000 + (i % 997) + step * 7);
}

/// Device memory for the checks.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : size(n) {
    check(cudaMalloc(reinterpret_cast<void **>(&data), n * sizeof(float)),
          "cudaMalloc");
  }
  ~DeviceFloats() { (void)cudaFree(data); }
  void upload(const std::vector<float> &host, cudaStream_t s) {
    check(cudaMemcpyAsync(data, host.data(), host.size() * sizeof(float),
                          cudaMemcpyHostToDevice, s),
          "upload");
  }
  std::vector<float> download(cudaStream_t s) const {
    std::vector<float> host(size);
    check(cudaMemcpyAsync(host.data(), data, size * sizeof(float),
                          cudaMemcpyDeviceToHost, s),
          "download");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return host;
  }
  float *data = nullptr;
  size_t size;
};

/// Counts mismatches of `got` against expected(i); prints the first.
int64_t compare(const std::string &what, const std::vector<float> &got,
                const std::function<float(int64_t)> &expected) {
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i)
    if (got[i] != expected(i) && bad++ == 0)
      std::cerr << "  " << what << ": element " << i << " is " << got[i]
                << ", expected " << expected(i) << "\n";
  return bad;
}

int64_t runStep(NcclCommunicator &c, const Options &o, int step) {
  int rank = c.rank(), size = c.size();
  int64_t n = o.count;
  cudaStream_t s = c.stream();
  std::string label = "mtrt-nccl-check";
  CallInfo info{label, step};
  std::vector<float> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    mine[i] = value(rank, i, step);
  int64_t bad = 0;

  if (step == o.stallAtStep) {
    std::cerr << "rank " << rank << ": stalling its stream at step " << step
              << " for " << o.collectiveTimeout + 60 << " s\n";
    check(launchStall(s, o.collectiveTimeout + 60), "launching the stall");
  }

  DeviceFloats x(n), y(n), gathered(n * size), scattered(n);
  x.upload(mine, s);
  c.allReduce(x.data, y.data, n, DType::F32, ReduceOp::Sum, info);
  bad += compare("all_reduce", y.download(s), [&](int64_t i) {
    float sum = 0;
    for (int r = 0; r < size; ++r)
      sum += value(r, i, step);
    return sum;
  });
  c.allGather(x.data, gathered.data, n, DType::F32, info);
  bad += compare("all_gather", gathered.download(s), [&](int64_t i) {
    return value(static_cast<int>(i / n), i % n, step);
  });
  // reduce_scatter of the gathered blocks: block `rank` summed over ranks,
  // i.e. size * value(rank, i).
  c.reduceScatter(gathered.data, scattered.data, n, DType::F32, ReduceOp::Sum,
                  info);
  bad += compare("reduce_scatter", scattered.download(s), [&](int64_t i) {
    return static_cast<float>(size) * value(rank, i, step);
  });
  int root = step % size;
  y.upload(mine, s);
  c.broadcast(y.data, n, DType::F32, root, info);
  bad += compare("broadcast", y.download(s),
                 [&](int64_t i) { return value(root, i, step); });
  int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  c.sendRecv(x.data, next, y.data, previous, n, DType::F32, info);
  bad += compare("send_recv", y.download(s),
                 [&](int64_t i) { return value(previous, i, step); });
  // Host buffers: staged through the device.
  std::vector<float> hostOut(static_cast<size_t>(n));
  c.allReduce(mine.data(), hostOut.data(), n, DType::F32, ReduceOp::Max, info);
  bad += compare("all_reduce max (host buffers)", hostOut, [&](int64_t i) {
    return value(size - 1, i, step);
  });
  c.barrier(info);
  return bad;
}

int run(int argc, char **argv) {
  Options o = parse(argc, argv);
  std::optional<LaunchEnvironment> env = readLaunchEnvironment();
  if (!env)
    usage("no launcher variables (RANK and WORLD_SIZE, or an MPI "
          "launcher's); start it with torchrun, mpirun or "
          "RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port");
  auto timeout = std::chrono::milliseconds(
      static_cast<int64_t>(o.collectiveTimeout * 1000));
  if (o.rendezvousOnly) {
    std::vector<uint8_t> bytes(128);
    if (env->rank == 0) {
      std::random_device random;
      for (uint8_t &b : bytes)
        b = static_cast<uint8_t>(random());
    }
    bytes = rendezvous(*env, bytes, timeout);
    uint32_t sum = 0;
    for (uint8_t b : bytes)
      sum = sum * 31 + b;
    std::printf("rank %d of %d (%s): rendezvous through %s:%d gave rank 0's "
                "%zu bytes, checksum %08x\n",
                env->rank, env->worldSize, env->launcher.c_str(),
                env->masterAddr.c_str(), env->masterPort, bytes.size(), sum);
    return 0;
  }
  NcclOptions options;
  options.collectiveTimeout = timeout;
  options.initTimeout = std::max(timeout, std::chrono::milliseconds(60000));
  options.exitOnFailure = true;
  auto start = std::chrono::steady_clock::now();
  std::unique_ptr<NcclCommunicator> c = NcclCommunicator::create(*env, options);
  double initSeconds = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
  std::printf("rank %d of %d (%s): %s on CUDA device %d, group %s, "
              "initialized in %.2f s\n",
              c->rank(), c->size(), env->launcher.c_str(),
              NcclCommunicator::libraryVersion().c_str(), c->device(),
              c->name().c_str(), initSeconds);
  std::fflush(stdout);
  int64_t bad = 0;
  for (int step = 0; step < o.steps; ++step) {
    bad += runStep(*c, o, step);
    if (o.stepMilliseconds)
      std::this_thread::sleep_for(std::chrono::milliseconds(o.stepMilliseconds));
  }
  std::printf("rank %d: %d steps of all_reduce, all_gather, reduce_scatter, "
              "broadcast, send_recv, host all_reduce and barrier over %lld "
              "floats: %s\n",
              c->rank(), o.steps, static_cast<long long>(o.count),
              bad ? "MISMATCHES" : "all exact");
  return bad ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const mtrt::Error &e) {
    std::fflush(stdout);
    std::cerr << "mtrt-nccl-check: error: " << e.what() << "\n";
    return 1;
  }
}
