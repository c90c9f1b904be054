// Writing text outputs that people and other programs read: checking an output path before any work,
// XML/SVG escaping and chart ticks, and replacing a file atomically (and durably) so that a reader never sees
// a half-written report.
#pragma once

#include <string>

namespace touchstone {

// Throws InputError ("OPTION PATH: ...") when `path` is a directory or its directory does not exist,
// so that a command refuses a bad output path before it starts working.
void check_output_path(const std::string& path, const std::string& option);

// `text` with & < > " ' replaced by their XML entities, for SVG text, titles and attribute values.
std::string xml_escape(const std::string& text);

// Writes `text` to `<path>.tmp.<pid>` in the same directory, syncs it, renames it over `path` (rename
// is atomic within one file system) and syncs the directory so that the rename survives a crash. On
// failure the temporary file is removed and std::runtime_error names the path.
void write_text_file_atomically(const std::string& path, const std::string& text);

// A round axis tick step (1, 2, 2.5 or 5 times a power of ten) giving about `intervals` intervals over
// `span`, for the SVG charts.
double round_tick_step(double span, int intervals);

// fsync of a directory: makes the creation, rename or removal of its entries durable. Throws
// std::runtime_error naming the directory.
void sync_directory(const std::string& directory);

}  // namespace touchstone
