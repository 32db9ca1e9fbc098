// Typed access to the keys of one Hugging Face config.json object, shared by the importer's
// parts (hf_config.cc, hf_layers.cc). Errors are INVALID_ARGUMENT and name the key after the
// reader's prefix ("text_config." for a multimodal config's text model).
//
// Thread-safety: a reader is immutable; it refers to a json::Value that must outlive it.
#ifndef ATTEND_PLANNER_IMPORT_HF_CONFIG_READER_H_
#define ATTEND_PLANNER_IMPORT_HF_CONFIG_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "core/base/status_macros.h"

namespace attend::planner {

// Typed access to the keys of one config object, with errors naming the key (after `prefix`,
// "text_config." for a multimodal config's text model).
class ConfigReader {
 public:
  ConfigReader(const json::Value& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  std::string Field(absl::string_view key) const { return absl::StrCat(prefix_, key); }

  // Absent and null both mean "not given".
  const json::Value* Get(absl::string_view key) const {
    const json::Value* v = object_.Find(key);
    return v == nullptr || v->is_null() ? nullptr : v;
  }

  absl::StatusOr<std::optional<int64_t>> Int(absl::string_view key, int64_t lo, int64_t hi) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<int64_t>();
    ATTEND_ASSIGN_OR_RETURN(const int64_t value, json::AsInt64(*v, Field(key)));
    if (value < lo || value > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": ", value, "; must be in [", lo, ", ", hi, "]"));
    }
    return std::optional<int64_t>(value);
  }

  absl::StatusOr<int64_t> RequiredInt(absl::string_view key, int64_t lo, int64_t hi) const {
    ATTEND_ASSIGN_OR_RETURN(std::optional<int64_t> value, Int(key, lo, hi));
    if (!value) return absl::InvalidArgumentError(absl::StrCat(Field(key), " is missing"));
    return *value;
  }

  absl::StatusOr<std::optional<bool>> Bool(absl::string_view key) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<bool>();
    if (!v->is_bool()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": expected a boolean, got ", v->type_name()));
    }
    return std::optional<bool>(v->bool_value());
  }

  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const json::Value* v = Get(key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(key), ": expected a string, got ", v->type_name()));
    }
    return std::optional<std::string>(v->string_value());
  }

 private:
  const json::Value& object_;
  std::string prefix_;
};

// `key` when the config gives it, else `alias` when that is given, else `key` (so that an error
// about a missing value names the current spelling).
inline std::string KeyOrAlias(const ConfigReader& r, absl::string_view key,
                              absl::string_view alias) {
  if (r.Get(key) == nullptr && r.Get(alias) != nullptr) return std::string(alias);
  return std::string(key);
}

}  // namespace attend::planner

#endif  // ATTEND_PLANNER_IMPORT_HF_CONFIG_READER_H_
