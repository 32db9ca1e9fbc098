#include "client/cli/commands/lesson_flags.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace {

// The size --<flag> when in [min, 2^20].
absl::StatusOr<int32_t> SizeFlag(const std::string& flag, int64_t value, int64_t min) {
  if (value < min || value > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be between ", min, " and 2^20"));
  }
  return static_cast<int32_t>(value);
}

void PrintTable(std::ostream& out, const client::FloatTensor& t, int64_t head) {
  const int64_t n_q = t.shape[1], n_kv = t.shape[2];
  std::vector<std::string> header = {"q\\k"};
  for (int64_t j = 0; j < n_kv; ++j) header.push_back(absl::StrCat(j));
  Table table(header);
  for (int64_t i = 0; i < n_q; ++i) {
    std::vector<std::string> row = {absl::StrCat(i)};
    for (int64_t j = 0; j < n_kv; ++j) {
      const float v = t.values[static_cast<size_t>((head * n_q + i) * n_kv + j)];
      row.push_back(std::isinf(v) ? (v < 0 ? "-inf" : "inf") : Fixed(v, 3));
    }
    table.AddRow(row);
  }
  out << table.Render();
}

}  // namespace

void LessonFlags::Declare(Flags& f) {
  f.Add("java_seed", &java_seed,
        "draw x, Wq, Wk, Wv (and Wo) on the server with java.util.Random(S), as the lessons' "
        "programs do (not --seed's generator)");
  f.Add("std", &std, "standard deviation of the --java_seed draws").Shown("0.5");
}

absl::StatusOr<v1::LessonInit> LessonInitFromFlags(const LessonFlags& lesson,
                                                   const LayerSizes& sizes) {
  v1::LessonInit init;
  init.set_seed(*lesson.java_seed);
  if (lesson.std) {
    if (!std::isfinite(*lesson.std) || *lesson.std <= 0) {
      return absl::InvalidArgumentError("--std must be finite and > 0");
    }
    init.set_stddev(*lesson.std);
  }
  absl::StatusOr<int32_t> n = SizeFlag("n", sizes.n, 1);
  absl::StatusOr<int32_t> d_model = SizeFlag("d_model", sizes.d_model, 1);
  absl::StatusOr<int32_t> head_dim = SizeFlag("head_dim", sizes.head_dim.value_or(0), 0);
  absl::StatusOr<int32_t> d_out = SizeFlag("d_out", sizes.d_out.value_or(sizes.d_model), 0);
  for (const auto* s : {&n, &d_model, &head_dim, &d_out}) {
    if (!s->ok()) return s->status();
  }
  init.set_n(*n);
  init.set_d_model(*d_model);
  init.set_head_dim(*head_dim);  // 0: the server's d_model / n_head
  init.set_with_wo(*d_out > 0);
  if (*d_out > 0) init.set_d_out(*d_out);
  return init;
}

absl::StatusOr<client::MultiHeadInput> LessonMultiHeadInput(const LessonFlags& lesson,
                                                            const LayerSizes& sizes) {
  absl::StatusOr<v1::LessonInit> init = LessonInitFromFlags(lesson, sizes);
  if (!init.ok()) return init.status();
  absl::StatusOr<int32_t> n_head = SizeFlag("n_head", sizes.n_head, 1);
  if (!n_head.ok()) return n_head.status();
  absl::StatusOr<int32_t> n_head_kv = SizeFlag("n_head_kv", sizes.n_head_kv.value_or(*n_head), 1);
  if (!n_head_kv.ok()) return n_head_kv.status();
  client::MultiHeadInput input;
  input.init = *std::move(init);
  input.n_head = *n_head;
  input.n_head_kv = *n_head_kv;
  return input;
}

void PrintMultiHead(std::ostream& out, const client::MultiHeadOutput& r, bool weights) {
  out << "output " << ShapeString(r.output.shape) << ":\n";
  PrintHeadRows(out, r.output, "token");
  for (auto [name, t] : {std::pair{"q", &r.q}, {"k", &r.k}, {"v", &r.v}}) {
    if (!*t) continue;
    out << name << " " << ShapeString((*t)->shape) << ":\n";
    PrintHeadRows(out, **t, "token");
  }
  if (r.scores && r.masked_scores) PrintScoreTables(out, *r.scores, *r.masked_scores);
  if (r.weights && weights) PrintWeights(out, *r.weights, "query", "key");
  const v1::ParameterCounts& p = r.parameters;
  out << "parameters: Wq " << p.wq() << ", Wk " << p.wk() << ", Wv " << p.wv() << ", Wo " << p.wo()
      << ", total " << p.total() << " (key/value " << p.kv() << "); head_dim " << r.head_dim
      << "\n";
  PrintStats(out, r.stats);
}

std::string TensorMembersJson(
    const std::vector<std::pair<const char*, const std::optional<client::FloatTensor>*>>& tensors) {
  std::string json;
  for (const auto& [name, t] : tensors) {
    if (*t) absl::StrAppend(&json, ", \"", name, "\": ", JsonTensor(**t));
  }
  return json;
}

std::string MultiHeadJson(const client::MultiHeadOutput& r) {
  std::string json = absl::StrCat("{\"output\": ", JsonTensor(r.output));
  absl::StrAppend(&json, TensorMembersJson({{"weights", &r.weights},
                                            {"q", &r.q},
                                            {"k", &r.k},
                                            {"v", &r.v},
                                            {"scores", &r.scores},
                                            {"masked_scores", &r.masked_scores}}));
  absl::StrAppend(&json, ", \"parameters\": ", ToJson(r.parameters),
                  ", \"stats\": ", ToJson(r.stats), "}\n");
  return json;
}

void PrintScoreTables(std::ostream& out, const client::FloatTensor& scores,
                      const client::FloatTensor& masked) {
  if (scores.shape.size() != 3 || masked.shape != scores.shape) return;
  for (int64_t h = 0; h < scores.shape[0]; ++h) {
    out << "scores, head " << h << " (scale * q.k; row = query, column = key):\n";
    PrintTable(out, scores, h);
    out << "masked scores, head " << h << ":\n";
    PrintTable(out, masked, h);
  }
}

}  // namespace attend::cli
