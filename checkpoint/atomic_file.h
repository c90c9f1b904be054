// Whole files that appear at once: written under a temporary name in the same directory, synced, and
// renamed into place (rename is atomic within one file system), then the directory is synced so the
// rename itself survives a crash.
#pragma once

#include <filesystem>
#include <string_view>

namespace touchstone {

// Throws std::runtime_error naming the file when any step fails; no temporary file is left behind.
void write_file_atomically(const std::filesystem::path& path, std::string_view content);

// fsync of a directory: makes the creation, rename or removal of its entries durable.
void sync_directory(const std::filesystem::path& directory);

}  // namespace touchstone
