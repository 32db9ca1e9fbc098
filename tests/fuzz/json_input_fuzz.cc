// client/json_input: the CLI's JSON request reader (protobuf's JSON parser, then its checks).
// The first byte chooses Attend (even) or MultiHeadAttend (odd) input; the rest is the JSON
// text. Errors must be INVALID_ARGUMENT, and every tensor read must hold as many values as its
// shape says, all finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "client/json_input.h"
#include "tests/fuzz/parse_check.h"

namespace {

void CheckFinite(const char* what, const attend::client::FloatTensor& t) {
  attend::fuzz::CheckTensor(what, t);
  for (const float v : t.values) {
    if (std::isfinite(v)) continue;
    std::fprintf(stderr, "fuzz: %s holds a non-finite value\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace client = attend::client;
  namespace fuzz = attend::fuzz;
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    absl::StatusOr<client::AttendInput> in = client::AttendInputFromJson(text);
    fuzz::CheckParseStatus("AttendInputFromJson", in.status());
    if (!in.ok()) return 0;
    CheckFinite("q", in->q);
    CheckFinite("k", in->k);
    CheckFinite("v", in->v);
  } else {
    absl::StatusOr<client::MultiHeadInput> in = client::MultiHeadInputFromJson(text);
    fuzz::CheckParseStatus("MultiHeadInputFromJson", in.status());
    if (!in.ok()) return 0;
    CheckFinite("x", in->x);
    CheckFinite("wq", in->wq);
    CheckFinite("wk", in->wk);
    CheckFinite("wv", in->wv);
    if (in->wo) CheckFinite("wo", *in->wo);
  }
  return 0;
}
