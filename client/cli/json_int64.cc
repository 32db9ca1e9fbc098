#include "client/cli/json_int64.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attend::cli {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

constexpr uint64_t kExactInDouble = uint64_t{1} << 53;

// Whether `digits` (the inside of a quoted value) is an integer of magnitude <= 2^53.
bool ExactInDouble(absl::string_view digits, bool is_signed) {
  if (is_signed) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(digits, &v)) return false;
    return v >= -static_cast<int64_t>(kExactInDouble) && v <= static_cast<int64_t>(kExactInDouble);
  }
  uint64_t v = 0;
  return absl::SimpleAtoi(digits, &v) && v <= kExactInDouble;
}

bool Is64BitInteger(const FieldDescriptor& f) {
  return f.cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
         f.cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
}

// A recursive-descent walk of the printer's JSON. The output is the input with some byte
// ranges replaced: `copied_` is how far the input has been written to `out_`.
class Walker {
 public:
  explicit Walker(absl::string_view in) : in_(in) {}

  std::string Run(const Descriptor& type) {
    SkipSpace();
    if (!Object(&type)) return std::string(in_);
    SkipSpace();
    if (pos_ != in_.size()) return std::string(in_);
    absl::StrAppend(&out_, in_.substr(copied_));
    return out_;
  }

 private:
  void SkipSpace() {
    while (pos_ < in_.size() && absl::ascii_isspace(static_cast<unsigned char>(in_[pos_]))) ++pos_;
  }
  bool Next(char c) {
    SkipSpace();
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Peek(char c) {
    SkipSpace();
    return pos_ < in_.size() && in_[pos_] == c;
  }

  // A string token; `*inside` receives its text between the quotes, escapes as written.
  bool String(absl::string_view* inside) {
    if (!Next('"')) return false;
    const size_t start = pos_;
    while (pos_ < in_.size() && in_[pos_] != '"') pos_ += in_[pos_] == '\\' ? 2 : 1;
    if (pos_ >= in_.size()) return false;
    *inside = in_.substr(start, pos_ - start);
    ++pos_;
    return true;
  }

  // Any value, copied as it is.
  bool Skip() {
    SkipSpace();
    if (pos_ >= in_.size()) return false;
    absl::string_view ignored;
    if (in_[pos_] == '"') return String(&ignored);
    if (in_[pos_] == '{' || in_[pos_] == '[') {
      const char close = in_[pos_] == '{' ? '}' : ']';
      ++pos_;
      if (Next(close)) return true;
      do {
        if (close == '}' && !(String(&ignored) && Next(':'))) return false;
        if (!Skip()) return false;
      } while (Next(','));
      return Next(close);
    }
    while (pos_ < in_.size() && !absl::ascii_isspace(static_cast<unsigned char>(in_[pos_])) &&
           in_[pos_] != ',' && in_[pos_] != '}' && in_[pos_] != ']') {
      ++pos_;
    }
    return true;
  }

  // One value of field `f` (an element, for a repeated field).
  bool Single(const FieldDescriptor& f) {
    if (Is64BitInteger(f) && Peek('"')) {
      const size_t start = pos_;
      absl::string_view digits;
      if (!String(&digits)) return false;
      if (ExactInDouble(digits, f.cpp_type() == FieldDescriptor::CPPTYPE_INT64)) {
        absl::StrAppend(&out_, in_.substr(copied_, start - copied_), digits);
        copied_ = pos_;
      }
      return true;
    }
    if (f.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && Peek('{') &&
        !absl::StartsWith(f.message_type()->full_name(), "google.protobuf.")) {
      return Object(f.message_type());
    }
    return Skip();
  }

  // The value of field `f` as a member of its message: an array for a repeated field, an
  // object keyed by the map key for a map field.
  bool FieldValue(const FieldDescriptor& f) {
    if (f.is_map() && Peek('{')) {
      ++pos_;
      if (Next('}')) return true;
      absl::string_view key;
      do {
        if (!(String(&key) && Next(':') && Single(*f.message_type()->map_value()))) return false;
      } while (Next(','));
      return Next('}');
    }
    if (f.is_repeated() && Peek('[')) {
      ++pos_;
      if (Next(']')) return true;
      do {
        if (!Single(f)) return false;
      } while (Next(','));
      return Next(']');
    }
    return Single(f);
  }

  // An object of message `type`; members that name no field of it are copied.
  bool Object(const Descriptor* type) {
    if (!Next('{')) return false;
    if (Next('}')) return true;
    absl::string_view key;
    do {
      if (!(String(&key) && Next(':'))) return false;
      const FieldDescriptor* f = type->FindFieldByName(std::string(key));
      if (!(f ? FieldValue(*f) : Skip())) return false;
    } while (Next(','));
    return Next('}');
  }

  const absl::string_view in_;
  size_t pos_ = 0;
  size_t copied_ = 0;
  std::string out_;
};

}  // namespace

std::string UnquoteExactInt64s(absl::string_view json, const Descriptor& type) {
  return Walker(json).Run(type);
}

}  // namespace attend::cli
