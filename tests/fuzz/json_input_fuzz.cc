// client/json_input: the CLI's JSON request reader. The first byte chooses Attend (even) or
// MultiHeadAttend (odd) input; the rest is the JSON text. Errors must be INVALID_ARGUMENT, and
// every tensor read must hold as many values as its shape says.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "client/json_input.h"
#include "tests/fuzz/parse_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace client = attend::client;
  namespace fuzz = attend::fuzz;
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    absl::StatusOr<client::AttendInput> in = client::AttendInputFromJson(text);
    fuzz::CheckParseStatus("AttendInputFromJson", in.status());
    if (!in.ok()) return 0;
    fuzz::CheckTensor("q", in->q);
    fuzz::CheckTensor("k", in->k);
    fuzz::CheckTensor("v", in->v);
  } else {
    absl::StatusOr<client::MultiHeadInput> in = client::MultiHeadInputFromJson(text);
    fuzz::CheckParseStatus("MultiHeadInputFromJson", in.status());
    if (!in.ok()) return 0;
    fuzz::CheckTensor("x", in->x);
    fuzz::CheckTensor("wq", in->wq);
    fuzz::CheckTensor("wk", in->wk);
    fuzz::CheckTensor("wv", in->wv);
    if (in->wo) fuzz::CheckTensor("wo", *in->wo);
  }
  return 0;
}
