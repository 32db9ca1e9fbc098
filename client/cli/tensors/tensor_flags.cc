#include "client/cli/tensors/tensor_flags.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attend::cli {

absl::StatusOr<v1::Precision> ParsePrecision(const std::string& p) {
  if (p.empty()) return v1::PRECISION_UNSPECIFIED;
  if (p == "f32" || p == "float32") return v1::PRECISION_FLOAT32;
  if (p == "bf16" || p == "bfloat16") return v1::PRECISION_BFLOAT16;
  return absl::InvalidArgumentError(absl::StrCat("--precision: '", p, "'; use f32 or bf16"));
}

void DeclarePrecision(Flags& f, std::string* precision) {
  f.Add("precision", precision, "f32 or bf16 products").Shown("f32 (bf16 when inputs are bf16)");
}

void DeclareWire(Flags& f, std::string* wire) {
  f.Add("wire", wire, "how tensors travel: f32, bf16, f16 or values");
}

client::FloatTensor RandomTensor(std::mt19937_64& rng, std::vector<int64_t> shape, float stddev) {
  client::FloatTensor t;
  t.shape = std::move(shape);
  std::normal_distribution<float> normal(0.0f, stddev);
  t.values.resize(static_cast<size_t>(t.size()));
  for (float& x : t.values) x = normal(rng);
  return t;
}

}  // namespace attend::cli
