// H5Writer and H5Reader on the HDF5 C API: atomic commit of written files, typed reads with checked
// conversions, and one-line error messages that name the file and the object.
#include "common/h5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "common/errors.h"
#include "common/h5_vlen_check.h"
#include "common/h5_walk.h"
#include "common/signals.h"
#include "common/text_output.h"

namespace touchstone::h5 {
namespace {

// The header stores handles as int64_t so that it does not need to include hdf5.h.
static_assert(std::is_same_v<hid_t, int64_t>, "hid_t must be a 64-bit identifier (HDF5 >= 1.10)");

// Owns one HDF5 identifier; the close function depends on the kind of object.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Handle& operator=(Handle&&) = delete;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Runs before every use of the library.
//
// HDF5 prints its whole error stack to stderr by default; our exceptions carry the one line that matters.
//
// HDF5 1.10 frees a file whose H5Fclose fails (its closing flush fails: a full disk) but keeps the
// identifier, and the handler it registers with atexit closes every identifier left, that one again:
// a crash after the error was reported. Nothing is left open at exit (every identifier here is closed
// by its owner), so the handler has no work; H5dont_atexit must come before the library's first call.
void prepare_library() {
  static const bool exit_handler_off = H5dont_atexit() >= 0;
  (void)exit_handler_off;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// Collects the description of the innermost error (the first one the walk from it upwards meets).
herr_t innermost_error(unsigned position, const H5E_error2_t* error, void* out) {
  if (position == 0 && error->desc != nullptr) *static_cast<std::string*>(out) = error->desc;
  return 0;
}

// What HDF5 says went wrong in the call that just failed, on one line: the file system's message when
// the failure was a read or write of the file ("No space left on device"), else the library's own
// description of the innermost error ("bad object header version number"). Empty when it said nothing.
std::string hdf5_reason() {
  std::string text;
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &text) < 0) return "";
  const std::string system_marker = "error message = '";
  const size_t system = text.find(system_marker);
  if (system != std::string::npos) {
    const size_t from = system + system_marker.size();
    text = text.substr(from, text.find('\'', from) - from);
  }
  std::replace(text.begin(), text.end(), '\n', ' ');
  constexpr size_t kLongest = 160;
  if (text.size() > kLongest) text = text.substr(0, kLongest) + "...";
  return text;
}

// `message`, with HDF5's reason in parentheses when it gave one.
std::string with_reason(const std::string& message) {
  const std::string reason = hdf5_reason();
  return reason.empty() ? message : message + " (" + reason + ")";
}

// Closing the written file also closes any object still open in it, so that the file is complete on
// disk before commit() renames it.
Handle strong_close_fapl() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (fapl.valid()) H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  return fapl;
}

// H5Lexists fails rather than answering false when an intermediate group is missing, so every prefix
// of the path is checked in turn. Only '/' separates components: dots belong to names.
bool link_exists(hid_t file, const std::string& path) {
  if (path.empty()) return false;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    if (next > pos) {
      const std::string prefix = path.substr(0, next);
      if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    pos = next + 1;
  }
  return true;
}

// Dimensions as HDF5 wants them; a negative extent is a caller bug.
std::vector<hsize_t> to_dims(const std::vector<int64_t>& shape, const std::string& file,
                             const std::string& path) {
  std::vector<hsize_t> dims;
  dims.reserve(shape.size());
  for (int64_t d : shape) {
    if (d < 0) throw std::runtime_error(file + ": negative dimension in the shape of " + path);
    dims.push_back(static_cast<hsize_t>(d));
  }
  return dims;
}

size_t element_count(const std::vector<hsize_t>& dims) {
  size_t count = 1;
  for (hsize_t d : dims) count *= static_cast<size_t>(d);
  return count;
}

