// Fuzzes the sample ledger (checkpoint/ledger/): read_ledger and read_faults on the same JSON Lines
// input, then what `touchstone ledger check` does with a ledger that reads: check_ledger, the
// effective history, and the text and JSON reports.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other than
// InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/ledger/ledger.h"
#include "checkpoint/ledger/ledger_check.h"
#include "checkpoint/ledger/ledger_report.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_ledger");
  const std::string& path = file.write(data, size);
  namespace ledger = touchstone::ledger;
  touchstone::fuzz::expect_input_errors_only([&] {
    const ledger::Ledger read = ledger::read_ledger(path);
    const ledger::CheckReport report = ledger::check_ledger(read);
    (void)ledger::format_check_report(report);
    (void)ledger::to_json(report).dump();
    std::string difference;
    (void)ledger::same_effective_history(read, read, &difference);
  });
  touchstone::fuzz::expect_input_errors_only([&] { (void)ledger::read_faults(path); });
  return 0;
}
