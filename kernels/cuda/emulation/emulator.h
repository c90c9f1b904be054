// The grid runner of the CPU emulation (TOUCHSTONE_CUDA_EMULATION builds; cuda_runtime.h here).
#pragma once

#include <functional>

#include "kernels/cuda/launch.h"

namespace touchstone::cuda::emulation {

// Runs `thread` once per thread of every block of `launch`: blocks in order 0, 1, ...; within a block,
// launch.threads fibers on one OS thread, each run until it reaches __syncthreads() or ends, in thread
// order, round after round, so a barrier holds every thread of the block until all have reached it.
// threadIdx, blockIdx, blockDim and gridDim hold the running fiber's values.
void run_grid(const Launch& launch, const std::function<void()>& thread);

}  // namespace touchstone::cuda::emulation
