// The rule of the CLI's --json for 64-bit integers: a number when it is exact in a double
// (|x| <= 2^53), else a string. protobuf's JSON printer quotes every int64 and uint64 (proto3's
// JSON mapping, for readers that parse numbers as doubles), which makes "tokens": "42" of every
// count; only values past 2^53 would lose digits in such a reader, so only they stay quoted.
//
// Thread-safety: a pure function.
#ifndef ATTEND_CLIENT_CLI_JSON_INT64_H_
#define ATTEND_CLIENT_CLI_JSON_INT64_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"

namespace attend::cli {

// `json`, as protobuf's JSON printer wrote a message of type `type` (proto field names), with
// the quotes taken off each value of a 64-bit integer field (int64, uint64, sint64, fixed64,
// sfixed64; singular, repeated, map values, in nested messages) whose magnitude is at most 2^53.
// The text is walked alongside the descriptor, so a string field holding digits stays a string.
// Everything else is copied byte for byte; the messages of google.protobuf (well-known types,
// printed in their own forms) are copied whole. Text that is not such JSON is returned as it is.
std::string UnquoteExactInt64s(absl::string_view json, const google::protobuf::Descriptor& type);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_JSON_INT64_H_
