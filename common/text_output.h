// Writing text outputs that people and other programs read: checking an output path before any work,
// and replacing a file atomically (and durably) so that a reader never sees a half-written report.
// (SVG and HTML are written with common/markup.h.)
#pragma once

#include <string>

namespace touchstone {

// Throws InputError ("OPTION PATH: ...") when `path` is a directory or its directory does not exist,
// so that a command refuses a bad output path before it starts working.
void check_output_path(const std::string& path, const std::string& option);

// Writes `text` to `<path>.tmp.<pid>` in the same directory, syncs it, renames it over `path` (rename
// is atomic within one file system) and syncs the directory so that the rename survives a crash. On
// failure the temporary file is removed and std::runtime_error names the path.
void write_text_file_atomically(const std::string& path, const std::string& text);

// fsync of a directory: makes the creation, rename or removal of its entries durable. Throws
// std::runtime_error naming the directory.
void sync_directory(const std::string& directory);

}  // namespace touchstone
