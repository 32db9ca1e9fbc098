#include "client/json_input.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attend::client {
namespace {

using json::Value;

absl::Status Invalid(const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status Expected(const std::string& field, absl::string_view expected, const Value& got) {
  return Invalid(field, absl::StrCat("expected ", expected, ", got ", got.type_name()));
}

// Refuses members outside `known`, naming the first one and listing what is accepted.
absl::Status OnlyMembers(const Value& object, const std::string& field,
                         const std::vector<std::string>& known) {
  const std::set<std::string> allowed(known.begin(), known.end());
  for (const Value::Member& member : object.members()) {
    if (allowed.count(member.first) == 0) {
      const std::string where = field.empty() ? "the request" : field;
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown member '", member.first,
                                                     "' (known: ", absl::StrJoin(known, ", "),
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

std::string Member(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : absl::StrCat(parent, ".", name);
}

// A non-negative integer number (exact in a double: at most 2^53).
absl::StatusOr<int64_t> Integer(const Value& value, const std::string& field) {
  if (!value.is_number()) return Expected(field, "an integer", value);
  const double d = value.number_value();
  if (d != std::floor(d) || d < 0 || d > 0x1p53) {
    return Invalid(field, absl::StrCat("expected a non-negative integer, got ", d));
  }
  return static_cast<int64_t>(d);
}

// The values of the tensor called `field`: a flat array of finite float32 numbers.
absl::StatusOr<std::vector<float>> Floats(const Value& values, const std::string& field) {
  if (!values.is_array()) return Expected(field, "an array of numbers", values);
  std::vector<float> out;
  if (!values.all_numbers()) {
    for (size_t i = 0; i < values.items().size(); ++i) {
      const Value& item = values.items()[i];
      if (item.is_number()) continue;
      const std::string element = absl::StrCat(field, "[", i, "]");
      if (item.is_array()) {
        return Invalid(element, "expected a number, got an array (values are flat, row-major)");
      }
      if (item.is_null()) {
        return Invalid(element,
                       "expected a number, got null (--json prints NaN and infinities as null; "
                       "they are not valid inputs)");
      }
      return Expected(element, "a number", item);
    }
  }
  const std::vector<double>& numbers = values.numbers();
  out.reserve(numbers.size());
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (std::abs(numbers[i]) > std::numeric_limits<float>::max()) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat(numbers[i], " is outside the range of float32"));
    }
    out.push_back(static_cast<float>(numbers[i]));
  }
  return out;
}

// The members of a mask object.
absl::Status ReadMask(const Value& mask, MaskSettings* out) {
  if (!mask.is_object()) return Expected("mask", "an object", mask);
  if (absl::Status s = OnlyMembers(mask, "mask", {"causal", "window_tokens"}); !s.ok()) return s;
  if (const Value* causal = mask.Find("causal")) {
    if (!causal->is_bool()) return Expected("mask.causal", "true or false", *causal);
    out->causal = causal->bool_value();
  }
  if (const Value* window = mask.Find("window_tokens")) {
    absl::StatusOr<int64_t> w = Integer(*window, "mask.window_tokens");
    if (!w.ok()) return w.status();
    out->window_tokens = *w;
  }
  return absl::OkStatus();
}

absl::Status ReadScale(const Value& scale, std::optional<float>* out) {
  if (!scale.is_number()) return Expected("scale", "a number", scale);
  if (std::abs(scale.number_value()) > std::numeric_limits<float>::max()) {
    return Invalid("scale", "outside the range of float32");
  }
  *out = static_cast<float>(scale.number_value());
  return absl::OkStatus();
}

absl::StatusOr<Value> Document(absl::string_view text) {
  // Requests are mostly long arrays of numbers, which the parser stores densely; its default
  // limits (1 GiB of text, 2^28 values) are made for them.
  absl::StatusOr<Value> root = json::Parse(text, json::Limits());
  if (!root.ok()) return root.status();
  if (!root->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request must be a JSON object, got ", root->type_name()));
  }
  return root;
}

// The required tensor member `name` of `root`.
absl::StatusOr<FloatTensor> RequiredTensor(const Value& root, const std::string& name) {
  const Value* value = root.Find(name);
  if (value == nullptr)
    return Invalid(name, "missing (a tensor {\"shape\": [...], \"values\": [...]})");
  return TensorFromJson(*value, name);
}

}  // namespace

absl::StatusOr<FloatTensor> TensorFromJson(const Value& value, const std::string& field) {
  if (!value.is_object()) return Expected(field, "a tensor object {\"shape\", \"values\"}", value);
  if (absl::Status s = OnlyMembers(value, field, {"shape", "values"}); !s.ok()) return s;
  const Value* shape = value.Find("shape");
  const Value* values = value.Find("values");
  if (shape == nullptr) return Invalid(Member(field, "shape"), "missing");
  if (values == nullptr) return Invalid(Member(field, "values"), "missing");
  if (!shape->all_numbers())
    return Expected(Member(field, "shape"), "an array of integers", *shape);
  if (shape->size() == 0) return Invalid(Member(field, "shape"), "empty (a tensor has dimensions)");
  FloatTensor out;
  // The element count, bounded so that the product cannot overflow (any real request is far
  // below 2^53 elements; the server's limits are lower still).
  double elements = 1;
  for (size_t i = 0; i < shape->numbers().size(); ++i) {
    const double d = shape->numbers()[i];
    const std::string dim = absl::StrCat(field, ".shape[", i, "]");
    if (d != std::floor(d) || d < 1 || d > 0x1p40) {
      return Invalid(dim, absl::StrCat("expected a positive integer, got ", d));
    }
    elements *= d;
    if (elements > 0x1p53) return Invalid(Member(field, "shape"), "more than 2^53 elements");
    out.shape.push_back(static_cast<int64_t>(d));
  }
  absl::StatusOr<std::vector<float>> floats = Floats(*values, Member(field, "values"));
  if (!floats.ok()) return floats.status();
  if (static_cast<double>(floats->size()) != elements) {
    return Invalid(field, absl::StrCat("shape [", absl::StrJoin(out.shape, ", "), "] holds ",
                                       static_cast<int64_t>(elements), " values; 'values' has ",
                                       floats->size()));
  }
  out.values = *std::move(floats);
  return out;
}

absl::StatusOr<AttendInput> AttendInputFromJson(absl::string_view text) {
  absl::StatusOr<Value> root = Document(text);
  if (!root.ok()) return root.status();
  if (absl::Status s = OnlyMembers(*root, "", {"q", "k", "v", "mask", "scale"}); !s.ok()) return s;
  AttendInput input;
  for (auto [name, target] : {std::pair{"q", &input.q}, {"k", &input.k}, {"v", &input.v}}) {
    absl::StatusOr<FloatTensor> t = RequiredTensor(*root, name);
    if (!t.ok()) return t.status();
    *target = *std::move(t);
  }
  if (const Value* mask = root->Find("mask")) {
    if (absl::Status s = ReadMask(*mask, &input.mask); !s.ok()) return s;
  }
  if (const Value* scale = root->Find("scale")) {
    if (absl::Status s = ReadScale(*scale, &input.scale); !s.ok()) return s;
  }
  return input;
}

absl::StatusOr<MultiHeadInput> MultiHeadInputFromJson(absl::string_view text) {
  absl::StatusOr<Value> root = Document(text);
  if (!root.ok()) return root.status();
  if (absl::Status s = OnlyMembers(
          *root, "", {"x", "wq", "wk", "wv", "wo", "n_head", "n_head_kv", "mask", "scale"});
      !s.ok()) {
    return s;
  }
  MultiHeadInput input;
  for (auto [name, target] :
       {std::pair{"x", &input.x}, {"wq", &input.wq}, {"wk", &input.wk}, {"wv", &input.wv}}) {
    absl::StatusOr<FloatTensor> t = RequiredTensor(*root, name);
    if (!t.ok()) return t.status();
    *target = *std::move(t);
  }
  if (const Value* wo = root->Find("wo")) {
    absl::StatusOr<FloatTensor> t = TensorFromJson(*wo, "wo");
    if (!t.ok()) return t.status();
    input.wo = *std::move(t);
  }
  const Value* n_head = root->Find("n_head");
  if (n_head == nullptr) return Invalid("n_head", "missing (the number of query heads)");
  for (auto [name, value, target] :
       {std::tuple{"n_head", n_head, &input.n_head},
        std::tuple{"n_head_kv", root->Find("n_head_kv"), &input.n_head_kv}}) {
    if (value == nullptr) continue;
    absl::StatusOr<int64_t> n = Integer(*value, name);
    if (!n.ok()) return n.status();
    if (*n > std::numeric_limits<int32_t>::max()) return Invalid(name, "too large");
    *target = static_cast<int32_t>(*n);
  }
  if (const Value* mask = root->Find("mask")) {
    if (absl::Status s = ReadMask(*mask, &input.mask); !s.ok()) return s;
  }
  if (const Value* scale = root->Find("scale")) {
    if (absl::Status s = ReadScale(*scale, &input.scale); !s.ok()) return s;
  }
  return input;
}

}  // namespace attend::client
