#include "client/input_file.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attend::client {

absl::StatusOr<std::string> ReadAtMost(std::istream& in, int64_t max_bytes, bool* more,
                                       const std::string& name) {
  std::string data;
  char chunk[1 << 16];
  while (static_cast<int64_t>(data.size()) < max_bytes) {
    const int64_t want =
        std::min<int64_t>(sizeof(chunk), max_bytes - static_cast<int64_t>(data.size()));
    in.read(chunk, want);
    data.append(chunk, static_cast<size_t>(in.gcount()));
    if (in.gcount() < want) break;  // the end, or an error (told apart below)
  }
  *more = static_cast<int64_t>(data.size()) == max_bytes && in &&
          in.peek() != std::istream::traits_type::eof();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", name));
  return data;
}

}  // namespace attend::client
