#include "client/json_input.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "attend/v1/attention.pb.h"
#include "google/protobuf/util/json_util.h"

namespace attend::client {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The members a request file may set, in the order the header lists them.
const std::vector<std::string>& AttendMembers() {
  static const auto* names = new std::vector<std::string>{"q", "k", "v", "mask", "scale"};
  return *names;
}
const std::vector<std::string>& MultiHeadMembers() {
  static const auto* names = new std::vector<std::string>{
      "x", "wq", "wk", "wv", "wo", "n_head", "n_head_kv", "mask", "scale"};
  return *names;
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

std::string Join(absl::string_view parent, absl::string_view name) {
  if (parent.empty() || name.empty()) return absl::StrCat(parent, name);
  return absl::StrCat(parent, ".", name);
}

// What a value of protobuf's type name `type` is written as, for "expected ..." messages.
std::string Kind(absl::string_view type) {
  if (type == "TYPE_FLOAT") return "a number (float32)";
  if (type == "TYPE_DOUBLE") return "a number";
  if (type == "TYPE_INT64" || type == "TYPE_UINT64") return "an integer";
  if (type == "TYPE_INT32" || type == "TYPE_UINT32") return "an integer (32-bit)";
  if (type == "TYPE_BOOL") return "true or false";
  if (absl::EndsWith(type, ".Tensor")) return "a tensor {\"shape\": [...], \"values\": [...]}";
  if (absl::EndsWith(type, ".MaskOptions")) return "an object {\"causal\", \"window_tokens\"}";
  return absl::StrCat("a value of type ", type);
}

// Text from the input quoted in a message: at most `max` bytes, control bytes and non-ASCII
// escaped, so that messages are safe to print.
std::string Quote(absl::string_view text, size_t max = 40) {
  std::string out;
  for (const char c : text.substr(0, max)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

// Where protobuf's syntax error `message` ("<what>\n<up to 20 bytes either side>\n<spaces>^")
// points in `text`: "line L, column C: <what>" when that excerpt occurs once in the text (the
// parser does not say its offset), else the excerpt from the caret on. nullopt when `message`
// does not have that form.
std::optional<std::string> SyntaxError(absl::string_view message, absl::string_view text) {
  const size_t first = message.find('\n'), last = message.rfind('\n');
  if (first == absl::string_view::npos || first == last) return std::nullopt;
  const absl::string_view what = absl::StripSuffix(message.substr(0, first), ".");
  const absl::string_view excerpt = message.substr(first + 1, last - first - 1);
  const absl::string_view caret_line = message.substr(last + 1);
  const size_t caret = caret_line.size() - 1;  // the spaces before '^'
  if (!absl::EndsWith(caret_line, "^") || caret_line.find_first_not_of(' ') != caret ||
      caret > excerpt.size()) {
    return std::nullopt;
  }
  size_t offset = absl::string_view::npos;
  if (excerpt.empty() && absl::StartsWith(what, "Unexpected end of string")) {
    offset = text.size();
  } else if (const size_t at = text.find(excerpt);
             !excerpt.empty() && at != absl::string_view::npos &&
             text.find(excerpt, at + 1) == absl::string_view::npos) {
    offset = at + caret;
  }
  if (offset == absl::string_view::npos) {
    return absl::StrCat(Quote(what, 200), " at \"", Quote(excerpt.substr(caret)), "\"");
  }
  const absl::string_view before = text.substr(0, offset);
  const size_t line_start = before.rfind('\n');
  const size_t column = line_start == absl::string_view::npos ? offset + 1 : offset - line_start;
  return absl::StrCat("line ", absl::c_count(before, '\n') + 1, ", column ", column, ": ",
                      Quote(what, 200));
}

// protobuf's parse error for `text`, reworded so that it starts with the field as the rest of
// the CLI's do. Its forms (protobuf 3.21): "(q.values[2]): invalid value "x" for type
// TYPE_FLOAT", "(mask) causl: Cannot find field.", "qq: Cannot find field.", "q: Proto field is
// not repeating, cannot start list.", ": Root element must be a message." and syntax errors;
// others are passed on as they are. `root` prefixes field paths ("" for a request) and
// `root_known` lists its members.
absl::Status Reworded(absl::string_view message, absl::string_view text, absl::string_view root,
                      absl::string_view root_known) {
  if (std::optional<std::string> syntax = SyntaxError(message, text)) {
    return absl::InvalidArgumentError(*syntax);
  }
  const absl::Status status = absl::InvalidArgumentError(Quote(message, 200));
  absl::string_view rest = message;
  std::string parent(root), name;
  if (absl::ConsumePrefix(&rest, "(")) {
    const size_t close = rest.find(')');
    if (close == absl::string_view::npos) return status;
    parent = Join(root, Quote(rest.substr(0, close), 200));
    rest.remove_prefix(close + 1);
    absl::ConsumePrefix(&rest, " ");
  }
  if (!absl::ConsumePrefix(&rest, ": ")) {
    const size_t colon = rest.find(": ");
    if (colon == absl::string_view::npos) return status;
    name = Quote(rest.substr(0, colon), 200);
    rest.remove_prefix(colon + 2);
  }
  if (rest == "Cannot find field.") {
    const absl::string_view known = parent == root                   ? root_known
                                    : absl::EndsWith(parent, "mask") ? "causal, window_tokens"
                                                                     : "shape, values";
    return Invalid(parent.empty() ? "the request" : parent,
                   absl::StrCat("unknown member '", Quote(name), "' (known: ", known, ")"));
  }
  const std::string field = Join(parent, name);
  if (rest == "Root element must be a message.") {
    return absl::InvalidArgumentError("the request must be a JSON object");
  }
  if (rest == "Proto field is not repeating, cannot start list.") {
    return Invalid(field, "got an array; this member is not a list");
  }
  if (absl::ConsumePrefix(&rest, "invalid value ")) {
    const size_t for_type = rest.rfind(" for type ");
    if (for_type != absl::string_view::npos) {
      const absl::string_view type = rest.substr(for_type + 10);
      const absl::string_view value = rest.substr(0, for_type);
      // A whole number refused by an integer field is out of its range. protobuf prints one
      // beyond int64 as a double (99999999999999999999 as "1e+20"), which is then approximate.
      double number;
      if (absl::StrContains(type, "INT") && absl::SimpleAtod(value, &number) &&
          std::isfinite(number) && std::floor(number) == number) {
        const bool approximate = value.find_first_of(".eE") != absl::string_view::npos;
        return Invalid(field,
                       absl::StrCat("expected ", Kind(type), ", got a number out of its range (",
                                    approximate ? "about " : "", Quote(value), ")"));
      }
      // A number refused by a float field is beyond float32's range: protobuf refuses it rather
      // than rounding it to infinity. Numbers in strings ("1e39") count; spellings of infinity
      // and NaN other than proto3 JSON's ("inf") are no numbers at all.
      const absl::string_view digits = absl::StripSuffix(absl::StripPrefix(value, "\""), "\"");
      if (type == "TYPE_FLOAT" && absl::SimpleAtod(digits, &number) &&
          std::fabs(number) > std::numeric_limits<float>::max() &&
          digits.find_first_of("iInN") == absl::string_view::npos) {
        return Invalid(field, absl::StrCat("expected ", Kind(type), ", got ", Quote(value),
                                           ", beyond float32's range (about 3.4e38)"));
      }
      return Invalid(field, absl::StrCat("expected ", Kind(type), ", got ", Quote(value)));
    }
  }
  return field.empty() ? status : Invalid(field, Quote(rest, 200));
}

// Parses `text` into `out` with protobuf's parser (unknown members refused); errors as
// Reworded says.
absl::Status Parse(absl::string_view text, Message* out, absl::string_view root,
                   absl::string_view root_known) {
  // A leading UTF-8 byte order mark, as some editors write, is not JSON; skipped.
  const size_t bom = absl::StartsWith(text, "\xEF\xBB\xBF") ? 3 : 0;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  // protobuf 3.21 has its own Status type. Every failure is the text's: INVALID_ARGUMENT.
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data() + bom, text.size() - bom), out, options);
  if (status.ok()) return absl::OkStatus();
  return Reworded(absl::string_view(status.message().data(), status.message().size()),
                  text.substr(bom), root, root_known);
}

// Refuses the fields of `message` that are set (not default) and not in `accepted`: the
// proto's other fields, which the file format leaves to the command's flags.
absl::Status OnlyAccepted(const Message& message, absl::string_view parent,
                          const std::vector<std::string>& accepted) {
  std::vector<const FieldDescriptor*> set;
  message.GetReflection()->ListFields(message, &set);
  for (const FieldDescriptor* f : set) {
    if (absl::c_linear_search(accepted, f->name())) continue;
    return Invalid(Join(parent, f->name()),
                   absl::StrCat("not read from request files, which hold ",
                                absl::StrJoin(accepted, ", "), " (flags set the rest)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FloatTensor> ToTensor(const v1::Tensor& t, const std::string& field) {
  if (!t.data().empty()) {
    return Invalid(Join(field, "data"),
                   "not read from request files; give the numbers in 'values'");
  }
  if (t.dtype() != v1::DTYPE_UNSPECIFIED && t.dtype() != v1::FLOAT32) {
    return Invalid(Join(field, "dtype"), "'values' are float32: FLOAT32 or absent");
  }
  if (t.shape().empty()) {
    return Invalid(Join(field, "shape"), "missing or empty (a tensor has dimensions)");
  }
  FloatTensor out;
  // The element count, bounded so that the product cannot overflow (any real request is far
  // below 2^53 elements; the server's limits are lower still).
  constexpr int64_t kMaxDimension = int64_t{1} << 40;
  double elements = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    if (d < 1) {
      return Invalid(absl::StrCat(field, ".shape[", i, "]"),
                     absl::StrCat("expected a positive integer, got ", d));
    }
    if (d > kMaxDimension) {
      return Invalid(
          absl::StrCat(field, ".shape[", i, "]"),
          absl::StrCat(d, " is over the limit of 2^40 (", kMaxDimension, ") for a dimension"));
    }
    elements *= static_cast<double>(d);
    if (elements > 0x1p53) return Invalid(Join(field, "shape"), "more than 2^53 elements");
    out.shape.push_back(d);
  }
  if (static_cast<double>(t.values_size()) != elements) {
    return Invalid(
        field,
        absl::StrCat("shape [", absl::StrJoin(out.shape, ", "), "] holds ",
                     static_cast<int64_t>(elements), " values; 'values' has ", t.values_size(),
                     t.values_size() < elements ? " (a null, as --json prints NaN and infinities, "
                                                  "is not a value)"
                                                : ""));
  }
  for (int i = 0; i < t.values_size(); ++i) {
    // protobuf reads "NaN" and "Infinity"; the server refuses them, so they are refused here.
    if (!std::isfinite(t.values(i))) {
      return Invalid(absl::StrCat(field, ".values[", i, "]"),
                     absl::StrCat("expected a finite number, got ", t.values(i)));
    }
  }
  out.values.assign(t.values().begin(), t.values().end());
  return out;
}

absl::StatusOr<FloatTensor> RequiredTensor(bool present, const v1::Tensor& t,
                                           const std::string& field) {
  if (!present) return Invalid(field, "missing (a tensor {\"shape\": [...], \"values\": [...]})");
  return ToTensor(t, field);
}

absl::Status ReadMask(const v1::MaskOptions& mask, MaskSettings* out) {
  if (mask.window_tokens() < 0) {
    return Invalid("mask.window_tokens",
                   absl::StrCat("expected a non-negative integer, got ", mask.window_tokens()));
  }
  out->causal = mask.causal();
  out->window_tokens = mask.window_tokens();
  return absl::OkStatus();
}

absl::Status ReadScale(bool present, float scale, std::optional<float>* out) {
  if (!present) return absl::OkStatus();
  if (!std::isfinite(scale)) {
    return Invalid("scale", absl::StrCat("expected a finite number, got ", scale));
  }
  *out = scale;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FloatTensor> TensorFromJson(absl::string_view text, const std::string& field) {
  v1::Tensor t;
  if (absl::Status s = Parse(text, &t, field, "shape, values"); !s.ok()) return s;
  return ToTensor(t, field);
}

absl::StatusOr<AttendInput> AttendInputFromJson(absl::string_view text) {
  v1::AttendRequest request;
  if (absl::Status s = Parse(text, &request, "", absl::StrJoin(AttendMembers(), ", ")); !s.ok()) {
    return s;
  }
  if (absl::Status s = OnlyAccepted(request, "", AttendMembers()); !s.ok()) return s;
  AttendInput input;
  for (auto [name, present, tensor, target] :
       {std::tuple{"q", request.has_q(), &request.q(), &input.q},
        {"k", request.has_k(), &request.k(), &input.k},
        {"v", request.has_v(), &request.v(), &input.v}}) {
    absl::StatusOr<FloatTensor> t = RequiredTensor(present, *tensor, name);
    if (!t.ok()) return t.status();
    *target = *std::move(t);
  }
  if (absl::Status s = ReadMask(request.mask(), &input.mask); !s.ok()) return s;
  if (absl::Status s = ReadScale(request.has_scale(), request.scale(), &input.scale); !s.ok()) {
    return s;
  }
  return input;
}

absl::StatusOr<MultiHeadInput> MultiHeadInputFromJson(absl::string_view text) {
  v1::MultiHeadAttendRequest request;
  if (absl::Status s = Parse(text, &request, "", absl::StrJoin(MultiHeadMembers(), ", "));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = OnlyAccepted(request, "", MultiHeadMembers()); !s.ok()) return s;
  MultiHeadInput input;
  for (auto [name, present, tensor, target] :
       {std::tuple{"x", request.has_x(), &request.x(), &input.x},
        {"wq", request.has_wq(), &request.wq(), &input.wq},
        {"wk", request.has_wk(), &request.wk(), &input.wk},
        {"wv", request.has_wv(), &request.wv(), &input.wv}}) {
    absl::StatusOr<FloatTensor> t = RequiredTensor(present, *tensor, name);
    if (!t.ok()) return t.status();
    *target = *std::move(t);
  }
  if (request.has_wo()) {
    absl::StatusOr<FloatTensor> t = ToTensor(request.wo(), "wo");
    if (!t.ok()) return t.status();
    input.wo = *std::move(t);
  }
  // proto3's int32 has no presence: 0 is what an absent n_head reads as.
  if (request.n_head() == 0) return Invalid("n_head", "missing or 0 (the number of query heads)");
  if (request.n_head() < 0) {
    return Invalid("n_head", absl::StrCat("expected a positive integer, got ", request.n_head()));
  }
  if (request.n_head_kv() < 0) {
    return Invalid("n_head_kv",
                   absl::StrCat("expected a non-negative integer, got ", request.n_head_kv()));
  }
  input.n_head = request.n_head();
  input.n_head_kv = request.n_head_kv();
  if (absl::Status s = ReadMask(request.mask(), &input.mask); !s.ok()) return s;
  if (absl::Status s = ReadScale(request.has_scale(), request.scale(), &input.scale); !s.ok()) {
    return s;
  }
  return input;
}

}  // namespace attend::client
