// `touchstone commbench`: the size sweep, timing, the nccl-tests table and the JSON record.
#include "tools/commbench/commbench.h"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/text_output.h"
#include "parallel/comm/comm_backend.h"
#include "parallel/comm/grid.h"
#include "parallel/comm/mpi_runtime.h"
#include "tools/cli/flag_values.h"
#include "tools/commbench/commbench_ops.h"

namespace touchstone {
namespace {

using commbench::OpInfo;

struct Measurement {
  bool measured = false;  // false where the interface has no such form ("N/A")
  bool checked = false;   // false with -c 0: #wrong is "N/A"
  double time_us = 0.0;
  double algbw = 0.0;  // GB/s
  double busbw = 0.0;
  int64_t wrong = 0;
};

struct Row {
  const OpInfo* info = nullptr;
  int64_t size = 0;
  int64_t count = 0;
  int root = -1;
  Measurement out_of_place, in_place;
};

std::vector<const OpInfo*> selected_ops(const std::string& name) {
  std::vector<const OpInfo*> ops;
  if (name == "all") {
    for (const OpInfo& info : commbench::all_ops()) ops.push_back(&info);
  } else if (const OpInfo* info = commbench::find_op(name)) {
    ops.push_back(info);
  } else {
    throw InputError(
        "--op " + name +
        ": expected all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv or all");
  }
  return ops;
}

GridLayout validate(const CommbenchOptions& options, int world_size) {
  if (options.min_bytes < 8) throw InputError("-b/--min-bytes must be at least 8 (one double)");
  if (options.min_bytes > options.max_bytes) {
    throw InputError("-b/--min-bytes " + std::to_string(options.min_bytes) +
                     " is larger than -e/--max-bytes " + std::to_string(options.max_bytes));
  }
  // MPI counts are int: one rank's buffer of doubles must fit one.
  const int64_t largest = static_cast<int64_t>(std::numeric_limits<int>::max()) * 8;
  if (options.max_bytes > largest) throw InputError("-e/--max-bytes is above " + std::to_string(largest));
  if (options.step_factor < 2) throw InputError("-f/--step-factor must be at least 2");
  if (options.iters < 1) throw InputError("-n/--iters must be at least 1");
  if (options.warmup_iters < 0) throw InputError("-w/--warmup-iters must not be negative");
  if (options.check != 0 && options.check != 1) throw InputError("-c/--check must be 0 or 1");
  if (options.tp < 1 || options.pp < 1 || world_size % (options.tp * options.pp) != 0) {
    throw InputError("--tp " + std::to_string(options.tp) + " x --pp " + std::to_string(options.pp) +
                     " does not divide the " + std::to_string(world_size) + " ranks");
  }
  if (options.group != "world" && options.group != "tp" && options.group != "dp" && options.group != "pp") {
    throw InputError("--group " + options.group + ": expected world, tp, dp or pp");
  }
  bool has_reduction = false;
  for (const OpInfo* info : selected_ops(options.op)) has_reduction = has_reduction || info->reduction;
  if (options.inject_fault && (!has_reduction || options.check == 0)) {
    throw InputError("--inject-fault needs a reduction (--op all_reduce, reduce_scatter or all) and -c 1");
  }
  if (!options.json_path.empty()) check_output_path(options.json_path, "--json");
  GridLayout layout{options.tp, world_size / (options.tp * options.pp), options.pp};
  const int group_size = options.group == "world" ? world_size
                         : options.group == "tp"  ? layout.tp
                         : options.group == "dp"  ? layout.dp
                                                  : layout.pp;
  if (options.root < 0 || options.root >= group_size) {
    throw InputError("--root " + std::to_string(options.root) + " is not a rank of the " + options.group +
                     " group of " + std::to_string(group_size));
  }
  return layout;
}

// Timed on every rank; the reported time is the average over all ranks, as in nccl-tests. With
// --check 1 each iteration is set up, started together after a barrier, timed alone and checked;
// with --check 0 the iterations run back to back.
Measurement measure(const OpInfo& info, ProcessGroup& group, int64_t count, int root, bool in_place,
                    const CommbenchOptions& options, bool& fault_pending) {
  commbench::OpRunner runner(info, group, count, root, in_place);
  runner.init();
  for (int i = 0; i < options.warmup_iters; ++i) runner.run();
  double seconds = 0.0;
  int64_t wrong = 0;
  if (options.check == 1) {
    for (int i = 0; i < options.iters; ++i) {
      runner.init();
      if (fault_pending && info.reduction) {
        group.set_fault(FaultKind::kCorruptReduction);
        fault_pending = false;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      runner.run();
      seconds += MPI_Wtime() - start;
      wrong += runner.count_wrong();
    }
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < options.iters; ++i) runner.run();
    seconds = MPI_Wtime() - start;
  }
  // Bookkeeping over MPI directly, so it does not show in the measured group's counters.
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  double seconds_sum = 0.0;
  int64_t wrong_sum = 0;
  MPI_Allreduce(&seconds, &seconds_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&wrong, &wrong_sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);

  Measurement m;
  m.measured = true;
  m.checked = options.check == 1;
  const double time = seconds_sum / world_size / options.iters;
  m.time_us = time * 1e6;
  const double bytes = static_cast<double>(commbench::bytes_for_count(info, count, group.size()));
  m.algbw = time > 0.0 ? bytes / time / 1e9 : 0.0;
  m.busbw = m.algbw * commbench::bus_factor(info.op, group.size());
  m.wrong = wrong_sum;
  return m;
}

std::string format_measurement(const Measurement& m) {
  char text[96];
  if (!m.measured) {
    std::snprintf(text, sizeof(text), "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
  } else {
    // nccl-tests' time precision: fewer decimals for longer times.
    const char* time_format = m.time_us >= 10000.0 ? "  %7.0f" : m.time_us >= 100.0 ? "  %7.1f" : "  %7.2f";
    int length = std::snprintf(text, sizeof(text), time_format, m.time_us);
    const std::string wrong = m.checked ? std::to_string(m.wrong) : "N/A";
    std::snprintf(text + length, sizeof(text) - static_cast<size_t>(length), "  %6.2f  %6.2f  %6s", m.algbw,
                  m.busbw, wrong.c_str());
  }
  return text;
}

// The row layout: five fixed columns, then time, algbw, busbw, #wrong for out-of-place and in-place.
std::string fixed_columns(const char* size, const char* count, const char* type, const char* redop,
                          const char* root) {
  char text[96];
  std::snprintf(text, sizeof(text), "%12s  %12s  %8s  %6s  %6s", size, count, type, redop, root);
  return text;
}

std::string measured_columns(const char* time, const char* algbw, const char* busbw, const char* wrong) {
  char text[64];
  std::snprintf(text, sizeof(text), "  %7s  %6s  %6s  %6s", time, algbw, busbw, wrong);
  return text;
}

// A header line: '#' over the first column, trailing blanks dropped.
std::string header_line(std::string line) {
  line[0] = '#';
  line.erase(line.find_last_not_of(' ') + 1);
  return line + "\n";
}

// nccl-tests' header, so that readers (and scripts) of its output find the same columns.
void print_header(std::ostream& out, const OpInfo& info) {
  const std::string block(measured_columns("", "", "", "").size(), ' ');
  auto centered = [&block](const std::string& label) {
    std::string text = block;
    text.replace((block.size() - label.size()) / 2 + 1, label.size(), label);
    return text;
  };
  out << "#\n# " << info.name << "\n"
      << header_line(fixed_columns("", "", "", "", "") + centered("out-of-place") + centered("in-place"))
      << header_line(fixed_columns("size", "count", "type", "redop", "root") +
                     measured_columns("time", "algbw", "busbw", "#wrong") +
                     measured_columns("time", "algbw", "busbw", "#wrong"))
      << header_line(fixed_columns("(B)", "(elements)", "", "", "") +
                     measured_columns("(us)", "(GB/s)", "(GB/s)", "") +
                     measured_columns("(us)", "(GB/s)", "(GB/s)", ""));
}

void print_row(std::ostream& out, const Row& row) {
  char text[96];
  std::snprintf(text, sizeof(text), "%12lld  %12lld  %8s  %6s  %6d", static_cast<long long>(row.size),
                static_cast<long long>(row.count), "double", row.info->redop, row.root);
  out << text << format_measurement(row.out_of_place) << format_measurement(row.in_place) << std::endl;
}

nlohmann::json to_json(const Measurement& m) {
  if (!m.measured) return nullptr;
  return {{"time_us", m.time_us},
          {"algbw_gbs", m.algbw},
          {"busbw_gbs", m.busbw},
          {"wrong", m.checked ? nlohmann::json(m.wrong) : nlohmann::json(nullptr)}};
}

int run_checked(const CommbenchOptions& options, const GridLayout& layout, CommBackend comm,
                MpiRuntime& mpi) {
  const std::vector<const OpInfo*> ops = selected_ops(options.op);
  // NCCL groups refuse two ranks on one GPU; the user asked for them with --comm nccl.
  const auto create_grid = [&] { return Grid::create(layout, comm); };
  std::unique_ptr<Grid> grid =
      comm == CommBackend::kNccl ? naming_flag("--comm nccl", create_grid) : create_grid();
  ProcessGroup& group = grid->group(options.group);
  const int n = group.size();
  const bool printer = mpi.world_rank() == 0;
  if (printer) {
    std::cout << "# touchstone commbench: " << mpi.world_size() << " ranks, group " << options.group << " of "
              << n << " ranks (tp " << layout.tp << " dp " << layout.dp << " pp " << layout.pp << "), comm "
              << comm_backend_name(comm) << ", type double, -b " << options.min_bytes << " -e "
              << options.max_bytes << " -f " << options.step_factor << " -n " << options.iters << " -w "
              << options.warmup_iters << " -c " << options.check << "\n";
  }

  bool fault_pending = options.inject_fault;
  std::vector<Row> rows;
  for (const OpInfo* info : ops) {
    if (printer) print_header(std::cout, *info);
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.step_factor) {
      Row row;
      row.info = info;
      row.count = commbench::count_for_bytes(*info, bytes, n);
      row.size = commbench::bytes_for_count(*info, row.count, n);
      row.root = info->op == commbench::Op::kBroadcast ? options.root : -1;
      // Too small to give every rank one element: skipped (nccl-tests would print a zero-size row).
      if (row.count > 0) {
        if (info->out_of_place) {
          row.out_of_place = measure(*info, group, row.count, row.root, false, options, fault_pending);
        }
        if (info->in_place)
          row.in_place = measure(*info, group, row.count, row.root, true, options, fault_pending);
        if (printer) print_row(std::cout, row);
        rows.push_back(row);
      }
      if (bytes > options.max_bytes / options.step_factor) break;  // the next step would overflow
    }
  }

  int64_t wrong_total = 0;
  double busbw_sum = 0.0;
  int measured = 0;
  nlohmann::json results = nlohmann::json::array();
  for (const Row& row : rows) {
    for (const Measurement* m : {&row.out_of_place, &row.in_place}) {
      if (!m->measured) continue;
      wrong_total += m->wrong;
      busbw_sum += m->busbw;
      ++measured;
    }
    results.push_back({{"op", row.info->name},
                       {"size", row.size},
                       {"count", row.count},
                       {"type", "double"},
                       {"redop", row.info->redop},
                       {"root", row.root},
                       {"out_of_place", to_json(row.out_of_place)},
                       {"in_place", to_json(row.in_place)}});
  }
  const double avg_busbw = measured > 0 ? busbw_sum / measured : 0.0;
  if (printer) {
    std::cout << "#\n# #wrong total : "
              << (options.check == 0 ? "not checked (-c 0)"
                                     : std::to_string(wrong_total) + (wrong_total == 0 ? " OK" : " FAILED"))
              << "\n"
              << "# Avg bus bandwidth : " << avg_busbw << " GB/s\n#" << std::endl;
    if (!options.json_path.empty()) {
      const nlohmann::json record = {
          {"tool", "touchstone commbench"},
          {"world_size", mpi.world_size()},
          {"group", options.group},
          {"group_size", n},
          {"comm", comm_backend_name(comm)},
          {"layout", {{"tp", layout.tp}, {"dp", layout.dp}, {"pp", layout.pp}}},
          {"type", "double"},
          {"min_bytes", options.min_bytes},
          {"max_bytes", options.max_bytes},
          {"step_factor", options.step_factor},
          {"iters", options.iters},
          {"warmup_iters", options.warmup_iters},
          {"check", options.check},
          {"inject_fault", options.inject_fault},
          {"results", results},
          {"wrong_total", options.check == 1 ? nlohmann::json(wrong_total) : nlohmann::json(nullptr)},
          {"avg_busbw_gbs", avg_busbw}};
      write_text_file_atomically(options.json_path, record.dump(2) + "\n");
    }
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

void add_commbench_options(CLI::App* command, CommbenchOptions& options) {
  // Sizes accept nccl-tests' suffixes: 8, 64K, 1M, 1G (powers of 1024).
  command->add_option("-b,--min-bytes", options.min_bytes, "Smallest message size in bytes")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  command->add_option("-e,--max-bytes", options.max_bytes, "Largest message size in bytes")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  command->add_option("-f,--step-factor", options.step_factor, "Multiply the size by this each step")
      ->capture_default_str();
  command->add_option("-n,--iters", options.iters, "Timed iterations per size")->capture_default_str();
  command->add_option("-w,--warmup-iters", options.warmup_iters, "Untimed iterations first")
      ->capture_default_str();
  command->add_option("-c,--check", options.check, "Check every element after each timed op (0/1)")
      ->capture_default_str();
  command
      ->add_option("--op", options.op,
                   "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv or all")
      ->capture_default_str();
  command
      ->add_option("--group", options.group, "Group to measure: world, tp, dp or pp (all groups run at once)")
      ->capture_default_str();
  command->add_option("--tp", options.tp, "Tensor-parallel size of the grid --group is taken from")
      ->capture_default_str();
  command->add_option("--pp", options.pp, "Pipeline-parallel size of that grid (dp = ranks / (tp x pp))")
      ->capture_default_str();
  command->add_option("-r,--root", options.root, "Broadcast root (a rank of the group)")
      ->capture_default_str();
  add_output_option(command, "--json", options.json_path, "Also write every number to this JSON file");
  command
      ->add_option("--comm", options.comm,
                   "Backend of the groups: mpi, or nccl (CUDA builds, one GPU per rank; same bits)")
      ->capture_default_str();
  command->add_flag(
      "--inject-fault", options.inject_fault,
      "Test hook: corrupt the first checked reduction, which must show as #wrong > 0 and exit 1");
}

int run_commbench(const CommbenchOptions& options, MpiRuntime& mpi) {
  // Every rank sees the same options, but whether a GPU is usable can differ between ranks: the ranks
  // agree on the outcome, so that every rank stops before any transfer or none does.
  std::string error;
  GridLayout layout;
  CommBackend comm = CommBackend::kMpi;
  try {
    layout = validate(options, mpi.world_size());
    comm = parse_comm_backend(options.comm);
    naming_flag("--comm " + options.comm, [&] { check_comm_available(comm); });
  } catch (const InputError& e) {
    error = e.what();
  }
  if (mpi.sum_over_world(error.empty() ? 0 : 1) > 0) {
    if (mpi.world_rank() == 0) {
      std::cerr << "touchstone: error: " << (error.empty() ? "input rejected on another rank" : error)
                << std::endl;
    }
    return 2;
  }
  try {
    return run_checked(options, layout, comm, mpi);
  } catch (const InputError& e) {
    // Raised alike on every rank (two ranks of a group on one GPU, found by all of its ranks).
    if (mpi.world_rank() == 0) std::cerr << "touchstone: error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace touchstone
