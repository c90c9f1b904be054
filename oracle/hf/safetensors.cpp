// safetensors reading (the whole file is read, the header validated entry by entry, then decoded) and
// streaming writing (the header from the shapes, then one tensor at a time).
#include "oracle/hf/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <vector>

#include "common/errors.h"
#include "common/text_output.h"

namespace touchstone::hf {

static_assert(std::endian::native == std::endian::little,
              "the tensor bytes are decoded in place (little endian)");

namespace {

struct DtypeInfo {
  const char* name;  // the name in recorded.h
  int64_t size;      // bytes per element
};

const std::map<std::string, DtypeInfo> kDtypes = {
    {"F64", {"float64", 8}}, {"F32", {"float32", 4}}, {"BF16", {"bfloat16", 2}},
    {"F16", {"float16", 2}}, {"I64", {"int64", 8}},   {"I32", {"int32", 4}},
    {"I16", {"int16", 2}},   {"I8", {"int8", 1}},     {"U8", {"uint8", 1}},
};

template <typename T>
T load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

double decode(const std::string& dtype, const unsigned char* p) {
  if (dtype == "F64") return load<double>(p);
  if (dtype == "F32") return static_cast<double>(load<float>(p));
  if (dtype == "BF16") return bfloat16_value(load<uint16_t>(p));
  if (dtype == "F16") return float16_value(load<uint16_t>(p));
  if (dtype == "I64") return static_cast<double>(load<int64_t>(p));
  if (dtype == "I32") return static_cast<double>(load<int32_t>(p));
  if (dtype == "I16") return static_cast<double>(load<int16_t>(p));
  if (dtype == "I8") return static_cast<double>(load<int8_t>(p));
  return static_cast<double>(*p);
}

}  // namespace

double bfloat16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  return static_cast<double>(std::bit_cast<float>(wide));
}

double float16_value(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

std::map<std::string, Recorded> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
  if (bytes.size() < 8) {
    throw InputError(path + ": not a safetensors file (shorter than its 8-byte header length)");
  }
  const uint64_t header_size = load<uint64_t>(bytes.data());
  if (header_size > bytes.size() - 8) {
    throw InputError(path + ": safetensors header length " + std::to_string(header_size) +
                     " exceeds the file (" + std::to_string(bytes.size()) +
                     " bytes): truncated or not a safetensors file");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8,
                                   bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const nlohmann::json::exception&) {
    throw InputError(path + ": the safetensors header is not valid JSON");
  }
  if (!header.is_object()) throw InputError(path + ": the safetensors header is not a JSON object");
  const unsigned char* data = bytes.data() + 8 + header_size;
  const uint64_t data_size = bytes.size() - 8 - header_size;
  std::map<std::string, Recorded> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      throw InputError(where + ": header entry needs dtype, shape and data_offsets [begin, end]");
    }
    const std::string dtype = entry["dtype"].get<std::string>();
    if (!kDtypes.count(dtype)) throw InputError(where + ": unsupported dtype " + dtype);
    std::vector<int64_t> shape;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw InputError(where + ": shape entries must be integers >= 0");
      shape.push_back(d.get<int64_t>());
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      throw InputError(where + ": data_offsets must be integers >= 0");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    const int64_t numel = checked_numel(shape, where);
    const DtypeInfo info = kDtypes.at(dtype);
    if (end < begin || end > data_size) {
      throw InputError(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] lie outside the data (" + std::to_string(data_size) + " bytes): truncated file?");
    }
    if (numel > std::numeric_limits<int64_t>::max() / info.size ||
        end - begin != static_cast<uint64_t>(numel * info.size)) {
      throw InputError(where + ": data_offsets span " + std::to_string(end - begin) + " bytes, shape " +
                       shape_text(shape) + " of " + dtype + " needs " + std::to_string(numel * info.size));
    }
    Recorded tensor{shape, std::vector<double>(static_cast<size_t>(numel)), info.name};
    for (int64_t i = 0; i < numel; ++i) {
      tensor.values[static_cast<size_t>(i)] =
          decode(dtype, data + begin + static_cast<uint64_t>(i * info.size));
    }
    tensors.emplace(name, std::move(tensor));
  }
  return tensors;
}

