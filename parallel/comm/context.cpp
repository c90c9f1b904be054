// The process's phase hook (parallel/comm/context.h).
#include "parallel/comm/context.h"

namespace touchstone {

namespace {
PhaseHook& installed_hook() {
  static PhaseHook hook = nullptr;
  return hook;
}
}  // namespace

void install_phase_hook(PhaseHook hook) { installed_hook() = hook; }
PhaseHook phase_hook() { return installed_hook(); }

}  // namespace touchstone
