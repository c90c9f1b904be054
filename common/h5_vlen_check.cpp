// The raw-byte check of an attribute's variable-length values (common/h5_vlen_check.h). The layouts are
// those of the HDF5 file format specification, version 3.0: object header prefixes of versions 1 and 2
// (and version-2 continuation chunks), attribute messages of versions 1 to 3, datatype and dataspace
// messages, and global heap collections, which are parsed the way HDF5 1.10 parses them.
#include "common/h5_vlen_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace touchstone::h5 {
namespace {

// The first inconsistency found; caught by check_vlen_attribute and turned into its reason.
struct Damage {
  std::string reason;
};

// Message types and the datatype class of the file format.
constexpr unsigned kContinuationMessage = 0x10;
constexpr unsigned kAttributeMessage = 0x0C;
constexpr unsigned kVariableLengthClass = 9;
constexpr uint64_t kMinimumCollectionSize = 4096;  // H5HG_MINSIZE: no collection is smaller
constexpr size_t kMaximumChunks = 65536;           // far above any real header; ends a cycle of them

// The file's bytes; every read is checked against the file's size before anything is allocated.
class RawFile {
 public:
  explicit RawFile(const std::string& path) : fd_(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    struct stat status {};
    if (fd_ >= 0 && fstat(fd_, &status) != 0) {
      close(fd_);
      fd_ = -1;
    }
    if (fd_ < 0) throw Damage{"cannot read the file's bytes"};
    size_ = static_cast<uint64_t>(status.st_size);
  }
  ~RawFile() { close(fd_); }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  uint64_t size() const { return size_; }

  std::vector<uint8_t> read(uint64_t offset, uint64_t count, const std::string& what) const {
    if (offset > size_ || count > size_ - offset) throw Damage{what + " lies beyond the end of the file"};
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t got =
          pread(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
      if (got <= 0) throw Damage{"cannot read " + what};
      done += static_cast<size_t>(got);
    }
    return bytes;
  }

 private:
  int fd_;
  uint64_t size_ = 0;
};

// Little-endian fields read in order from a byte range, each one checked against its end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, std::string what)
      : data_(data), size_(size), what_(std::move(what)) {}

  size_t remaining() const { return size_ - position_; }

  const uint8_t* skip(uint64_t count) {
    if (count > remaining()) throw Damage{what_ + " is cut short"};
    const uint8_t* at = data_ + position_;
    position_ += static_cast<size_t>(count);
    return at;
  }

