// The sample ledger's check report as text (for people) and JSON (for tools and the supervisor's
// recovery report).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/ledger/ledger_check.h"

namespace touchstone::ledger {

// Steps as compact ranges: {6, 7, 8, 11} -> "6..8, 11".
std::string step_ranges(const std::vector<int64_t>& steps);

// One line per attempt and per epoch, the recomputed work and restarts, then the verdict.
std::string format_check_report(const CheckReport& report);

nlohmann::json to_json(const CheckReport& report);

}  // namespace touchstone::ledger
