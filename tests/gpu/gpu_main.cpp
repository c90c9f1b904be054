// Entry point of the GPU test binary: runs every test when a CUDA device is usable, and otherwise
// exits with 77, which CTest reports as "Skipped" (SKIP_RETURN_CODE), never as passed. tools/gpu-check
// fails when this binary skips.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "common/errors.h"
#include "kernels/cuda/cuda_device.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    const int count = touchstone::cuda_device_count();
    std::cout << "GPU tests on " << touchstone::cuda_device_name(0) << " (" << count << " visible)"
              << std::endl;
  } catch (const touchstone::InputError& e) {
    std::cout << "SKIPPED: the GPU tests need a CUDA device: " << e.what() << std::endl;
    return 77;
  }
  return RUN_ALL_TESTS();
}
