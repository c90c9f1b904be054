// The one translation unit that sees the version and the git commit (common/CMakeLists.txt), so that a
// new commit recompiles this file only.
#include "common/version.h"

namespace touchstone {

std::string generator_string() {
  return std::string("touchstone ") + TOUCHSTONE_VERSION + " (" + TOUCHSTONE_GIT_COMMIT + ")";
}

}  // namespace touchstone
