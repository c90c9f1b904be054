// The checkpoint directory: partial saves, atomic publication, the latest record, verification.
#include "checkpoint/checkpoint_store.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/errors.h"
#include "common/hash.h"
#include "common/signals.h"
#include "common/text_output.h"

namespace touchstone {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "state.h5";
constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest.json";
constexpr const char* kPartialPrefix = ".partial-";
constexpr const char* kStepPrefix = "step_";
// The latest record before the first checkpoint is committed.
constexpr const char* kNothingCommitted = "{\"directory\":null,\"step\":0}\n";

std::string file_checksum(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(1 << 20);
  uint64_t hash = kFnv1aBasis;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash = fnv1a64(buffer.data(), static_cast<size_t>(in.gcount()), hash);
  }
  return hex64(hash);
}

nlohmann::json read_json(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string() + ": " + what + " is missing");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    throw InputError(path.string() + ": " + what + " is not valid JSON");
  }
}

// The step of a "step_00000005" directory name, or -1.
int64_t step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.size() <= std::char_traits<char>::length(kStepPrefix))
    return -1;
  const std::string digits = name.substr(std::char_traits<char>::length(kStepPrefix));
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

// The manifest's structure, checked so that a damaged manifest is refused like any damaged file.
void check_manifest_fields(const nlohmann::json& manifest, const fs::path& path) {
  if (!manifest.is_object() || !manifest.contains("step") || !manifest["step"].is_number_integer() ||
      !manifest.contains("files") || !manifest["files"].is_object()) {
    throw InputError(path.string() + ": manifest lacks an integer \"step\" or the \"files\" object");
  }
  for (const auto& [name, entry] : manifest["files"].items()) {
    if (!entry.is_object() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned() ||
        !entry.contains("fnv1a64") || !entry["fnv1a64"].is_string() || name.empty() ||
        name.find('/') != std::string::npos || name == "." || name == "..") {
      throw InputError(path.string() + ": manifest entry \"" + name +
                       "\" is not a file name with \"bytes\" and \"fnv1a64\"");
    }
  }
}

void verify_manifest(const fs::path& directory, int64_t expected_step) {
  if (!fs::is_directory(directory))
    throw InputError(directory.string() + ": checkpoint directory is missing");
  const nlohmann::json manifest = read_json(directory / kManifest, "manifest (an incomplete checkpoint)");
  check_manifest_fields(manifest, directory / kManifest);
  if (manifest["step"].get<int64_t>() != expected_step) {
    throw InputError((directory / kManifest).string() + ": manifest is for step " +
                     std::to_string(manifest["step"].get<int64_t>()) + ", the directory for step " +
                     std::to_string(expected_step));
  }
  if (!manifest["files"].contains(kStateFile)) {
    throw InputError((directory / kManifest).string() + ": manifest does not list " + kStateFile);
  }
  for (const auto& [name, entry] : manifest["files"].items()) {
    const fs::path file = directory / name;
    if (!fs::is_regular_file(file)) throw InputError(file.string() + ": listed in the manifest but missing");
    const auto expected = entry.at("bytes").get<uintmax_t>();
    const uintmax_t actual = fs::file_size(file);
    if (actual < expected) {
      throw InputError(file.string() + ": truncated (" + std::to_string(actual) + " of " +
                       std::to_string(expected) + " bytes)");
    }
    if (actual != expected) {
      throw InputError(file.string() + ": " + std::to_string(actual) + " bytes, the manifest says " +
                       std::to_string(expected));
    }
  }
}

// From the raw bytes, before HDF5 opens the file: the library trusts what it parses, and damaged
// metadata can crash it (docs/checkpoints.md), so nothing of a file is parsed until it is known intact.
void verify_file_checksums(const fs::path& directory) {
  const nlohmann::json manifest = read_json(directory / kManifest, "manifest");
  check_manifest_fields(manifest, directory / kManifest);
  for (const auto& [name, entry] : manifest["files"].items()) {
    const std::string actual = file_checksum(directory / name);
    if (actual != entry.at("fnv1a64").get<std::string>()) {
      throw InputError((directory / name).string() + ": corrupted (file checksum " + actual + ", manifest " +
                       entry.at("fnv1a64").get<std::string>() + ")");
    }
  }
}

}  // namespace

uintmax_t directory_bytes(const fs::path& directory) {
  uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  return bytes;
}

void write_manifest(const fs::path& directory, int64_t step) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || name == kManifest) continue;
    files[name] = {{"bytes", fs::file_size(entry.path())}, {"fnv1a64", file_checksum(entry.path())}};
  }
  const nlohmann::json manifest = {
      {"format", "touchstone-checkpoint"}, {"format_version", 1}, {"step", step}, {"files", files}};
  write_text_file_atomically((directory / kManifest).string(), manifest.dump(2) + "\n");
}

TrainingState load_checkpoint_directory(const fs::path& directory, const Config& config) {
  const int64_t step = step_of(directory.filename().string());
  verify_manifest(directory, step);
  verify_file_checksums(directory);
  TrainingState state = read_checkpoint_file((directory / kStateFile).string(), config);
  if (state.step != step) {
    throw InputError((directory / kStateFile).string() + ": holds step " + std::to_string(state.step) +
                     ", the directory is for step " + std::to_string(step));
  }
  return state;
}

