// A directory of several output files published as one: a reader sees either the old set of files or
// the new one, never new files beside old ones, whatever kills the writer and when.
//
// Renaming one file over another is atomic; renaming two is not. An output made of two files that
// must agree (config.json and model.safetensors of `touchstone export hf`) is therefore written into
// a fresh directory next to the target, `.<name>.new.<pid>`, which is then put in the target's place
// in one system call: rename(2) when the target does not exist, renameat2(2) with RENAME_EXCHANGE when
// it does (the old directory lands at the fresh path and is removed). The files of the target that the
// writer does not replace (a tokenizer.json the user keeps beside the weights) are hard-linked into
// the fresh directory first, so they are in the published one too.
//
// The fresh directory is a registered temporary (common/signals.h, TemporaryKind::kDirectory): a
// SIGINT or SIGTERM before the exchange removes the new files, one after it removes the old ones. A
// target holding anything but regular files is refused up front: the signal handler can remove files
// only, and a subdirectory or link could not be carried over as it is.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/signals.h"

namespace touchstone {

// `dir` absolute and without a trailing separator: "out/" and "out" name the same directory, its
// parent_path() is the directory that holds it, and lstat of it does not follow a link named "link/".
std::filesystem::path directory_path(const std::string& dir);

// Throws InputError ("WHERE: why") when `target` exists and holds an entry that is not a regular file:
// publication could not carry it into the new directory.
void check_publishable_directory(const std::string& target, const std::string& where);

class DirectoryPublication {
 public:
  // Creates the fresh directory next to `target` (whose parent must exist; `target` itself may be
  // missing) and links every entry of an existing `target` into it except those named in `replaced`,
  // which the writer writes. Throws InputError naming the path on failure.
  DirectoryPublication(const std::string& target, const std::vector<std::string>& replaced);
  // Removes the fresh directory and its files when publish() was not reached or failed.
  ~DirectoryPublication();
  DirectoryPublication(const DirectoryPublication&) = delete;
  DirectoryPublication& operator=(const DirectoryPublication&) = delete;

  // Where the writer writes the file `name` (a plain file name) of the new set.
  std::string path_of(const std::string& name) const;

  // Syncs the fresh directory, puts it in the target's place in one step, removes the old directory
  // and syncs the parent. Throws InputError naming the target on failure (the target is then as it
  // was before).
  void publish();

 private:
  std::string target_;  // absolute, without a trailing separator
  std::string fresh_;   // `.<name>.new.<pid>` beside it
  std::optional<ScopedTemporary> registered_;
  bool published_ = false;
};

}  // namespace touchstone
