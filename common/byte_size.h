// Byte counts as people write them: "80GiB", "512MiB", "1e9", "64 MB". Used by the CLI's size
// flags (--budget, --weights_bytes) and the server's (--kv_cache_bytes, --max_message_bytes).
#ifndef ATTEND_COMMON_BYTE_SIZE_H_
#define ATTEND_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attend {

// A non-negative decimal number ("1e9", "1.5"; no hex) with an optional unit, binary ("KiB",
// "MiB", "GiB", "TiB", "PiB": powers of 2^10) or decimal ("B", "kB"/"KB", "MB", "GB", "TB",
// "PB": powers of 10^3), case-insensitive, optionally after a space; rounded to whole bytes.
// Whole numbers are exact up to INT64_MAX. INVALID_ARGUMENT starting with `what` (e.g.
// "--budget"; nothing when empty) for anything else (a bare "G" is
// refused as ambiguous) or a value over INT64_MAX.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text, absl::string_view what);

// The shortest exact spelling of `bytes`: "64MiB", "1GiB", "1000000" (no unit when no binary
// unit divides it). ParseByteSize(FormatByteSize(b)) == b.
std::string FormatByteSize(int64_t bytes);

// An absl flag type for byte counts: ABSL_FLAG(attend::ByteSize, kv_cache_bytes, ...).
struct ByteSize {
  int64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace attend

#endif  // ATTEND_COMMON_BYTE_SIZE_H_
