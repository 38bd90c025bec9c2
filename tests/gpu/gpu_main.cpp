// main() of the GPU test executable. Without an sm_90 GPU every test is reported as skipped by
// ctest (exit code 77) with the reason printed; listing tests works everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "mxmoe/cuda.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::strncmp(argv[i], "--gtest_list_tests", 18) == 0;
  testing::InitGoogleTest(&argc, argv);
  if (!listing) {
    std::string why;
    if (!mxmoe::cuda::available(&why)) {
      std::printf("SKIPPED: GPU tests need an sm_90 GPU: %s\n", why.c_str());
      return 77;
    }
    std::printf("GPU: %s\n", mxmoe::cuda::device_name().c_str());
  }
  return RUN_ALL_TESTS();
}