  uint64_t take(unsigned bytes) {
    const uint8_t* at = skip(bytes);
    uint64_t value = 0;
    for (unsigned i = bytes; i-- > 0;) value = (value << 8) | at[i];
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
  std::string what_;
};

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

uint64_t align8(uint64_t size) { return (size + 7) / 8 * 8; }

struct AttributeMessage {
  unsigned flags = 0;  // of the message: bit 1 marks a message kept in the shared-message table
  std::vector<uint8_t> data;
};

// A region of an object header that holds messages.
struct Chunk {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The attribute messages of the object header at `header_address`, following continuation chunks.
std::vector<AttributeMessage> attribute_messages(const RawFile& file, const FileGeometry& geometry,
                                                 uint64_t header_address) {
  const uint64_t start = geometry.base + header_address;
  const std::string header = "the object header at " + hex(header_address);
  const uint64_t prefix_bytes = std::min<uint64_t>(40, file.size() > start ? file.size() - start : 0);
  const std::vector<uint8_t> prefix = file.read(start, prefix_bytes, header);
  Cursor cursor(prefix.data(), prefix.size(), header);
  bool version2 = false;
  unsigned header_flags = 0;
  std::vector<Chunk> pending;
  if (prefix.size() >= 4 && std::memcmp(prefix.data(), "OHDR", 4) == 0) {
    cursor.skip(4);
    if (cursor.take(1) != 2) throw Damage{header + " has an unknown version"};
    version2 = true;
    header_flags = static_cast<unsigned>(cursor.take(1));
    if (header_flags & 0x20) cursor.skip(16);  // access, modification, change and birth times
    if (header_flags & 0x10) cursor.skip(4);   // attribute storage phase change values
    const uint64_t length = cursor.take(1u << (header_flags & 0x03));
    pending.push_back({start + (prefix.size() - cursor.remaining()), length});
  } else {
    if (cursor.take(1) != 1) throw Damage{header + " has an unknown version"};
    cursor.skip(7);  // reserved, message count, reference count
    const uint64_t length = cursor.take(4);
    pending.push_back({start + 16, length});  // the prefix is padded to 16 bytes
  }
  std::vector<AttributeMessage> found;
  std::set<uint64_t> visited;
  while (!pending.empty()) {
    const Chunk chunk = pending.back();
    pending.pop_back();
    if (!visited.insert(chunk.offset).second || visited.size() > kMaximumChunks) {
      throw Damage{header + " has continuation chunks that form a cycle"};
    }
    const std::vector<uint8_t> bytes = file.read(chunk.offset, chunk.length, header);
    Cursor messages(bytes.data(), bytes.size(), header);
    const size_t message_header = version2 ? ((header_flags & 0x04) ? 6 : 4) : 8;
    while (messages.remaining() >= message_header) {
      const auto type = static_cast<unsigned>(messages.take(version2 ? 1 : 2));
      const uint64_t size = messages.take(2);
      const auto flags = static_cast<unsigned>(messages.take(1));
      messages.skip(message_header - (version2 ? 4 : 5));  // creation order, or reserved bytes
      const uint8_t* data = messages.skip(size);
      if (type == kAttributeMessage) {
        found.push_back({flags, std::vector<uint8_t>(data, data + size)});
      } else if (type == kContinuationMessage) {
        Cursor continuation(data, static_cast<size_t>(size), header + "'s continuation message");
        const uint64_t address = continuation.take(geometry.address_bytes);
        const uint64_t length = continuation.take(geometry.length_bytes);
        if (!version2) {
          pending.push_back({geometry.base + address, length});
          continue;
        }
        // A version-2 chunk is "OCHK", its messages, and a checksum HDF5 has verified already.
        const std::string name = header + "'s continuation chunk at " + hex(address);
        if (length < 8) throw Damage{name + " is too short"};
        if (std::memcmp(file.read(geometry.base + address, 4, name).data(), "OCHK", 4) != 0) {
          throw Damage{name + " has no OCHK signature"};
        }
        pending.push_back({geometry.base + address + 4, length - 8});
      }
    }
  }
  return found;
}

// Object index -> object size of the global heap collection at `address`, parsed as HDF5 1.10 does
// (H5HG__cache_heap_deserialize) but refusing every object that would not lie inside the collection.
std::map<uint64_t, uint64_t> collection_objects(const RawFile& file, const FileGeometry& geometry,
                                                uint64_t address) {
  const std::string name = "the global heap collection at " + hex(address);
  const uint64_t start = geometry.base + address;
  const uint64_t header_bytes = 8 + geometry.length_bytes;
  const std::vector<uint8_t> header = file.read(start, header_bytes, name);
  Cursor cursor(header.data(), header.size(), name);
  if (std::memcmp(cursor.skip(4), "GCOL", 4) != 0 || cursor.take(1) != 1) {
    throw Damage{name + " has no GCOL signature of version 1"};
  }
  cursor.skip(3);
  const uint64_t size = cursor.take(geometry.length_bytes);
  if (size < kMinimumCollectionSize) throw Damage{name + " declares " + std::to_string(size) + " bytes"};
  const std::vector<uint8_t> bytes = file.read(start, size, name);
  const uint64_t object_header = 8 + geometry.length_bytes;
  std::map<uint64_t, uint64_t> objects;
  uint64_t position = header_bytes;
  while (position < size && object_header <= size - position) {  // a shorter tail is free space
    Cursor object(bytes.data() + position, static_cast<size_t>(size - position), name);
    const uint64_t index = object.take(2);
    object.skip(6);  // reference count, reserved
    const uint64_t object_size = object.take(geometry.length_bytes);
    // The free-space object (index 0) counts its own header and is not padded.
    const uint64_t need =
        index == 0 ? object_size : (object_size > size ? size + 1 : object_header + align8(object_size));
    if (need == 0 || need > size - position) {
      throw Damage{name + ": object " + std::to_string(index) + " does not fit in the collection"};
    }
    if (index > 0 && !objects.emplace(index, object_size).second) {
      throw Damage{name + " holds object " + std::to_string(index) + " twice"};
    }
    position += need;
  }
  return objects;
}

// The number of elements a dataspace message describes.
uint64_t element_count(const uint8_t* data, size_t size, const FileGeometry& geometry) {
  Cursor cursor(data, size, "the attribute's dataspace");
  const uint64_t version = cursor.take(1);
  const uint64_t rank = cursor.take(1);
  cursor.skip(1);  // flags
  if (version == 1) {
    cursor.skip(5);  // reserved
  } else if (version == 2) {
    const uint64_t type = cursor.take(1);
    if (type == 2) return 0;  // the null dataspace holds nothing
  } else {
    throw Damage{"the attribute's dataspace has an unknown version"};
  }
  uint64_t count = 1;
  for (uint64_t i = 0; i < rank; ++i) {
    const uint64_t extent = cursor.take(geometry.length_bytes);
    if (extent != 0 && count > UINT64_MAX / extent) throw Damage{"the attribute's dataspace overflows"};
    count *= extent;
  }
  return count;
}

// Checks one attribute message (already known to carry the attribute's name) against the heap.
void check_message(const RawFile& file, const FileGeometry& geometry, const std::vector<uint8_t>& data,
                   std::map<uint64_t, std::map<uint64_t, uint64_t>>& collections) {
  Cursor cursor(data.data(), data.size(), "the attribute message");
  const uint64_t version = cursor.take(1);
  cursor.skip(1);
  const uint64_t name_size = cursor.take(2);
  const uint64_t type_size = cursor.take(2);
  const uint64_t space_size = cursor.take(2);
  if (version == 3) cursor.skip(1);  // the name's character set
  const auto padded = [&](uint64_t size) { return version == 1 ? align8(size) : size; };
  cursor.skip(padded(name_size));
  const uint8_t* type = cursor.skip(padded(type_size));
  const uint8_t* space = cursor.skip(padded(space_size));
  Cursor type_cursor(type, static_cast<size_t>(type_size), "the attribute's datatype");
  if ((type_cursor.take(1) & 0x0F) != kVariableLengthClass) {
    throw Damage{"the stored datatype is not variable-length"};
  }
  type_cursor.skip(7);  // class bit field and the size of the in-file element
  type_cursor.skip(4);  // the base type's class and bit field
  const uint64_t base_size = type_cursor.take(4);
  const uint64_t count = element_count(space, static_cast<size_t>(space_size), geometry);
  const uint64_t element_bytes = 4 + geometry.address_bytes + 4;  // length, heap ID (collection, index)
  if (count > cursor.remaining() / element_bytes)
    throw Damage{"the attribute holds fewer values than its dataspace"};
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t length = cursor.take(4);
    const uint64_t collection = cursor.take(geometry.address_bytes);
    const uint64_t index = cursor.take(4);
    if (collection == 0) continue;  // a null value: HDF5 reads nothing from the heap
    auto it = collections.find(collection);
    if (it == collections.end()) {
      it = collections.emplace(collection, collection_objects(file, geometry, collection)).first;
    }
    const auto object = it->second.find(index);
    if (object == it->second.end()) {
      throw Damage{"value " + std::to_string(i) + " names object " + std::to_string(index) +
                   ", which the global heap collection at " + hex(collection) + " does not hold"};
    }
    // HDF5 sizes its buffer from the stored length and copies the whole heap object into it.
    if (object->second != length * base_size) {
      throw Damage{"value " + std::to_string(i) + " has length " + std::to_string(length) +
                   " but its heap object holds " + std::to_string(object->second) + " bytes"};
    }
  }
}

// The attribute's name in its message, or "" when the message is too short to hold one.
std::string message_name(const std::vector<uint8_t>& data) {
  if (data.size() < 9) return "";
  const size_t name_size = static_cast<size_t>(data[2]) | (static_cast<size_t>(data[3]) << 8);
  const size_t name_at = data[0] == 3 ? 9 : 8;
  if (name_at > data.size() || name_size > data.size() - name_at) return "";
  const char* name = reinterpret_cast<const char*>(data.data() + name_at);
  return std::string(name, strnlen(name, name_size));
}

}  // namespace

VlenCheck check_vlen_attribute(const std::string& path, const FileGeometry& geometry, uint64_t header_address,
                               const std::string& name) {
  using Outcome = VlenCheck::Outcome;
  if (geometry.address_bytes == 0 || geometry.address_bytes > 8 || geometry.length_bytes == 0 ||
      geometry.length_bytes > 8) {
    return {Outcome::kNotLocated, ""};
  }
  try {
    const RawFile file(path);
    std::map<uint64_t, std::map<uint64_t, uint64_t>> collections;
    bool located = false;
    for (const AttributeMessage& message : attribute_messages(file, geometry, header_address)) {
      if (message_name(message.data) != name) continue;
      // A shared message, or a shared datatype or dataspace, lives elsewhere in the file.
      if ((message.flags & 0x02) || (message.data[0] >= 2 && (message.data[1] & 0x03))) {
        return {Outcome::kNotLocated, ""};
      }
      located = true;
      check_message(file, geometry, message.data, collections);
    }
    return {located ? Outcome::kVerified : Outcome::kNotLocated, ""};
  } catch (const Damage& damage) {
    return {Outcome::kDamaged, damage.reason};
  }
}

}  // namespace touchstone::h5
