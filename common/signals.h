// One signal policy for every command: SIGINT and SIGTERM remove the temporary files and directories
// in flight (a golden file's `OUT.tmp.<pid>`, a checkpoint's partial directory) and end the process with
// status 128 + signal, so that an interrupted command leaves no partial output behind
// (docs/config.md#outputs). Every rank of an MPI job removes its own temporaries.
//
// Writers register a temporary path before they create it and unregister it once it is renamed into
// place or removed. The handler runs in signal context, so the paths are kept as C strings in a
// fixed-size table and the handler only unlinks, removes directory entries and calls _exit.
#pragma once

#include <string>

namespace touchstone {

// Installs the SIGINT and SIGTERM handler (not for a signal ignored at startup); called once, at the
// start of main(). A command that must handle these signals itself (the supervisor forwards them to
// its job) installs its own handler over this one for as long as it needs it.
void install_signal_cleanup();

enum class TemporaryKind {
  kFile,
  // A directory holding files only (a partial checkpoint): its entries are removed, then the directory.
  kDirectory,
};

// Adds `path` to the table of temporaries a signal removes. Throws std::runtime_error when the table is
// full or the path is longer than PATH_MAX (a bug: temporaries are few and short-lived).
void register_temporary(const std::string& path, TemporaryKind kind = TemporaryKind::kFile);
// Removes `path` from the table (after its rename or its removal); a path not in it is ignored.
void unregister_temporary(const std::string& path);

// Registers a temporary file for the lifetime of this object.
class ScopedTemporary {
 public:
  explicit ScopedTemporary(std::string path, TemporaryKind kind = TemporaryKind::kFile);
  ~ScopedTemporary() { unregister_temporary(path_); }
  ScopedTemporary(const ScopedTemporary&) = delete;
  ScopedTemporary& operator=(const ScopedTemporary&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace touchstone
