// mtrt-cuda-tests' main: GoogleTest's, plus `--mtrt-device-check`, which
// lit's GPU suite (test/gpu/lit.cfg.py) runs to learn whether the GPU tests
// can run here and, if not, why.
#include "CudaTestSupport.h"

#include "gtest/gtest.h"

#include <cstdio>
#include <cstring>

int main(int argc, char **argv) {
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
