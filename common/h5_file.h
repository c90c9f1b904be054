// Reading and writing HDF5 files: the one path used by golden files and checkpoints.
//
// H5Writer never leaves a partial file at the final path: it writes to a temporary file in the same
// directory and commit() renames it into place (rename is atomic within one file system), following the
// output-path policy of common/text_output.h: only a regular file or nothing is replaced. A writer
// destroyed without commit() removes its temporary file, also after a write failed (a full disk), and
// SIGINT or SIGTERM removes it too (common/signals.h).
//
// H5Reader reports every failure as an InputError naming the file and the object, with HDF5's reason.
// What HDF5 1.10 follows without checking its bounds, and crashes on when it is damaged, it checks from
// the raw bytes first: the heap entries of variable-length strings (h5_vlen_check.h). Files with a
// checksum of their own (checkpoints) are checked against it before they are opened here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::h5 {

// Dataset paths are absolute ("/steps/1/grads/output_layer.weight"); missing groups are created.
// A dataset name may contain dots: the parameter names of docs/contract.md are used verbatim.
// An empty shape writes a scalar dataset.
class H5Writer {
 public:
  explicit H5Writer(std::string final_path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  void write_f64(const std::string& path, const double* data, const std::vector<int64_t>& shape);
  // Stores float32 values (rounded to nearest from the doubles given).
  void write_f32(const std::string& path, const double* data, const std::vector<int64_t>& shape);
  void write_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);
  void write_i64(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape);
  void write_scalar_f64(const std::string& path, double value);
  void write_scalar_i64(const std::string& path, int64_t value);

  // Attributes on an existing group or dataset ("/" for the root).
  void set_attribute(const std::string& object_path, const std::string& name, const std::string& value);
  void set_attribute(const std::string& object_path, const std::string& name, int64_t value);
  void set_attribute(const std::string& object_path, const std::string& name, double value);

  // Flushes, closes, syncs and renames the temporary file to the final path. Any call after a
  // successful commit() throws. Writer failures throw std::runtime_error naming the file and object:
  // InputError (which the command line reports as one line, status 2) when the file system refused a
  // write (no space, a file size limit), with its reason.
  void commit();

  const std::string& final_path() const { return final_path_; }

 private:
  void discard();  // closes the uncommitted file however a write failed, and removes it

  std::string final_path_;
  std::string temp_path_;
  int64_t file_ = -1;  // hid_t
  bool committed_ = false;
};

// Read access. Every failure throws touchstone::InputError naming the file and the object.
class H5Reader {
 public:
  // kFirstInChildProcess reads the whole file once in a child process before opening it
  // (h5_walk.h), so that a file HDF5 cannot read safely is refused instead of crashing this process;
  // kNone is that walk's own reader.
  enum class Walk { kFirstInChildProcess, kNone };
  explicit H5Reader(std::string path, Walk walk = Walk::kFirstInChildProcess);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  bool exists(const std::string& path) const;
  std::vector<int64_t> shape(const std::string& path) const;
  bool is_group(const std::string& path) const;
  // Whether the object a path names can be opened (false for a dangling link or a damaged header).
  bool opens(const std::string& path) const;
  std::vector<std::string> children(const std::string& group_path) const;  // sorted names
  // Every dataset below a group ("/steps/1"), depth first in sorted order, as paths without the
  // leading "/" ("steps/1/grads/output_layer.weight"); none when the group does not exist. An object
  // reached again under another name (a group linked into itself) is walked once.
  std::vector<std::string> datasets_below(const std::string& group_path) const;
  // Numeric datasets of any integer or float type, converted.
  std::vector<double> read_f64(const std::string& path) const;
  std::vector<int32_t> read_i32(const std::string& path) const;
  std::vector<int64_t> read_i64(const std::string& path) const;
  // The stored element type, "float64", "float32", "float16", "int32", "uint8", ...: what a value was
  // rounded to before it was converted for reading (touchstone diff measures ULPs on it).
  std::string element_type(const std::string& path) const;
  std::string string_attribute(const std::string& object_path, const std::string& name) const;
  // Whether an attribute is there, for optional attributes (a missing object answers false).
  bool has_attribute(const std::string& object_path, const std::string& name) const;
  int64_t int_attribute(const std::string& object_path, const std::string& name) const;
  // The file address of an object's header: one object reached under two names has one address.
  uint64_t object_address(const std::string& object_path) const;
  // The names of the attributes of an object, in the file's order.
  std::vector<std::string> attribute_names(const std::string& object_path) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
};

}  // namespace touchstone::h5
