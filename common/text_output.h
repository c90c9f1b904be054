// The one output-path policy of every command (docs/config.md#outputs), and atomic text outputs.
//
// A command checks every output path it was given before it starts working (check_output_path), and
// every writer (text here, SVG and HTML through write_text_file_atomically, HDF5 in h5_file.cpp) writes
// a temporary file next to the output and renames it into place only after checking the path again
// (check_replaceable): only a regular file, or nothing, is ever replaced. A device, a FIFO, a socket, a
// directory or a symbolic link at the path is refused with an InputError naming it, so that
// `--out /dev/null` never replaces /dev/null with a file and a link is never silently replaced by a
// file. Failures to write (a full disk, an I/O error, a read-only directory) are InputErrors too: one
// line naming the file, exit status 2. Temporaries are registered with common/signals.h, so that
// SIGINT and SIGTERM remove them.
#pragma once

#include <string>

namespace touchstone {

// Throws InputError ("OPTION PATH: why") when `path` cannot be an output: it is empty, its directory
// does not exist or cannot be written in, or something other than a regular file is there.
void check_output_path(const std::string& path, const std::string& option);

// Throws InputError ("OPTION PATH: why") when `path` cannot be an output directory: it is empty,
// something other than a directory is there, or it is missing and its nearest existing ancestor is not
// a directory that can be written in (where the command will create it).
void check_output_directory(const std::string& path, const std::string& option);

// Throws InputError ("PATH: why") when something other than a regular file is at `path` (lstat: a
// symbolic link is refused, not followed). Writers call it right before renaming a temporary file
// over `path`, so that a FIFO or a device created after check_output_path is not replaced either.
void check_replaceable(const std::string& path);

// Writes `text` to `<path>.tmp.<pid>` in the same directory, syncs it, renames it over `path` (rename
// is atomic within one file system) and syncs the directory so that the rename survives a crash. On
// failure the temporary file is removed and an InputError names the path and the reason.
void write_text_file_atomically(const std::string& path, const std::string& text);

// `<path>.tmp.<pid>`: the temporary file a writer of `path` fills before renaming it into place. In
// the same directory, so that the rename stays within one file system; the pid keeps two processes
// writing the same path apart.
std::string temporary_path_for(const std::string& path);

// fsync of a directory: makes the creation, rename or removal of its entries durable. Throws
// std::runtime_error naming the directory.
void sync_directory(const std::string& directory);

}  // namespace touchstone
