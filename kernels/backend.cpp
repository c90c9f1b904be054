// Shared definitions of the kernel interface.
#include "kernels/backend.h"

#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace touchstone {

double AttentionShape::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace touchstone
