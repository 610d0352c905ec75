#pragma once
// Reader for the IDX format of MNIST-style datasets, straight from the .gz
// files the Debian packages ship (no unpacked copies on disk).
//
// IDX: two zero bytes, a type byte, the number of dimensions, then one
// big-endian uint32 per dimension, then the values in row-major order. Only
// unsigned bytes (type 0x08) are accepted: that is what image and label files
// hold.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "shared/error.h"

namespace pstrain {

// A dataset file that is missing, unreadable or malformed. The message names
// the file and what is wrong with it.
struct DataError : pstrain::Error {
  using pstrain::Error::Error;
};

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;  // product(dims) bytes, row-major
};

// Reads a gzip-compressed (or plain: zlib reads both) IDX file with exactly
// `rank` dimensions. Throws DataError when the file cannot be opened, the
// magic number or rank is wrong, a dimension is zero, or the file holds fewer
// or more value bytes than its header declares.
IdxArray read_idx(const std::filesystem::path& path, int rank);

}  // namespace pstrain
