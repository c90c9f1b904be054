// What host code outside kernels/cuda/ may ask of the CUDA runtime, without CUDA headers. Defined only
// when the CUDA backend is built (TOUCHSTONE_HAVE_CUDA).
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace touchstone {

// GPUs visible to this process; throws InputError naming the cause when there are none
// (require_cuda_device in kernels/backend.h; the command line puts the flag that needed one in front).
int cuda_device_count();
// The product name of GPU `device` ("NVIDIA H200").
std::string cuda_device_name(int device);
// The CUDA backend on GPU local_rank % cuda_device_count() (kernels/cuda/launch.h).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options, int local_rank);

}  // namespace touchstone
