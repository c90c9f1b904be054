// One checkpoint's content (format "touchstone-checkpoint", format_version 1; docs/checkpoints.md):
// everything a run needs to continue as if it had never stopped, stored as full tensors in the
// contract's layouts so that a checkpoint written at one parallel layout loads at any other.
//
// Every dataset carries an `fnv1a64` attribute: the checksum of its bytes as stored. A reader verifies
// the format, the compatibility of the run that wrote it with the run that loads it, every tensor's
// name and shape, and every checksum, and refuses anything else with a message naming what is wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/config.h"
#include "common/h5_file.h"
#include "model/param_table.h"

namespace touchstone {

// The training state after `step` updates, as full tensors.
struct TrainingState {
  int64_t step = 0;              // updates completed
  int64_t consumed_samples = 0;  // global samples consumed: the next sample index (step * B)
  double lr = 0.0;               // the learning rate of update `step` (0 before the first)
  ParamTensors params;           // master weights (the FP32 values in FP32 and BF16 runs)
  ParamTensors exp_avg;          // AdamW first moments
  ParamTensors exp_avg_sq;       // AdamW second moments
  // The data set's content fingerprint (data::content_fingerprint), the root attribute
  // data_fingerprint; empty when not recorded (a checkpoint written before the attribute existed).
  std::string data_fingerprint;
};

// Writes a checkpoint file in parts, so that a run can gather and write one group of tensors at a
// time; the file appears at `path` only on commit(). A write the file system refuses (a full disk)
// throws InputError naming the file.
class CheckpointFileWriter {
 public:
  // Writes the root attributes (format, the resolved config, the layout, the generator).
  CheckpointFileWriter(const std::string& path, const Config& config);
  // Without commit() (a save that failed), removes its temporary file and then the partial directory
  // that CheckpointStore::begin_save() made for it, so that a failed save leaves nothing behind.
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  // /state/* scalars, /rng/seed and, when state.data_fingerprint is set, the data_fingerprint attribute.
  void write_progress(const Config& config, const TrainingState& state);
  // `group` is "/params", "/optimizer/exp_avg" or "/optimizer/exp_avg_sq".
  void write_tensors(const std::string& group, const ParamTable& table, const ParamTensors& tensors);
  void commit();

 private:
  void checksum(const std::string& path, const void* data, size_t bytes);

  std::string path_;
  bool committed_ = false;
  std::optional<h5::H5Writer> writer_;  // reset before the partial directory is removed
};

// Reads and verifies the checkpoint file at `path` for a run with `config`. Throws InputError naming
// the file and the key, tensor or check that failed. HDF5 parses the file: one that may be damaged is
// checked against its manifest first (load_checkpoint_directory, checkpoint_store.h).
TrainingState read_checkpoint_file(const std::string& path, const Config& config);

// The config stored in a checkpoint file (its root attribute), for reports.
Config checkpoint_config(const std::string& path);

// Throws InputError unless a run with `current` may continue a checkpoint written with `saved`: the
// model, data, optimizer, seed, precision, batch size and loss normalization must be equal; the
// layout, micro-batch size (unless per_microbatch_mean) and number of steps may differ.
void check_resume_compatible(const Config& saved, const Config& current, const std::string& origin);

}  // namespace touchstone
