// Counts the heap bytes allocated through operator new: live now and the peak since the last reset.
// The counting replaces the global operator new and delete, so it is linked only into the programs
// that measure (the target touchstone_alloc_tracker); everything else keeps the standard allocator.
// Only operator new is counted: malloc (OpenBLAS, HDF5, MPI) is not.
#pragma once

#include <cstdint>

namespace touchstone::alloc_tracker {

// Bytes requested through operator new and not yet deleted.
int64_t live_bytes();
// The largest live_bytes() since the last reset_peak() (or the program start).
int64_t peak_bytes();
// Sets the peak to the current live bytes.
void reset_peak();

}  // namespace touchstone::alloc_tracker
