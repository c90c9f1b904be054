// `touchstone export hf --golden G.h5 --out DIR [--step S]`: the command line of the Hugging Face export
// (oracle/hf/export.h does the work). Runs without MPI. Exit status: 0 written, 2 bad input (nothing
// written).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>

namespace touchstone {

struct ExportHfOptions {
  std::string golden;
  std::string out;
  int64_t step = 0;  // 0: /params/init; s: the parameters after update s
};

void add_export_hf_options(CLI::App* command, ExportHfOptions& options);

int run_export_hf(const ExportHfOptions& options, std::ostream& out);

}  // namespace touchstone
