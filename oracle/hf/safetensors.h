// The safetensors format: an 8-byte little-endian header length N, a JSON header of N bytes mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows
// the header; "__metadata__" holds strings), then the raw little-endian tensor bytes. A reader of whole
// files, and a writer that streams one tensor at a time into a temporary file renamed into place.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/signals.h"
#include "oracle/golden/recorded.h"

namespace touchstone::hf {

// Reads every tensor of one file. Supported dtypes: F64, F32, BF16, F16, I64, I32, I16, I8, U8.
// Throws InputError naming the file (and tensor) for a truncated file, a header that is not valid
// JSON or not the format's structure, an unknown dtype, or offsets that disagree with the shape.
std::map<std::string, Recorded> read_safetensors(const std::string& path);

// bf16 and IEEE half bit patterns -> their exact float values.
double bfloat16_value(uint16_t bits);
double float16_value(uint16_t bits);

// One tensor of a file to write: its name, dtype ("F64" or "F32") and shape.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// The header of a file holding `entries` in this order, their data contiguous in the same order from
// offset 0: {"__metadata__": metadata, name: {"dtype", "shape", "data_offsets"}, ...} as compact JSON in
// that key order, padded with trailing spaces to a multiple of 8 bytes (the 8-byte length not included).
// Throws std::invalid_argument for a dtype other than F64 and F32, or a name given twice.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata);

// Writes a safetensors file without holding its tensors: the header is written when the writer is made,
// then each tensor's values as they are given, in entry order, into `<path>.tmp.<pid>` (registered with
// common/signals.h), which commit() syncs and renames over `path`. A writer destroyed without commit
// removes its temporary file. Failures to write are InputErrors naming `path` and the reason.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next entry's values, row-major, converted to its dtype (F32: rounded to the nearest float).
  // Throws std::invalid_argument when every entry is written or the count is not the entry's.
  void write(std::span<const double> values);
  // After the last entry: syncs the file, checks that only a regular file or nothing is at the path
  // (common/text_output.h), renames the temporary over it and syncs the directory.
  void commit();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }  // the file's size once every entry is written

 private:
  void write_bytes(const void* data, size_t size);
  [[noreturn]] void fail(const std::string& what);

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  ScopedTemporary temporary_;
  int fd_ = -1;
  size_t next_ = 0;
  uint64_t bytes_ = 0;
  bool committed_ = false;
};

}  // namespace touchstone::hf