// Collects the link names of a group; exceptions must not cross the C library.
herr_t collect_name(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* op_data) {
  try {
    static_cast<std::vector<std::string>*>(op_data)->emplace_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// H5Writer

H5Writer::H5Writer(std::string final_path) : final_path_(std::move(final_path)) {
  prepare_library();
  // Same directory as the final file, so that the rename in commit() stays within one file system.
  temp_path_ = temporary_path_for(final_path_);
  register_temporary(temp_path_);  // before it exists, so that a signal at any point removes it
  Handle fapl = strong_close_fapl();
  errno = 0;
  file_ = H5Fcreate(temp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.valid() ? fapl.get() : H5P_DEFAULT);
  if (file_ < 0) {
    // errno is the file system's reason when the failure came from creating the file at all.
    const std::string reason = errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : std::string();
    unlink(temp_path_.c_str());  // in case the file was created before the failure
    unregister_temporary(temp_path_);
    throw InputError(final_path_ + ": cannot create the temporary file " + temp_path_ + reason);
  }
}

H5Writer::~H5Writer() {
  if (!committed_) discard();
}

// The way out of a write that failed. Closing flushes what HDF5 still holds, and on a full disk that
// flush fails like the write before it; a failed close in HDF5 1.10 leaves a freed file behind its
// identifier (see prepare_library). The temporary file is worthless by now, so it is first truncated:
// that gives its blocks back to the file system and the closing flush can succeed.
void H5Writer::discard() {
  if (file_ >= 0) {
    if (truncate(temp_path_.c_str(), 0) != 0) {
      // Nothing more to free; the close below may fail, and the file is removed either way.
    }
    H5Fclose(file_);
    file_ = -1;
  }
  unlink(temp_path_.c_str());
  unregister_temporary(temp_path_);
}

namespace {

// Every typed write goes through here, so the checks on state, path and shape live in one place.
void write_dataset(hid_t file, bool committed, const std::string& file_name, const std::string& path,
                   hid_t file_type, hid_t mem_type, const void* data, const std::vector<int64_t>& shape) {
  if (committed || file < 0) throw std::runtime_error(file_name + ": write to " + path + " after commit");
  if (path.empty() || path.front() != '/' || path.back() == '/') {
    throw std::runtime_error(file_name + ": dataset path '" + path + "' is not an absolute dataset name");
  }
  const std::vector<hsize_t> dims = to_dims(shape, file_name, path);
  const size_t count = element_count(dims);
  if (count > 0 && data == nullptr) throw std::runtime_error(file_name + ": no data given for " + path);
  if (link_exists(file, path)) throw std::runtime_error(file_name + ": " + path + " exists already");

  Handle space(dims.empty() ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!space.valid() || !lcpl.valid() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0) {
    throw std::runtime_error(file_name + ": cannot prepare dataset " + path);
  }
  Handle dataset(H5Dcreate2(file, path.c_str(), file_type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  if (!dataset.valid()) {
    throw std::runtime_error(file_name + ": cannot create dataset " + path + " (is a parent a dataset?)");
  }
  // A zero-element dataset has nothing to transfer, and HDF5 rejects a null buffer.
  if (count > 0 && H5Dwrite(dataset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    throw InputError(with_reason(file_name + ": cannot write dataset " + path));
  }
}

// Opens the object an attribute goes on and removes an older attribute of the same name.
Handle open_for_attribute(hid_t file, bool committed, const std::string& file_name,
                          const std::string& object_path, const std::string& name) {
  if (committed || file < 0) {
    throw std::runtime_error(file_name + ": attribute " + name + " set on " + object_path + " after commit");
  }
  if (object_path != "/" && !link_exists(file, object_path)) {
    throw std::runtime_error(file_name + ": no object " + object_path + " to put attribute " + name + " on");
  }
  Handle object(H5Oopen(file, object_path.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) throw std::runtime_error(file_name + ": cannot open " + object_path);
  const htri_t present = H5Aexists(object.get(), name.c_str());
  if (present < 0 || (present > 0 && H5Adelete(object.get(), name.c_str()) < 0)) {
    throw std::runtime_error(file_name + ": cannot replace attribute " + name + " on " + object_path);
  }
  return object;
}

void write_attribute(hid_t object, const std::string& file_name, const std::string& object_path,
                     const std::string& name, hid_t file_type, hid_t mem_type, const void* value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, value) < 0) {
    throw std::runtime_error(file_name + ": cannot write attribute " + name + " on " + object_path);
  }
}

}  // namespace

void H5Writer::write_f64(const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  write_dataset(file_, committed_, final_path_, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, data, shape);
}

void H5Writer::write_f32(const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  const std::vector<hsize_t> dims = to_dims(shape, final_path_, path);
  const size_t count = element_count(dims);
  // Rounded here rather than by HDF5's conversion, which clamps out-of-range values instead of
  // producing infinities as IEEE rounding does.
  std::vector<float> values(count);
  if (data != nullptr) {
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(data[i]);
  }
  write_dataset(file_, committed_, final_path_, path, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                data == nullptr ? nullptr : values.data(), shape);
}

void H5Writer::write_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  write_dataset(file_, committed_, final_path_, path, H5T_STD_I32LE, H5T_NATIVE_INT32, data, shape);
}

void H5Writer::write_i64(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape) {
  write_dataset(file_, committed_, final_path_, path, H5T_STD_I64LE, H5T_NATIVE_INT64, data, shape);
}

void H5Writer::write_scalar_f64(const std::string& path, double value) { write_f64(path, &value, {}); }

void H5Writer::write_scalar_i64(const std::string& path, int64_t value) { write_i64(path, &value, {}); }

void H5Writer::set_attribute(const std::string& object_path, const std::string& name,
                             const std::string& value) {
  Handle object = open_for_attribute(file_, committed_, final_path_, object_path, name);
  // Variable-length UTF-8 is what h5py itself writes for a str, and reads back as str (fixed-length
  // strings come back as numpy bytes). It also keeps long values such as the config JSON out of the
  // 64 KiB object header.
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
      H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0) {
    throw std::runtime_error(final_path_ + ": cannot build the string type for attribute " + name);
  }
  const char* text = value.c_str();
  write_attribute(object.get(), final_path_, object_path, name, type.get(), type.get(), &text);
}

void H5Writer::set_attribute(const std::string& object_path, const std::string& name, int64_t value) {
  Handle object = open_for_attribute(file_, committed_, final_path_, object_path, name);
  write_attribute(object.get(), final_path_, object_path, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void H5Writer::set_attribute(const std::string& object_path, const std::string& name, double value) {
  Handle object = open_for_attribute(file_, committed_, final_path_, object_path, name);
  write_attribute(object.get(), final_path_, object_path, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void H5Writer::commit() {
  if (committed_ || file_ < 0) throw std::runtime_error(final_path_ + ": commit called twice");
  // A flush that fails (a full disk) leaves the file to discard(): closing it would fail the same way.
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) {
    throw InputError(with_reason(final_path_ + ": cannot write " + temp_path_));
  }
  const hid_t file = file_;
  file_ = -1;
  if (H5Fclose(file) < 0) throw InputError(with_reason(final_path_ + ": cannot close " + temp_path_));
  // HDF5 does not sync to disk; without the fsync a crash after the rename could leave a final file
  // whose data never reached the disk.
  const int fd = open(temp_path_.c_str(), O_RDONLY);
  if (fd < 0 || fsync(fd) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) close(fd);
    throw InputError(final_path_ + ": cannot sync " + temp_path_ + " (" + reason + ")");
  }
  close(fd);
  // Checked again just before the rename: a FIFO or a device made at the path since the command checked
  // it must not be replaced either (text_output.h).
  check_replaceable(final_path_);
  if (std::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    throw InputError(final_path_ + ": cannot rename " + temp_path_ + " into place (" + std::strerror(errno) +
                     ")");
  }
  committed_ = true;
  unregister_temporary(temp_path_);
  // Makes the rename itself durable; the file is complete either way, so a failure here is not fatal.
  const size_t slash = final_path_.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : final_path_.substr(0, slash));
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
}

// ------------------------------------------------------------------------------------------------
// H5Reader

namespace {

struct OpenDataset {
  Handle dataset;
  Handle type;
  Handle space;
  size_t count;
};

// HDF5 1.10 converts numbers with the size and bit positions the file's type message declares, without
// checking them against each other: a damaged size or field makes the conversion read past the element
// (a crash). A numeric type is read only when it is 1, 2, 4 or 8 bytes and every field lies inside it.
bool numeric_layout_in_bounds(hid_t type) {
  const size_t bytes = H5Tget_size(type);
  const size_t precision = H5Tget_precision(type);
  const int offset = H5Tget_offset(type);
  if ((bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) || precision == 0 || offset < 0 ||
      precision + static_cast<size_t>(offset) > 8 * bytes) {
    return false;
  }
  if (H5Tget_class(type) != H5T_FLOAT) return true;
  size_t sign = 0, exponent = 0, exponent_bits = 0, mantissa = 0, mantissa_bits = 0;
  return H5Tget_fields(type, &sign, &exponent, &exponent_bits, &mantissa, &mantissa_bits) >= 0 &&
         sign < precision && exponent_bits > 0 && mantissa_bits > 0 &&
         exponent + exponent_bits <= precision && mantissa + mantissa_bits <= precision;
}

OpenDataset open_dataset(hid_t file, const std::string& file_name, const std::string& path) {
  if (!link_exists(file, path)) throw InputError(file_name + ": no dataset " + path);
  Handle dataset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) throw InputError(with_reason(file_name + ": " + path + " is not a dataset"));
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (!type.valid()) throw InputError(with_reason(file_name + ": cannot read the type of dataset " + path));
  const H5T_class_t type_class = H5Tget_class(type.get());
  if ((type_class == H5T_INTEGER || type_class == H5T_FLOAT) && !numeric_layout_in_bounds(type.get())) {
    throw InputError(file_name + ": dataset " + path + " has a damaged numeric type (size or bit fields)");
  }
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  if (!space.valid()) throw InputError(with_reason(file_name + ": cannot read the shape of dataset " + path));
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0) throw InputError(with_reason(file_name + ": cannot read the shape of dataset " + path));
  // Stored in the file and without a filter, the elements are bytes of the file, so a shape that claims
  // more is damage, refused here rather than met as an allocation of that size.
  Handle plist(H5Dget_create_plist(dataset.get()), H5Pclose);
  hsize_t file_bytes = 0;
  const size_t element_bytes = H5Tget_size(type.get());
  const bool bytes_in_file = plist.valid() && H5Pget_nfilters(plist.get()) == 0 &&
                             H5Pget_external_count(plist.get()) == 0 &&
                             H5Pget_layout(plist.get()) != H5D_VIRTUAL;
  if (bytes_in_file && H5Fget_filesize(file, &file_bytes) >= 0 && element_bytes > 0 &&
      static_cast<hsize_t>(count) > file_bytes / element_bytes) {
    throw InputError(file_name + ": dataset " + path + " claims " + std::to_string(count) +
                     " elements, more than the file holds");
  }
  return OpenDataset{std::move(dataset), std::move(type), std::move(space), static_cast<size_t>(count)};
}

// The object header address and the address sizes of the file, for check_vlen_attribute.
VlenCheck check_vlen(hid_t file, const std::string& file_name, const std::string& object_path,
                     const std::string& name) {
  const std::string failure = file_name + ": cannot locate attribute " + name + " on " + object_path;
  Handle plist(H5Fget_create_plist(file), H5Pclose);
  size_t address_bytes = 0, length_bytes = 0;
  hsize_t user_block = 0;
  if (!plist.valid() || H5Pget_sizes(plist.get(), &address_bytes, &length_bytes) < 0 ||
      H5Pget_userblock(plist.get(), &user_block) < 0) {
    throw InputError(with_reason(failure));
  }
  haddr_t header_address = HADDR_UNDEF;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  if (H5Oget_info_by_name3(file, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
      H5VLnative_token_to_addr(file, info.token, &header_address) < 0) {
    throw InputError(with_reason(failure));
  }
#else
  H5O_info_t info{};
  if (H5Oget_info_by_name2(file, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
    throw InputError(with_reason(failure));
  }
  header_address = info.addr;
#endif
  FileGeometry geometry;
  geometry.base = user_block;
  geometry.address_bytes = static_cast<unsigned>(address_bytes);
  geometry.length_bytes = static_cast<unsigned>(length_bytes);
  return check_vlen_attribute(file_name, geometry, header_address, name);
}

}  // namespace

H5Reader::H5Reader(std::string path, Walk walk) : path_(std::move(path)) {
  prepare_library();
  if (walk == Walk::kFirstInChildProcess) walk_in_child_process(path_);
  // Default access properties: HDF5 refuses to open one file twice with different close degrees, and
  // other code in the process may open the same file on its own.
  file_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) {
    const std::string reason = hdf5_reason();
    throw InputError(path_ + ": cannot open as HDF5 (missing or not an HDF5 file" +
                     (reason.empty() ? "" : ": " + reason) + ")");
  }
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool H5Reader::exists(const std::string& path) const { return path == "/" || link_exists(file_, path); }

std::vector<int64_t> H5Reader::shape(const std::string& path) const {
  OpenDataset d = open_dataset(file_, path_, path);
  const int rank = H5Sget_simple_extent_ndims(d.space.get());
  if (rank < 0) throw InputError(path_ + ": cannot read the shape of dataset " + path);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(d.space.get(), dims.data(), nullptr) < 0) {
    throw InputError(path_ + ": cannot read the shape of dataset " + path);
  }
  std::vector<int64_t> result;
  result.reserve(dims.size());
  for (hsize_t dim : dims) result.push_back(static_cast<int64_t>(dim));
  return result;
}

bool H5Reader::is_group(const std::string& path) const {
  if (!exists(path)) return false;
  Handle group(H5Gopen2(file_, path.c_str(), H5P_DEFAULT), H5Gclose);
  return group.valid();
}

bool H5Reader::opens(const std::string& path) const {
  if (!exists(path)) return false;
  Handle object(H5Oopen(file_, path.c_str(), H5P_DEFAULT), H5Oclose);
  return object.valid();
}

std::vector<std::string> H5Reader::children(const std::string& group_path) const {
  if (!exists(group_path)) throw InputError(path_ + ": no group " + group_path);
  Handle group(H5Gopen2(file_, group_path.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.valid()) throw InputError(with_reason(path_ + ": " + group_path + " is not a group"));
  std::vector<std::string> names;
  if (H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_name, &names) < 0) {
    throw InputError(with_reason(path_ + ": cannot list group " + group_path));
  }
  // Byte order, whatever the index order the file happens to store.
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> H5Reader::datasets_below(const std::string& group_path) const {
  std::vector<std::string> datasets;
  if (!exists(group_path) || !is_group(group_path)) return datasets;
  std::unordered_set<uint64_t> walked{object_address(group_path)};
  const auto push_children = [&](std::vector<std::string>& stack, const std::string& group) {
    const std::vector<std::string> names = children(group);
    for (auto name = names.rbegin(); name != names.rend(); ++name) {
      stack.push_back((group == "/" ? "" : group) + "/" + *name);
    }
  };
  std::vector<std::string> pending;  // a stack, so that the order is depth first
  push_children(pending, group_path);
  while (!pending.empty()) {
    const std::string path = pending.back();
    pending.pop_back();
    if (!is_group(path)) {
      datasets.push_back(path.substr(1));
    } else if (walked.insert(object_address(path)).second) {
      push_children(pending, path);
    }
  }
  return datasets;
}

std::vector<double> H5Reader::read_f64(const std::string& path) const {
  OpenDataset d = open_dataset(file_, path_, path);
  const H5T_class_t type_class = H5Tget_class(d.type.get());
  if (type_class != H5T_FLOAT && type_class != H5T_INTEGER) {
    throw InputError(path_ + ": dataset " + path + " is not numeric");
  }
  std::vector<double> values(d.count);
  if (d.count > 0 &&
      H5Dread(d.dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw InputError(with_reason(path_ + ": cannot read dataset " + path));
  }
  return values;
}

std::vector<int64_t> H5Reader::read_i64(const std::string& path) const {
  OpenDataset d = open_dataset(file_, path_, path);
  if (H5Tget_class(d.type.get()) != H5T_INTEGER) {
    throw InputError(path_ + ": dataset " + path + " is not of an integer type");
  }
  std::vector<int64_t> values(d.count);
  if (d.count == 0) return values;
  // HDF5's conversion clamps values that do not fit, so the one type wider than int64 is read as is
  // and checked here.
  if (H5Tget_sign(d.type.get()) == H5T_SGN_NONE && H5Tget_size(d.type.get()) >= sizeof(uint64_t)) {
    std::vector<uint64_t> raw(d.count);
    if (H5Dread(d.dataset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0) {
      throw InputError(with_reason(path_ + ": cannot read dataset " + path));
    }
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw InputError(path_ + ": dataset " + path + " holds a value too large for int64");
      }
      values[i] = static_cast<int64_t>(raw[i]);
    }
    return values;
  }
  if (H5Dread(d.dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw InputError(with_reason(path_ + ": cannot read dataset " + path));
  }
  return values;
}

std::string H5Reader::element_type(const std::string& path) const {
  OpenDataset d = open_dataset(file_, path_, path);
  const std::string bits = std::to_string(8 * H5Tget_size(d.type.get()));
  switch (H5Tget_class(d.type.get())) {
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_INTEGER:
      return (H5Tget_sign(d.type.get()) == H5T_SGN_NONE ? "uint" : "int") + bits;
    default:
      return "other";
  }
}

std::vector<int32_t> H5Reader::read_i32(const std::string& path) const {
  const std::vector<int64_t> wide = read_i64(path);
  std::vector<int32_t> values(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<int32_t>::min() || wide[i] > std::numeric_limits<int32_t>::max()) {
      throw InputError(path_ + ": dataset " + path + " holds a value outside the int32 range");
    }
    values[i] = static_cast<int32_t>(wide[i]);
  }
  return values;
}

namespace {

// An attribute with exactly one value: scalar, or a one-element array as some writers produce.
Handle open_attribute(hid_t file, const std::string& file_name, const std::string& object_path,
                      const std::string& name) {
  if (object_path != "/" && !link_exists(file, object_path)) {
    throw InputError(file_name + ": no object " + object_path);
  }
  Handle object(H5Oopen(file, object_path.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) throw InputError(file_name + ": cannot open " + object_path);
  if (H5Aexists(object.get(), name.c_str()) <= 0) {
    throw InputError(file_name + ": no attribute " + name + " on " + object_path);
  }
  Handle attr(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle space(attr.valid() ? H5Aget_space(attr.get()) : -1, H5Sclose);
  if (!space.valid()) {
    throw InputError(with_reason(file_name + ": cannot read attribute " + name + " on " + object_path));
  }
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    throw InputError(file_name + ": attribute " + name + " on " + object_path + " is not a single value");
  }
  return attr;
}

}  // namespace

std::string H5Reader::string_attribute(const std::string& object_path, const std::string& name) const {
  Handle attr = open_attribute(file_, path_, object_path, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING) {
    throw InputError(path_ + ": attribute " + name + " on " + object_path + " is not a string");
  }
  const std::string read_error = path_ + ": cannot read attribute " + name + " on " + object_path;
  const htri_t variable = H5Tis_variable_str(type.get());
  if (variable < 0) throw InputError(read_error);
  if (variable > 0) {
    // HDF5 would follow the stored heap ID and length without checking them (h5_vlen_check.h).
    const VlenCheck check = check_vlen(file_, path_, object_path, name);
    if (check.outcome == VlenCheck::Outcome::kDamaged) {
      throw InputError(path_ + ": attribute " + name + " on " + object_path + " is damaged (" + check.reason +
                       ")");
    }
    Handle mem_type(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mem_type.valid() || H5Tset_size(mem_type.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(mem_type.get(), H5Tget_cset(type.get())) < 0) {
      throw InputError(read_error);
    }
    char* text = nullptr;
    if (H5Aread(attr.get(), mem_type.get(), &text) < 0) throw InputError(with_reason(read_error));
    std::string value = text == nullptr ? std::string() : std::string(text);
    H5free_memory(text);
    return value;
  }
  const size_t size = H5Tget_size(type.get());
  if (size == 0) throw InputError(read_error);
  std::string buffer(size, '\0');
  // Reading with the file's own type copies the bytes unchanged; the padding is interpreted below.
  if (H5Aread(attr.get(), type.get(), buffer.data()) < 0) throw InputError(read_error);
  if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) {
    const size_t end = buffer.find_last_not_of(' ');
    buffer.resize(end == std::string::npos ? 0 : end + 1);
  } else {
    const size_t end = buffer.find('\0');
    if (end != std::string::npos) buffer.resize(end);
  }
  return buffer;
}

bool H5Reader::has_attribute(const std::string& object_path, const std::string& name) const {
  if (!exists(object_path)) return false;
  Handle object(H5Oopen(file_, object_path.c_str(), H5P_DEFAULT), H5Oclose);
  return object.valid() && H5Aexists(object.get(), name.c_str()) > 0;
}

namespace {
herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}
}  // namespace

uint64_t H5Reader::object_address(const std::string& object_path) const {
  const std::string failure = path_ + ": cannot locate " + object_path;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  haddr_t address = HADDR_UNDEF;
  if (H5Oget_info_by_name3(file_, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
      H5VLnative_token_to_addr(file_, info.token, &address) < 0) {
    throw InputError(with_reason(failure));
  }
  return static_cast<uint64_t>(address);
#else
  H5O_info_t info{};
  if (H5Oget_info_by_name2(file_, object_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
    throw InputError(with_reason(failure));
  }
  return static_cast<uint64_t>(info.addr);
#endif
}

std::vector<std::string> H5Reader::attribute_names(const std::string& object_path) const {
  Handle object(H5Oopen(file_, object_path.c_str(), H5P_DEFAULT), H5Oclose);
  if (!object.valid()) throw InputError(with_reason(path_ + ": cannot open " + object_path));
  std::vector<std::string> names;
  hsize_t position = 0;
  if (H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_NATIVE, &position, collect_attribute_name, &names) <
      0) {
    throw InputError(with_reason(path_ + ": cannot list the attributes of " + object_path));
  }
  return names;
}

int64_t H5Reader::int_attribute(const std::string& object_path, const std::string& name) const {
  Handle attr = open_attribute(file_, path_, object_path, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER) {
    throw InputError(path_ + ": attribute " + name + " on " + object_path + " is not an integer");
  }
  const std::string read_error = path_ + ": cannot read attribute " + name + " on " + object_path;
  if (H5Tget_sign(type.get()) == H5T_SGN_NONE && H5Tget_size(type.get()) >= sizeof(uint64_t)) {
    uint64_t raw = 0;
    if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &raw) < 0) throw InputError(read_error);
    if (raw > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw InputError(path_ + ": attribute " + name + " on " + object_path + " is too large for int64");
    }
    return static_cast<int64_t>(raw);
  }
  int64_t value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &value) < 0) throw InputError(read_error);
  return value;
}

}  // namespace touchstone::h5
