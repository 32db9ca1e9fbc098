// Attention requests read from JSON, for hand-written examples and other tools' output. A file is
// the proto3 JSON form of attend.v1.AttendRequest or MultiHeadAttendRequest, read by protobuf's
// parser, restricted to the members below. Tensors have the shape the CLI's --json prints them in:
//
//   {"shape": [n_q, n_head, head_dim], "values": [row-major float32 numbers]}
//
// An Attend request is {"q": T, "k": T, "v": T, "mask": {"causal": b, "window_tokens": n},
// "scale": x} (mask and scale optional); a MultiHeadAttend request is {"x": T, "wq": T,
// "wk": T, "wv": T, "wo": T, "n_head": n, "n_head_kv": n, "mask": ..., "scale": x} (wo, n_head_kv,
// mask and scale optional). Being proto3 JSON, the lowerCamelCase names ("windowTokens"),
// integers and floats written as strings ("3", "NaN") and null for an absent member are
// accepted too. Unknown members are errors, so that a misspelt "causl" is not silently ignored;
// so are the request's other fields (precision, return_weights, ..., which the command's flags
// set) and a tensor's packed `data`.
//
// Every error names the field or the place: "q.values[2]: expected a number (float32), got
// "x"", "k: shape [3, 1, 4] holds 12 values; 'values' has 11", "mask: unknown member 'causl'",
// or a syntax error with its line and column where the text shows them unambiguously.
//
// Not checked, because protobuf's parser allows them: a member given twice (the values are
// merged, as protobuf merges messages), a trailing comma, null elements of an array (skipped:
// the count no longer matches the shape, which is reported) and nested arrays of numbers
// (flattened, in row-major order).
//
// The text is not bounded here: the caller reads at most --max_message_bytes, and the parsed
// request holds at most 4 bytes per value of the text's 2 or more ("0,").
//
// Thread-safety: pure functions.
#ifndef ATTEND_CLIENT_JSON_INPUT_H_
#define ATTEND_CLIENT_JSON_INPUT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/attention_client.h"
#include "client/tensor.h"

namespace attend::client {

// INVALID_ARGUMENT naming the field for anything malformed or missing. The shapes are not
// checked against each other here: the server does that and says which dimension disagrees.
// Tensors' values must be finite and fit in float32; their shapes' dimensions positive
// integers whose product is the number of values.
absl::StatusOr<AttendInput> AttendInputFromJson(absl::string_view text);
absl::StatusOr<MultiHeadInput> MultiHeadInputFromJson(absl::string_view text);

// One tensor object (text such as --json prints for a tensor), checked as above; `field` names
// it in errors ("output").
absl::StatusOr<FloatTensor> TensorFromJson(absl::string_view text, const std::string& field);

}  // namespace attend::client

#endif  // ATTEND_CLIENT_JSON_INPUT_H_