CheckpointStore::CheckpointStore(fs::path directory, int keep)
    : directory_(std::move(directory)), keep_(keep) {}

std::string CheckpointStore::step_directory_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return name;
}

fs::path CheckpointStore::begin_save(int64_t step) const {
  fs::create_directories(directory_);
  const fs::path partial = directory_ / (kPartialPrefix + step_directory_name(step));
  fs::remove_all(partial);
  // A signal during the save removes the partial directory (common/signals.h); a process killed
  // outright leaves it to the next run's remove_partial_saves().
  register_temporary(partial.string(), TemporaryKind::kDirectory);
  fs::create_directory(partial);
  return partial / kStateFile;
}

void CheckpointStore::abandon_save_of(const fs::path& state_file) {
  const fs::path partial = state_file.parent_path();
  if (partial.filename().string().rfind(kPartialPrefix, 0) != 0) return;
  std::error_code ignored;
  fs::remove_all(partial, ignored);
  unregister_temporary(partial.string());
}

fs::path CheckpointStore::commit_save(int64_t step) const {
  const fs::path partial = directory_ / (kPartialPrefix + step_directory_name(step));
  const fs::path final_directory = directory_ / step_directory_name(step);
  const fs::path latest = directory_ / kLatest;
  bool recorded_nothing_committed = false;
  try {
    write_manifest(partial, step);
    sync_directory(partial.string());
    if (!fs::exists(latest) && complete_steps().empty()) {
      // The first save publishes its directory before latest.json names it: a kill in between must
      // read as "nothing committed yet" (a fresh start), not as a latest record lost beside a checkpoint.
      write_text_file_atomically(latest.string(), kNothingCommitted);
      recorded_nothing_committed = true;
      sync_directory(directory_.string());
    }
    fs::remove_all(final_directory);  // a step saved again after a restart replaces the older save
    fs::rename(partial, final_directory);
    unregister_temporary(partial.string());
  } catch (const std::exception& e) {
    // The file system refused (a full disk): the save is reported like any output that cannot be
    // written, and leaves nothing behind.
    abandon_save_of(partial / kStateFile);
    std::error_code ignored;
    if (recorded_nothing_committed) fs::remove(latest, ignored);
    throw InputError(partial.string() + ": cannot publish the checkpoint (" + e.what() + ")");
  }
  sync_directory(directory_.string());
  const nlohmann::json record = {{"step", step}, {"directory", step_directory_name(step)}};
  write_text_file_atomically(latest.string(), record.dump() + "\n");
  prune();
  return final_directory;
}

void CheckpointStore::remove_partial_saves() const {
  if (!fs::is_directory(directory_)) return;
  const std::string latest_temporary = std::string(kLatest) + ".tmp.";  // a replacement that was killed
  for (const auto& entry : fs::directory_iterator(directory_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPartialPrefix, 0) == 0 || name.rfind(latest_temporary, 0) == 0)
      fs::remove_all(entry.path());
  }
}

std::vector<int64_t> CheckpointStore::complete_steps() const {
  std::vector<int64_t> steps;
  if (!fs::is_directory(directory_)) return steps;
  for (const auto& entry : fs::directory_iterator(directory_)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<int64_t> CheckpointStore::latest_step() const {
  const fs::path path = directory_ / kLatest;
  if (!fs::exists(path)) return std::nullopt;
  const nlohmann::json latest = read_json(path, "latest record");
  if (!latest.contains("step") || !latest["step"].is_number_integer()) {
    throw InputError(path.string() + ": latest record has no integer \"step\"");
  }
  return latest["step"].get<int64_t>();
}

void CheckpointStore::prune() const {
  if (keep_ <= 0) return;
  const std::vector<int64_t> steps = complete_steps();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < steps.size(); ++i) {
    fs::remove_all(directory_ / step_directory_name(steps[i]));
  }
  sync_directory(directory_.string());
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(const Config& config, bool fallback) const {
  const std::vector<int64_t> candidates = complete_steps();
  int64_t latest = -1;  // -1: no usable latest record
  try {
    latest = latest_step().value_or(-1);
  } catch (const InputError&) {
    if (!fallback) throw;
  }
  if (latest < 0 && candidates.empty()) return std::nullopt;
  // Nothing committed yet: a directory newer than the record is from a save that did not finish publishing.
  if (latest == 0) return std::nullopt;
  if (latest < 0 && !fallback) {
    throw InputError((directory_ / kLatest).string() +
                     ": missing while checkpoint directories exist (use the "
                     "fallback to load the newest complete one)");
  }
  // The latest record first, then older complete checkpoints, newest first. Never one newer than the
  // record: its save had not finished publishing.
  std::vector<int64_t> order;
  if (latest >= 0) order.push_back(latest);
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (latest < 0 || *it < latest) order.push_back(*it);
  }
  LoadedCheckpoint loaded;
  for (int64_t step : order) {
    const fs::path directory = directory_ / step_directory_name(step);
    try {
      loaded.state = load_checkpoint_directory(directory, config);
      loaded.directory = directory;
      return loaded;
    } catch (const InputError& e) {
      if (!fallback) throw;
      loaded.skipped.push_back(e.what());
    }
  }
  throw InputError(directory_.string() + ": no complete checkpoint could be loaded (" +
                   (loaded.skipped.empty() ? std::string("none found") : loaded.skipped.back()) + ")");
}

}  // namespace touchstone
