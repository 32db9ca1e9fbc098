// Checks the fuzz targets of the parsers share: the documented error code, and tensors whose
// values agree with their shape.
#ifndef ATTEND_TESTS_FUZZ_PARSE_CHECK_H_
#define ATTEND_TESTS_FUZZ_PARSE_CHECK_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace attend::fuzz {

// Aborts unless `status` is OK or INVALID_ARGUMENT whose message starts with `prefix`.
inline void CheckParseStatus(const char* what, const absl::Status& status,
                             absl::string_view prefix = "") {
  // ATTEND_FUZZ_VERBOSE=1 prints every result, to see how deep a seed gets.
  static const bool verbose = std::getenv("ATTEND_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: %s -> %s\n", what, status.ToString().c_str());
  if (status.ok()) return;
  if (status.code() == absl::StatusCode::kInvalidArgument &&
      absl::StartsWith(status.message(), prefix)) {
    return;
  }
  std::fprintf(stderr, "fuzz: %s failed with an undocumented status: %s\n", what,
               status.ToString().c_str());
  std::abort();
}

// Aborts unless the tensor's dimensions are positive (or zero, with `allow_empty`) and multiply
// to its number of values. `Tensor` is client::FloatTensor (a template, so that the planner's
// targets need not link the client).
template <typename Tensor>
void CheckTensor(const char* what, const Tensor& t, bool allow_empty = false) {
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < (allow_empty ? 0 : 1)) {
      std::fprintf(stderr, "fuzz: %s has a dimension %lld\n", what, static_cast<long long>(d));
      std::abort();
    }
    n *= static_cast<uint64_t>(d);
  }
  if (n != t.values.size()) {
    std::fprintf(stderr, "fuzz: %s has %zu values for a shape of %llu\n", what, t.values.size(),
                 static_cast<unsigned long long>(n));
    std::abort();
  }
}

}  // namespace attend::fuzz

#endif  // ATTEND_TESTS_FUZZ_PARSE_CHECK_H_
