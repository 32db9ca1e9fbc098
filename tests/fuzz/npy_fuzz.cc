// client/npy: ParseNpy on the input. A file that parses must hold as many values as its shape
// says, and writing it back as float32 and reading that must give the same shape and bits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/npy.h"
#include "tests/fuzz/parse_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace client = attend::client;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<client::FloatTensor> t = client::ParseNpy(bytes);
  attend::fuzz::CheckParseStatus("ParseNpy", t.status());
  if (!t.ok()) return 0;
  attend::fuzz::CheckTensor("the parsed array", *t, /*allow_empty=*/true);
  absl::StatusOr<client::FloatTensor> again = client::ParseNpy(client::SerializeNpy(*t));
  if (!again.ok() || again->shape != t->shape || again->values.size() != t->values.size() ||
      (!t->values.empty() &&
       std::memcmp(again->values.data(), t->values.data(), t->values.size() * 4) != 0)) {
    std::fprintf(stderr, "fuzz: SerializeNpy does not round-trip: %s\n",
                 again.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
