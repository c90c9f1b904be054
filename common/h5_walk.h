// Reads an HDF5 file once in a child process before Touchstone's reader touches it, so that a file the
// HDF5 library cannot read safely is refused with an error instead of crashing the command.
//
// HDF5 1.10 trusts the structure of the files it reads: a damaged object header, attribute message or
// type can make it read or write out of bounds (fuzzing found overflows in H5Aread and in the
// attribute-message iteration of H5Aexists), and no checksum covers the metadata of files written with
// the default format (object headers of version 1). Golden files and candidate files come from other
// programs, so no checksum of Touchstone's own can cover them either. Checking every message from the
// raw bytes would mean re-implementing the library; instead a child process (fork) opens the file and
// reads everything in it: every group, every attribute (strings included) and every dataset's values,
// converted as the reader converts them. If the child dies, exits non-zero or does not finish in
// time, the file is refused with one line naming it. HDF5 can stop listing an object's attributes or a
// group's links at a damaged message yet still open a later one by name, so a listing that fails
// refuses the file too: a clean walk then means the reader's own calls, a subset of the walk's on the
// same bytes, cannot crash either.
#pragma once

#include <string>

namespace touchstone::h5 {

// Throws InputError naming `path` when the walk in the child process does not finish cleanly. Files
// that are not HDF5 at all, or that HDF5 refuses with an error of its own, pass: the reader reports
// those itself, with HDF5's reason.
void walk_in_child_process(const std::string& path);

}  // namespace touchstone::h5
