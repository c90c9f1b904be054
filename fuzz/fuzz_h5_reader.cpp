// Fuzzes h5::H5Reader (common/h5_file.h) and the raw-byte check behind its string attributes
// (common/h5_vlen_check.h) on any HDF5 file: opens the input, walks every group, reads every dataset's
// shape, element type and values and the attributes Touchstone's files carry.
// Finding: a crash, sanitizer report, leak, hang or out-of-memory, or an exception other than
// InputError (fuzz_input.h).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/h5_file.h"
#include "fuzz/fuzz_input.h"

namespace {

using touchstone::h5::H5Reader;

// The attributes golden files, checkpoints and candidates carry.
constexpr const char* kAttributes[] = {"format",    "format_version", "config",
                                       "generator", "fnv1a64",        "layout"};
// A damaged B-tree can describe a huge or cyclic-looking tree: the walk stops after this many objects.
constexpr int kMostObjects = 256;

void read_attributes(const H5Reader& reader, const std::string& object) {
  for (const char* name : kAttributes) {
    if (!reader.has_attribute(object, name)) continue;
    touchstone::fuzz::expect_input_errors_only([&] { (void)reader.string_attribute(object, name); });
    touchstone::fuzz::expect_input_errors_only([&] { (void)reader.int_attribute(object, name); });
  }
}

void read_dataset(const H5Reader& reader, const std::string& path) {
  (void)reader.shape(path);
  (void)reader.element_type(path);
  touchstone::fuzz::expect_input_errors_only([&] { (void)reader.read_f64(path); });
  touchstone::fuzz::expect_input_errors_only([&] { (void)reader.read_i64(path); });
  touchstone::fuzz::expect_input_errors_only([&] { (void)reader.read_i32(path); });
}

void walk(const H5Reader& reader) {
  std::vector<std::string> groups{"/"};
  int visited = 0;
  while (!groups.empty() && visited < kMostObjects) {
    const std::string group = groups.back();
    groups.pop_back();
    read_attributes(reader, group);
    for (const std::string& name : reader.children(group)) {
      if (++visited > kMostObjects) break;
      const std::string path = (group == "/" ? "" : group) + "/" + name;
      touchstone::fuzz::expect_input_errors_only([&] {
        if (!reader.exists(path)) return;
        if (reader.is_group(path)) {
          groups.push_back(path);
        } else {
          read_attributes(reader, path);
          read_dataset(reader, path);
        }
      });
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static touchstone::fuzz::InputFile file("fuzz_h5_reader");
  const std::string& path = file.write(data, size);
  touchstone::fuzz::expect_input_errors_only([&] {
    const H5Reader reader(path);
    walk(reader);
  });
  return 0;
}
