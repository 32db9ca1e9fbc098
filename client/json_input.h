// Attention requests read from JSON, for hand-written examples and other tools' output. Tensors
// have the shape the CLI's --json prints them in:
//
//   {"shape": [n_q, n_head, head_dim], "values": [row-major float32 numbers]}
//
// An Attend request is {"q": T, "k": T, "v": T, "mask": {"causal": b, "window_tokens": n},
// "scale": x} (mask and scale optional); a MultiHeadAttend request is {"x": T, "wq": T,
// "wk": T, "wv": T, "wo": T, "n_head": n, "n_head_kv": n, "mask": ..., "scale": x} (wo, n_head_kv,
// mask and scale optional). Unknown members are errors, so that a misspelt "causl" is not
// silently ignored. Every error names the field: "q.values[2]: expected a number, got a
// string", "k: shape [3, 1, 4] holds 12 values; 'values' has 11", or the JSON syntax error with
// its line and column.
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_JSON_INPUT_H_
#define ATTEND_CLIENT_JSON_INPUT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/attention_client.h"
#include "client/tensor.h"
#include "common/json.h"

namespace attend::client {

// A tensor object; `field` names it in errors ("q"). Values must be finite and fit in float32;
// the shape's dimensions positive integers whose product is the number of values.
absl::StatusOr<FloatTensor> TensorFromJson(const json::Value& value, const std::string& field);

// INVALID_ARGUMENT naming the field for anything malformed or missing. The shapes are not
// checked against each other here: the server does that and says which dimension disagrees.
absl::StatusOr<AttendInput> AttendInputFromJson(absl::string_view text);
absl::StatusOr<MultiHeadInput> MultiHeadInputFromJson(absl::string_view text);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_JSON_INPUT_H_
