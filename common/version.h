// Which Touchstone wrote a file: the version and git commit recorded in golden files and checkpoints.
#pragma once

#include <string>

namespace touchstone {

// "touchstone 0.1.0 (b5578b160989)": the version and the commit the build was configured at.
std::string generator_string();

}  // namespace touchstone