namespace {

int64_t element_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  throw std::invalid_argument("safetensors writer: dtype " + dtype + " is not F64 or F32");
}

uint64_t entry_bytes(const SafetensorsEntry& entry) {
  return static_cast<uint64_t>(checked_numel(entry.shape, entry.name) * element_size(entry.dtype));
}

}  // namespace

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  uint64_t offset = 0;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name == "__metadata__" || header.contains(entry.name)) {
      throw std::invalid_argument("safetensors writer: tensor name " + entry.name + " given twice");
    }
    const uint64_t end = offset + entry_bytes(entry);
    header[entry.name] = {{"dtype", entry.dtype}, {"shape", entry.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), entries_(std::move(entries)), temporary_(temporary_path_for(path_)) {
  const std::string header = safetensors_header(entries_, metadata);
  fd_ = ::open(temporary_.path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create " + temporary_.path());
  const uint64_t length = header.size();
  bytes_ = 8 + length;
  for (const SafetensorsEntry& entry : entries_) bytes_ += entry_bytes(entry);
  write_bytes(&length, sizeof length);
  write_bytes(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.path().c_str());
}

void SafetensorsWriter::fail(const std::string& what) {
  const std::string reason = std::strerror(errno);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.path().c_str());
  throw InputError(path_ + ": cannot " + what + " (" + reason + ")");
}

void SafetensorsWriter::write_bytes(const void* data, size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd_, bytes + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write " + temporary_.path());
    written += static_cast<size_t>(n);
  }
}

void SafetensorsWriter::write(std::span<const double> values) {
  if (next_ >= entries_.size()) throw std::invalid_argument(path_ + ": every tensor is already written");
  const SafetensorsEntry& entry = entries_[next_];
  if (static_cast<int64_t>(values.size()) != checked_numel(entry.shape, entry.name)) {
    throw std::invalid_argument(path_ + ": tensor " + entry.name + " needs " +
                                std::to_string(checked_numel(entry.shape, entry.name)) + " values, " +
                                std::to_string(values.size()) + " given");
  }
  if (fd_ < 0) throw std::invalid_argument(path_ + ": the writer has failed or is committed");
  if (entry.dtype == "F64") {
    write_bytes(values.data(), values.size_bytes());
  } else {
    std::vector<float> chunk(std::min<size_t>(values.size(), size_t{1} << 16));
    for (size_t first = 0; first < values.size(); first += chunk.size()) {
      const size_t count = std::min(chunk.size(), values.size() - first);
      for (size_t i = 0; i < count; ++i) chunk[i] = static_cast<float>(values[first + i]);
      write_bytes(chunk.data(), count * sizeof(float));
    }
  }
  ++next_;
}

void SafetensorsWriter::commit() {
  if (next_ != entries_.size()) {
    throw std::invalid_argument(path_ + ": " + std::to_string(entries_.size() - next_) +
                                " tensors not written before commit");
  }
  if (fd_ < 0) throw std::invalid_argument(path_ + ": the writer has failed or is committed");
  // Without the sync a crash just after the rename could leave an empty file under the final name.
  if (::fsync(fd_) != 0) fail("sync " + temporary_.path());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close " + temporary_.path());
  try {
    check_replaceable(path_);
  } catch (const InputError&) {
    ::unlink(temporary_.path().c_str());
    throw;
  }
  if (std::rename(temporary_.path().c_str(), path_.c_str()) != 0) {
    fail("rename " + temporary_.path() + " into place");
  }
  committed_ = true;
  sync_directory(std::filesystem::absolute(path_).parent_path().string());
}

}  // namespace touchstone::hf
