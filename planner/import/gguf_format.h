// The GGUF file format as far as its header and metadata key/values go: the magic, the versions,
// the value types with their names and encoded sizes. Shared by the reader (gguf.cc) and by the
// tests that write GGUF headers, so that both spell the format the same way.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count key/values, each a u64-length key, a u32 value type and the value. A string is a
// u64 length and its bytes; an array is a u32 element type, a u64 count and the elements.
//
// Thread-safety: constants and pure functions.
#ifndef ATTEND_PLANNER_IMPORT_GGUF_FORMAT_H_
#define ATTEND_PLANNER_IMPORT_GGUF_FORMAT_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace attend::planner::gguf {

inline constexpr absl::string_view kMagic = "GGUF";
// The versions with this layout (v1 had 32-bit lengths and counts).
inline constexpr uint32_t kMinVersion = 2;
inline constexpr uint32_t kMaxVersion = 3;

// Value types, numbered as in the format's specification (gguf_type in ggml).
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
// Types are 0 to kValueTypeCount - 1; any other number is not a GGUF type.
inline constexpr uint32_t kValueTypeCount = 13;

// "uint8", "int8", ..., "float64" (ggml's names); "unknown" for a number that is not a type.
constexpr absl::string_view ValueTypeName(uint32_t type) {
  constexpr absl::string_view kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                          "int32",  "float32", "bool",   "string", "array",
                                          "uint64", "int64",   "float64"};
  return type < kValueTypeCount ? kNames[type] : "unknown";
}

// Bytes of one value of a fixed-size type; 0 for strings, arrays and unknown types.
constexpr uint64_t FixedSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

// The integer types, and bool (stored as one byte, 0 or 1).
constexpr bool IsInteger(uint32_t type) {
  return type == kU8 || type == kI8 || type == kU16 || type == kI16 || type == kU32 ||
         type == kI32 || type == kU64 || type == kI64 || type == kBool;
}

// Smallest encoding of one value of `type`: a string is at least its u64 length, an array at
// least its u32 element type and u64 count.
constexpr uint64_t MinEncodedSize(uint32_t type) {
  if (type == kString) return 8;
  if (type == kArray) return 12;
  return FixedSize(type);
}

// A key/value takes at least a u64 key length, a 1-byte key, a u32 type and a 1-byte value.
inline constexpr uint64_t kMinKeyValueBytes = 14;

}  // namespace attend::planner::gguf

#endif  // ATTEND_PLANNER_IMPORT_GGUF_FORMAT_H_
