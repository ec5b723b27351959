// mtrt-cuda-tests' main: GoogleTest's, plus `--mtrt-device-check`, which
// lit's GPU suite (test/gpu/lit.cfg.py) runs to learn whether the GPU tests
// can run here and, if not, why.
#include "CudaTestSupport.h"

#include "gtest/gtest.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char **argv) {
  // Before CUDA starts: a hardware work queue for each stream of up to 16
  // in-process ranks, which their CUDA graphs with PeerGroup barriers need
  // (cuda::PeerGroup::hardwareQueues), unless the caller set a number.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  if (argc == 2 && std::strcmp(argv[1], "--mtrt-device-check") == 0) {
    std::string reason = mtrt::test::noGpuReason();
    if (!reason.empty()) {
      std::printf("%s\n", reason.c_str());
      return 1;
    }
    std::printf("CUDA devices: %d\n", mtrt::cuda::Context::deviceCount());
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
