// Read access to the golden file a candidate is diffed against: its config and parameter table,
// its recorded datasets in the in-memory form of recorded.h, and the batch of a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/h5_file.h"
#include "model/param_table.h"
#include "oracle/global_batch.h"
#include "oracle/golden/recorded.h"

namespace touchstone {

class GoldenReader {
 public:
  // Checks the format attributes and reads the stored config; throws InputError when the file is not a
  // golden file of format_version 1.
  explicit GoldenReader(const std::string& path);

  const std::string& path() const { return reader_.path(); }
  const h5::H5Reader& reader() const { return reader_; }
  // The run's config with the parallel section reset: tensors in the file are always full.
  const Config& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  Precision precision() const { return config_.precision; }
  const std::vector<int64_t>& steps() const { return steps_; }  // recorded steps, ascending

  bool has(const std::string& path) const { return reader_.exists("/" + path); }
  // Every dataset recorded for step `step` (loss, counts, token losses, gradients, parameters, ...),
  // as paths without the leading slash, in file order.
  std::vector<std::string> step_datasets(int64_t step) const;
  // A dataset (path without the leading slash). A non-finite golden value is bad input.
  Recorded read(const std::string& path) const;
  // The recorded batch of step `step` (1-based), rows in global sample order.
  GlobalBatch batch(int64_t step) const;
  // The group holding the parameters step `step` started from: /params/init or /steps/<step-1>/params.
  std::string params_before(int64_t step) const;
  // What the reader left out, for the diff's notes: a group under /steps whose name is not a step.
  const std::vector<std::string>& notes() const { return notes_; }
  // The shape of a dataset, checked before anything reads it: a parameter tensor (the last path
  // component names one) has the table's shape, and the declared bytes fit in the file (the golden
  // writer stores every dataset uncompressed). Throws InputError naming the file and the dataset.
  std::vector<int64_t> checked_shape(const std::string& object) const;

 private:
  h5::H5Reader reader_;
  Config config_;
  ParamTable table_;
  std::vector<int64_t> steps_;
  std::vector<std::string> notes_;
  uintmax_t file_bytes_ = 0;
};

}  // namespace touchstone
