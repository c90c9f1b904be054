// Checks the variable-length values of an HDF5 attribute from the file's raw bytes, before the HDF5
// library dereferences them.
//
// A variable-length value (a string attribute as h5py and H5Writer store it) is kept in a global heap
// collection ("GCOL") and the attribute holds only its length and heap ID. HDF5 1.10 trusts both: a
// damaged collection or heap ID makes it read out of bounds, loop forever or overrun the buffer it
// sized from the stored length. No checksum covers either (object headers of version 1 and global
// heaps have none), so a single flipped byte in a file that is otherwise fine crashes the reader.
// This check parses the attribute message and the collection it points into exactly as HDF5 1.10
// does, but with every bound checked, and accepts a value only when its heap object exists and has the
// stored length.
#pragma once

#include <cstdint>
#include <string>

namespace touchstone::h5 {

// How the file encodes addresses (its superblock's sizes and the user block before it).
struct FileGeometry {
  uint64_t base = 0;  // file offset of address 0 (the user block's size)
  unsigned address_bytes = 8;
  unsigned length_bytes = 8;
};

struct VlenCheck {
  enum class Outcome {
    kVerified,    // every value of every message of that name points at an intact heap object
    kNotLocated,  // no such attribute message in the header (dense or shared storage): not checked
    kDamaged,     // `reason` says what is wrong
  };
  Outcome outcome = Outcome::kVerified;
  std::string reason;
};

// The attribute `name` in the object header at address `header_address` of the file at `path`.
VlenCheck check_vlen_attribute(const std::string& path, const FileGeometry& geometry, uint64_t header_address,
                               const std::string& name);

}  // namespace touchstone::h5
