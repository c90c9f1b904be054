// Precision names as the config spells them.
#include "kernels/precision.h"

#include "common/errors.h"

namespace touchstone {

Precision parse_precision(const std::string& name) {
  if (name == "fp64") return Precision::kFp64;
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw InputError("precision: unknown value \"" + name + "\"");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp64:
      break;
  }
  return "fp64";
}

}  // namespace touchstone
