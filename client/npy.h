// Reading and writing NumPy .npy files (format versions 1-3), the format people already have
// tensors in. Reads little-endian float32, float64 and float16 arrays in C order (converted to
// float); writes float32.
//
// Thread-safety: pure functions over files.
#ifndef ATTEND_CLIENT_NPY_H_
#define ATTEND_CLIENT_NPY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/tensor.h"

namespace attend::client {

// Parses the bytes of a .npy file. INVALID_ARGUMENT naming the problem for anything malformed,
// Fortran-ordered, big-endian or of an unsupported dtype.
absl::StatusOr<FloatTensor> ParseNpy(absl::string_view bytes);
// The bytes of a version 1.0 .npy file holding `tensor` as '<f4'.
std::string SerializeNpy(const FloatTensor& tensor);

absl::StatusOr<FloatTensor> ReadNpyFile(const std::string& path);
absl::Status WriteNpyFile(const std::string& path, const FloatTensor& tensor);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_NPY_H_
