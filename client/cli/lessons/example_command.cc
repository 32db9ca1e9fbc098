#include "client/cli/lessons/example_command.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/args.h"
#include "client/cli/render/attention_heatmap.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace examples {

std::string JsonObject::Render() const {
  std::vector<std::string> parts;
  parts.reserve(members_.size());
  for (const auto& [key, value] : members_) parts.push_back(JsonString(key) + ": " + value);
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

namespace {

// The shortest "%.<p>g" of `value` that `parse` reads back as `value`, made to look like
// Java's and Python's repr: a point and a digit after it unless there is an exponent.
template <typename T>
std::string Shortest(T value, int max_digits, T (*parse)(const char*)) {
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (std::isnan(value)) return "NaN";
  std::string s;
  for (int p = 1; p <= max_digits; ++p) {
    s = absl::StrFormat("%.*g", p, static_cast<double>(value));
    if (parse(s.c_str()) == value) break;
  }
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

float ParseFloat(const char* s) { return std::strtof(s, nullptr); }
double ParseDouble(const char* s) { return std::strtod(s, nullptr); }

}  // namespace

std::string JavaFloat(float value) { return Shortest<float>(value, 9, &ParseFloat); }
std::string JavaDouble(double value) { return Shortest<double>(value, 17, &ParseDouble); }

std::string JavaFloats(absl::Span<const float> values) {
  std::vector<std::string> parts;
  for (float v : values) parts.push_back(JavaFloat(v));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string JavaDoubles(absl::Span<const double> values) {
  std::vector<std::string> parts;
  for (double v : values) parts.push_back(JavaDouble(v));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string PyRounded(absl::Span<const double> values, int decimals) {
  std::vector<std::string> parts;
  const double factor = std::pow(10.0, decimals);
  // Python rounds the binary value half to even; at two decimals of these numbers that is the
  // same as rounding half away from zero.
  for (double v : values) parts.push_back(JavaDouble(std::round(v * factor) / factor));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::vector<float> Row(const client::FloatTensor& t, int64_t row) {
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  const int64_t width = rows > 0 ? t.size() / rows : 0;
  return {t.values.begin() + row * width, t.values.begin() + (row + 1) * width};
}

absl::Status Returned(const std::optional<client::FloatTensor>& tensor, const char* what) {
  if (tensor) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("the server's response has no ", what));
}

std::string JsonExact(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.17g", value) : "null";
}

std::string JsonOptionalTensor(const std::optional<client::FloatTensor>& t) {
  return t ? JsonTensor(*t) : "null";
}

}  // namespace examples

namespace {

std::vector<examples::Example> AllExamples() {
  std::vector<examples::Example> all = examples::Lesson000Examples();
  for (auto* more : {&examples::Lesson003Examples, &examples::Lesson003LayerExamples}) {
    for (examples::Example& e : more()) all.push_back(std::move(e));
  }
  return all;
}

int RunList(Context& c, const std::vector<examples::Example>& all) {
  if (c.json) {
    std::vector<std::string> items;
    for (const examples::Example& e : all) {
      items.push_back(examples::JsonObject()
                          .Add("name", JsonString(e.name))
                          .Add("lesson", JsonString(e.lesson))
                          .Add("summary", JsonString(e.summary))
                          .Render());
    }
    *c.out << "{\"examples\": [" << absl::StrJoin(items, ", ") << "]}\n";
    return kExitOk;
  }
  // Left-aligned columns: the lesson column is words, which Table would right-align as numbers.
  size_t name_width = 7, lesson_width = 6;
  for (const examples::Example& e : all) {
    name_width = std::max(name_width, e.name.size());
    lesson_width = std::max(lesson_width, e.lesson.size());
  }
  *c.out << PadRight("example", name_width + 2) << PadRight("lesson", lesson_width + 2)
         << "summary\n";
  for (const examples::Example& e : all) {
    *c.out << PadRight(e.name, name_width + 2) << PadRight(e.lesson, lesson_width + 2) << e.summary
           << "\n";
  }
  return kExitOk;
}

// Draws the example's weights to --heatmap, masked cells hatched.
int WriteHeatmap(Context& c, const HeatmapFlags& heatmap, const examples::Example& e,
                 const examples::Weights& w) {
  AttentionPicture picture;
  picture.title = absl::StrCat("attention weights: ", e.lesson, " (attend example ", e.name, ")");
  picture.mask = w.mask;
  picture.key_labels = w.key_labels;
  picture.query_labels = w.query_labels;
  return WriteAttentionHeatmap(c, heatmap, w.weights, std::move(picture));
}

struct ExampleOptions {
  HeatmapFlags heatmap;

  void Declare(Flags& f) {
    f.Add("heatmap", &heatmap.path,
          "write the example's attention weights as an SVG heatmap to this file");
    heatmap.DeclareScale(f);
  }
};

int RunExample(Context& c, const ExampleOptions& o) {
  const std::vector<examples::Example> all = AllExamples();
  const std::vector<std::string>& positional = c.positional;
  if (positional.size() != 1) {
    return UsageError(
        c, absl::InvalidArgumentError("give one example name, or 'list' (attend example list)"));
  }
  if (positional[0] == "list") return RunList(c, all);
  const examples::Example* example = nullptr;
  std::vector<std::string> names = {"list"};
  for (const examples::Example& e : all) {
    names.push_back(e.name);
    if (e.name == positional[0]) example = &e;
  }
  if (example == nullptr) {
    const std::string guess = DidYouMeanSuffix(positional[0], names);
    return UsageError(
        c, absl::InvalidArgumentError(absl::StrCat(
               "'", positional[0], "' is not an example",
               guess.empty() ? absl::StrCat("; one of: ", absl::StrJoin(names, ", ")) : guess)));
  }
  if (absl::Status s = o.heatmap.Check(); !s.ok()) return UsageError(c, s);
  client::AttentionClient attention(c.Channel(), c.connection);
  client::PlannerClient planner(c.Channel(), c.connection);
  absl::StatusOr<examples::Result> r = example->run({attention, planner});
  if (!r.ok()) return ReportError(c, r.status());
  if (o.heatmap.path && !r->weights) {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "example '", example->name, "' has no attention weights to draw")));
  }
  if (c.json) {
    examples::JsonObject json;
    json.Add("example", JsonString(example->name)).Add("lesson", JsonString(example->lesson));
    *c.out << json.Append(r->json).Render() << "\n";
  } else {
    *c.out << r->text;
  }
  if (o.heatmap.path) return WriteHeatmap(c, o.heatmap, *example, *r->weights);
  return kExitOk;
}

}  // namespace

std::vector<Command> ExampleCommands() {
  std::vector<std::string> names = {"list"};
  for (const examples::Example& e : AllExamples()) names.push_back(e.name);
  Command example{
      "example",
      "the lessons' worked examples, run on the server and printed as the lessons print them",
      "attend example list | attend example <name> [--heatmap=w.svg]",
      "`attend example list` names every example with its lesson. `attend example <name>`\n"
      "runs it through the server and prints the lesson's numbers in the lesson's layout;\n"
      "--json prints the computed numbers instead, --heatmap draws the attention weights.\n"
      "Examples:\n  attend example list\n  attend example qkv\n"
      "  attend example full-attention --heatmap full.svg\n  attend --json example cost\n"};
  example.define = Define(RunExample);
  example.max_positional = 1;
  example.positional_words = std::move(names);
  return {example};
}

}  // namespace attend::cli
