// Shared definitions of the kernel interface.
#include "kernels/backend.h"

#include <cmath>

#include "common/errors.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/launch.h"
#endif

namespace touchstone {

double AttentionShape::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

void require_cuda_device(const std::string& option) {
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  try {
    cuda_device_count();
  } catch (const InputError& e) {
    throw InputError(option + ": " + e.what());
  }
#else
  throw InputError(
      option +
      ": this build has no CUDA backend (configure with -DTOUCHSTONE_CUDA=ON where nvcc, cuBLAS and "
      "NCCL are installed)");
#endif
}

void check_backend_available(const std::string& name) {
  if (name == "cpu") return;
  if (name != "cuda") throw InputError("--backend: unknown value \"" + name + "\" (cpu, cuda)");
  require_cuda_device("--backend cuda");
}

std::string backend_description(const std::string& name, int local_rank) {
  check_backend_available(name);
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  if (name == "cuda") {
    return "cuda (" + cuda_device_name(cuda::device_for_local_rank(local_rank, cuda_device_count())) + ")";
  }
#else
  (void)local_rank;
#endif
  return name;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options,
                                      int local_rank) {
  check_backend_available(name);
#if defined(TOUCHSTONE_HAVE_CUDA) || defined(TOUCHSTONE_CUDA_EMULATION)
  if (name == "cuda") return make_cuda_backend(options, local_rank);
#else
  (void)local_rank;
#endif
  return make_cpu_backend(options);
}

}  // namespace touchstone
