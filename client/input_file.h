// Reading the files a user names (inputs, certificates, model configs) with a bound enforced
// while reading, so that /dev/zero, a pipe or a FIFO that never ends, or a file far larger than
// anything that could be sent, stops at the bound instead of filling memory. The size of such
// inputs is not known in advance, so the bound is on the bytes that arrive, not on a stat.
//
// Thread-safety: reads only the stream it is given.
#ifndef ATTEND_CLIENT_INPUT_FILE_H_
#define ATTEND_CLIENT_INPUT_FILE_H_

#include <cstdint>
#include <istream>
#include <string>

#include "absl/status/statusor.h"

namespace attend::client {

// Reads `in` to its end or to `max_bytes`, whichever comes first, in chunks, so that memory
// follows the bytes that arrived (at most about twice max_bytes while the buffer grows). Returns
// those bytes; *more says whether the stream held more than max_bytes (found by peeking, which
// reads at most one buffer past the limit). DATA_LOSS "cannot read <name>" when the stream
// fails. REQUIRES: max_bytes >= 0.
absl::StatusOr<std::string> ReadAtMost(std::istream& in, int64_t max_bytes, bool* more,
                                       const std::string& name);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_INPUT_FILE_H_
