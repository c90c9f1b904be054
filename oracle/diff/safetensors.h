// A reader for the safetensors format: an 8-byte little-endian header length, a JSON header mapping
// each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that
// follows the header; "__metadata__" holds strings), then the raw little-endian tensor bytes.
#pragma once

#include <map>
#include <string>

#include "oracle/golden/recorded.h"

namespace touchstone::diff {

// Reads every tensor of one file. Supported dtypes: F64, F32, BF16, F16, I64, I32, I16, I8, U8.
// Throws InputError naming the file (and tensor) for a truncated file, a header that is not valid
// JSON or not the format's structure, an unknown dtype, or offsets that disagree with the shape.
std::map<std::string, Recorded> read_safetensors(const std::string& path);

// bf16 and IEEE half bit patterns -> their exact float values.
double bfloat16_value(uint16_t bits);
double float16_value(uint16_t bits);

}  // namespace touchstone::diff
