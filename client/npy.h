// Reading and writing NumPy .npy files (format versions 1-3), the format people already have
// tensors in. Reads little-endian float32, float64 and float16 arrays in C order (converted to
// float); writes float32.
//
// Reading is bounded and header first: the magic, the header (at most kMaxNpyHeaderBytes), its
// dtype and shape are checked before any of the array is read, the array's size follows from
// the shape and dtype and must be within NpyLimits, and exactly that many bytes are read. So
// /dev/zero, an endless FIFO or a large file that is not a .npy file fails after its first bytes,
// and memory stays near the size of the array itself.
//
// Thread-safety: pure functions over files.
#ifndef ATTEND_CLIENT_NPY_H_
#define ATTEND_CLIENT_NPY_H_

#include <cstdint>
#include <istream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/tensor.h"

namespace attend::client {

// The longest header accepted: all a version 1.0 file can hold. numpy.load itself refuses more
// than 10,000 bytes by default, and the arrays read here need under 200.
inline constexpr int64_t kMaxNpyHeaderBytes = 65535;

// The most values a request of `max_message_bytes` can carry: 2 bytes per value, bf16 or f16 on
// the wire (--wire), the narrowest encoding. An array of more values could never be sent, so
// reading it would only fill memory. At least 1.
int64_t MaxNpyValuesForMessage(int64_t max_message_bytes);

// How much ReadNpy accepts.
struct NpyLimits {
  // The most values (elements, of any dtype) the array may hold; a shape with more is refused
  // before the array is read. The default: MaxNpyValuesForMessage of the client's default
  // message limit, 64 MiB (ConnectionOptions::max_message_bytes), i.e. 32 Mi values.
  int64_t max_values = (int64_t{64} << 20) / 2;
  // Why max_values is what it is, for the error that refuses a larger shape.
  std::string reason =
      "the most a 64 MiB request, the default --max_message_bytes, carries at 2 bytes a value";
};

// Parses the bytes of a .npy file. INVALID_ARGUMENT naming the problem for anything malformed,
// Fortran-ordered, big-endian or of an unsupported dtype, and for bytes before or after the
// array's data. The shape may hold no more values than `bytes` has bytes.
absl::StatusOr<FloatTensor> ParseNpy(absl::string_view bytes);
// The bytes of a version 1.0 .npy file holding `tensor` as '<f4'.
std::string SerializeNpy(const FloatTensor& tensor);

// Reads one .npy file from `in`, header first (see the top of this file), consuming at most the
// header, the array's data and one byte more (to refuse trailing bytes). `name` starts every
// error ("--q q.npy: not a .npy file: it starts with ..."). INVALID_ARGUMENT for what ParseNpy
// refuses, a truncated header or array, trailing bytes, and a shape over limits.max_values
// (naming the shape, its count, the limit and limits.reason); DATA_LOSS when reading fails.
absl::StatusOr<FloatTensor> ReadNpy(std::istream& in, absl::string_view name,
                                    const NpyLimits& limits = {});
// ReadNpy of the file at `path`, named by its path in errors. NOT_FOUND when it cannot be
// opened, FAILED_PRECONDITION for a directory.
absl::StatusOr<FloatTensor> ReadNpyFile(const std::string& path, const NpyLimits& limits = {});
// Writes `tensor` to `path` (SerializeNpy) with WriteFile: "cannot write '<path>': <reason>".
absl::Status WriteNpyFile(const std::string& path, const FloatTensor& tensor);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_NPY_H_
