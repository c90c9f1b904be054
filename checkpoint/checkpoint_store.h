// A directory of checkpoints that never exposes a half-written one (docs/checkpoints.md):
//
//   DIR/step_00000005/state.h5         the checkpoint (checkpoint/checkpoint_file.h)
//   DIR/step_00000005/manifest.json    size and checksum of every file of the checkpoint
//   DIR/latest.json                    the "latest complete" record: {"step": 5, "directory":
//                                      "step_00000005"}; {"step": 0, "directory": null} before the first
//                                      checkpoint is committed
//   DIR/.partial-step_00000006/        a save in progress (or one that died): never read
//
// A save writes into the partial directory, writes the manifest, syncs, renames the directory to its
// final name (atomic), and only then replaces latest.json (atomic) and removes checkpoints beyond the
// newest `keep`. A crash at any point leaves the previous complete checkpoint as the latest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_file.h"

namespace touchstone {

struct LoadedCheckpoint {
  std::filesystem::path directory;
  TrainingState state;
  std::vector<std::string> skipped;  // newer checkpoints refused on the way (with fallback), and why
};

class CheckpointStore {
 public:
  // `keep`: how many complete checkpoints stay after a save (0 keeps all).
  CheckpointStore(std::filesystem::path directory, int keep);

  const std::filesystem::path& directory() const { return directory_; }
  static std::string step_directory_name(int64_t step);  // "step_00000005"

  // Saving, on the one rank that writes. begin_save() creates DIR if needed and returns the path of the
  // checkpoint file to write inside a fresh partial directory (replacing any partial one left by a
  // crash); commit_save() publishes it as described above and returns the final directory. When DIR holds
  // no checkpoint and no latest record yet, commit_save() writes the "nothing committed" record before
  // its rename.
  std::filesystem::path begin_save(int64_t step) const;
  std::filesystem::path commit_save(int64_t step) const;
  // Removes the partial directory holding `state_file` (a path begin_save() returned), after a save
  // failed; any other path is left alone. Never throws. A failed commit_save() calls it itself.
  static void abandon_save_of(const std::filesystem::path& state_file);
  // Removes partial directories and temporary latest records left by saves that died (none is in
  // progress when a run starts).
  void remove_partial_saves() const;

  // The steps of the complete (renamed) checkpoint directories, ascending; not verified.
  std::vector<int64_t> complete_steps() const;
  // The step latest.json names (0: nothing committed yet), if the record exists. Throws InputError when
  // it is unreadable.
  std::optional<int64_t> latest_step() const;

  // Loads the checkpoint latest.json names, verified (manifest, sizes, the file's checksum before HDF5
  // parses anything, then its content and compatibility with `config`). Without a latest record and without
  // any checkpoint directory, or with the "nothing committed" record: nullopt (a fresh start). A refused
  // checkpoint throws InputError naming what is wrong, unless `fallback`, in which case the next older
  // complete checkpoint is tried (each refusal recorded in `skipped`).
  std::optional<LoadedCheckpoint> load_latest(const Config& config, bool fallback) const;

 private:
  void prune() const;

  std::filesystem::path directory_;
  int keep_;
};

// Verifies the manifest and files of one checkpoint directory and reads its state for `config`.
// Throws InputError naming the directory, file, tensor or key at fault.
TrainingState load_checkpoint_directory(const std::filesystem::path& directory, const Config& config);

// The total size of the files directly in `directory` (a checkpoint's size).
uintmax_t directory_bytes(const std::filesystem::path& directory);

// Writes DIR/manifest.json describing the files in `directory` (used by saves; public so that tools
// and tests can describe a directory they assembled).
void write_manifest(const std::filesystem::path& directory, int64_t step);

}  // namespace touchstone
