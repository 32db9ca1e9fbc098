// The Planner commands: `models`, `model`, `plan` and `cost`. Every number printed comes from the
// server (the planner's source of truth); the CLI only formats it, and for --plot asks the server
// for the points of each curve.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/cli/svg_chart.h"
#include "client/planner_client.h"

namespace attend::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "8.03B", "19.4M".
std::string Parameters(int64_t n) {
  if (n <= 0) return "unknown";
  const double v = static_cast<double>(n);
  if (v >= 1e9) return absl::StrFormat("%.3gB", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.3gM", v / 1e6);
  return Count(n);
}

// A kv-dtype flag value: the short names of the issue (f16, bf16, f32, fp8, int8, q8_0, q4_0)
// and the planner's long ones.
absl::StatusOr<v1::KvDType> ParseKvDType(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty() || t == "f16" || t == "fp16" || t == "float16" || t == "half") {
    return v1::KV_FLOAT16;
  }
  if (t == "bf16" || t == "bfloat16") return v1::KV_BFLOAT16;
  if (t == "f32" || t == "fp32" || t == "float32") return v1::KV_FLOAT32;
  if (t == "fp8" || t == "f8" || t == "float8") return v1::KV_FP8;
  if (t == "int8" || t == "i8") return v1::KV_INT8;
  if (t == "q8_0" || t == "q8") return v1::KV_Q8_0;
  if (t == "q4_0" || t == "q4") return v1::KV_Q4_0;
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv_dtype: '", text, "' is not a KV type; use f16, bf16, f32, fp8, int8, q8_0 or q4_0"));
}

std::string KvDTypeName(v1::KvDType dtype) {
  switch (dtype) {
    case v1::KV_FLOAT32:
      return "float32";
    case v1::KV_BFLOAT16:
      return "bfloat16";
    case v1::KV_FP8:
      return "fp8";
    case v1::KV_INT8:
      return "int8";
    case v1::KV_Q8_0:
      return "q8_0";
    case v1::KV_Q4_0:
      return "q4_0";
    default:
      return "float16";
  }
}

// A count flag that may be written in scientific notation ("8e9"), rounded to a whole number.
absl::StatusOr<int64_t> ParseCount(const Args& args, const std::string& flag) {
  const std::string text = args.GetString(flag);
  double value;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value) || value < 0 || value >= 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " needs a non-negative count such as 8030261248 or 8e9, got '", text, "'"));
  }
  return static_cast<int64_t>(std::llround(value));
}

absl::StatusOr<double> ParseRate(const Args& args, const std::string& flag) {
  const std::string text = args.GetString(flag);
  double value;
  if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " needs a number such as 989.5e12, got '", text, "'"));
  }
  return value;
}

// Reads at most `max_bytes` of `path`, in chunks so that a small file costs little memory;
// *truncated says whether the file holds more.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, int64_t max_bytes,
                                           bool* truncated) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::string data;
  char chunk[1 << 16];
  while (static_cast<int64_t>(data.size()) < max_bytes && in) {
    const int64_t want =
        std::min<int64_t>(sizeof(chunk), max_bytes - static_cast<int64_t>(data.size()));
    in.read(chunk, want);
    data.append(chunk, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  *truncated = in && in.peek() != std::ifstream::traits_type::eof();
  return data;
}

// The model a planner command is about: a catalog name (the positional argument), or a model
// imported through the server from --config / --gguf (the positional argument then names it).
// Returns kExitOk and fills *ref, or prints the error and returns the exit code.
int ResolveModel(Context& c, const client::PlannerClient& planner, v1::ModelRef* ref) {
  const std::vector<std::string>& positional = c.args.positional();
  if (positional.size() > 1) {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "one model at a time; got '", absl::StrJoin(positional, "' '"), "'")));
  }
  const bool config = c.args.Has("config"), gguf = c.args.Has("gguf");
  if (config && gguf) {
    return UsageError(c, absl::InvalidArgumentError("give --config or --gguf, not both"));
  }
  const std::string name = positional.empty() ? "" : positional[0];
  if (!config && !gguf) {
    if (name.empty()) {
      return UsageError(
          c, absl::InvalidArgumentError("give a model: a preset name (see 'attend models'), or "
                                        "--config config.json, or --gguf model.gguf"));
    }
    ref->set_name(name);
    return kExitOk;
  }
  // GGUF metadata (vocabulary included) is at most a few tens of MiB; the tensors after it are
  // not needed, so only the start of the file travels.
  const int64_t max_bytes = std::max<int64_t>(
      1, std::min<int64_t>(int64_t{64} << 20, c.connection.max_message_bytes - (int64_t{4} << 10)));
  const std::string path = c.args.GetString(config ? "config" : "gguf");
  bool truncated = false;
  absl::StatusOr<std::string> data = ReadFilePrefix(path, max_bytes, &truncated);
  if (!data.ok()) return LocalError(c, data.status());
  absl::StatusOr<v1::ModelSpec> spec =
      config ? planner.ImportHfConfig(*data, name) : planner.ImportGguf(*data, name);
  if (!spec.ok()) {
    if (truncated) {
      *c.err << "note: sent the first " << Count(max_bytes) << " bytes of '" << path
             << "' (--max_message_bytes bounds it)\n";
    }
    return ReportError(c, spec.status());
  }
  *ref->mutable_spec() = *std::move(spec);
  return kExitOk;
}

// "4,096" when every layer slides with that window, "4,096 on 21/42" when some do, "-" when
// none does.
std::string WindowSummary(const v1::ModelSpec& m) {
  std::set<int64_t> windows;
  int windowed = 0;
  for (const v1::LayerSpec& l : m.layer_specs()) {
    if (l.window_tokens() > 0) {
      windows.insert(l.window_tokens());
      ++windowed;
    }
  }
  if (windowed == 0) return "-";
  std::vector<std::string> sizes;
  for (int64_t w : windows) sizes.push_back(Count(w));
  const std::string joined = absl::StrJoin(sizes, "/");
  if (windowed == m.layers()) return joined;
  return absl::StrCat(joined, " on ", windowed, "/", m.layers());
}

// Layer indices as "0, 2, 4, ..., 40" (all of them when there are few).
std::string LayerList(const std::vector<int>& layers) {
  if (layers.size() <= 8) return absl::StrJoin(layers, ", ");
  return absl::StrCat(layers[0], ", ", layers[1], ", ", layers[2], ", ..., ", layers.back());
}

// The distinct per-layer shapes of a model, one line each.
std::vector<std::string> LayerGroups(const v1::ModelSpec& m) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::vector<int>>> groups;
  for (int i = 0; i < m.layer_specs_size(); ++i) {
    const std::pair<int64_t, int64_t> key{m.layer_specs(i).n_head_kv(),
                                          m.layer_specs(i).window_tokens()};
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  std::vector<std::string> lines;
  for (const auto& [key, layers] : groups) {
    lines.push_back(absl::StrCat(
        Plural(static_cast<int64_t>(layers.size()), "layer", "layers"), " (", LayerList(layers),
        "): ", Plural(key.first, "key/value head", "key/value heads"), ", ",
        key.second > 0 ? absl::StrCat("sliding window of ", Count(key.second), " tokens")
                       : "full attention"));
  }
  return lines;
}

// The variant's name; grouped-query says how many query heads share a key/value head.
std::string AttentionKind(int64_t n_head, int64_t n_head_kv) {
  const std::string variant = AttentionVariantName(n_head, n_head_kv);
  if (n_head_kv == n_head || n_head_kv == 1) return variant;
  return absl::StrCat(variant, ", ", n_head / n_head_kv, " query heads per key/value head");
}

// --- models / model ---------------------------------------------------------------------------

int PrintModelDetails(Context& c, const client::PlannerClient& planner, const v1::ModelSpec& m) {
  if (c.json) {
    *c.out << ToJson(m);
    return kExitOk;
  }
  Fields f;
  f.Add("name", m.name());
  if (!m.architecture().empty()) f.Add("architecture", m.architecture());
  f.Add("layers", Count(m.layers()));
  f.Add("query heads", Count(m.n_head()));
  f.Add("key/value heads",
        absl::StrCat(Count(m.n_head_kv()), " (", AttentionKind(m.n_head(), m.n_head_kv()), ")"));
  f.Add("head size", m.head_dim_v() == m.head_dim()
                         ? Count(m.head_dim())
                         : absl::StrCat(Count(m.head_dim()), " (keys and queries), ",
                                        Count(m.head_dim_v()), " (values)"));
  if (m.d_model() > 0) f.Add("d_model", Count(m.d_model()));
  if (m.vocab_size() > 0) f.Add("vocabulary", Count(m.vocab_size()));
  if (m.intermediate_size() > 0) f.Add("MLP width", Count(m.intermediate_size()));
  if (m.experts() > 1) {
    f.Add("experts", absl::StrCat(m.experts(), " per layer, ", m.experts_active(), " per token"));
  }
  std::string params = m.parameters() > 0 ? absl::StrCat(Count(m.parameters()), " (",
                                                         Parameters(m.parameters()), ")")
                                          : "unknown";
  if (m.active_parameters() > 0 && m.active_parameters() != m.parameters()) {
    absl::StrAppend(&params, "; ", Count(m.active_parameters()), " (",
                    Parameters(m.active_parameters()), ") active per token");
  }
  f.Add("parameters", params);
  if (!m.parameters_source().empty()) f.Add("parameter count", m.parameters_source());
  f.Add("max context", m.max_context_tokens() > 0
                           ? absl::StrCat(Count(m.max_context_tokens()), " tokens")
                           : "unknown");
  f.Add("weights", m.weights_dtype().empty() ? "unknown type" : m.weights_dtype());
  f.Add("tied embeddings", m.tied_embeddings() ? "yes" : "no");
  const std::vector<std::string> groups = LayerGroups(m);
  if (groups.empty()) {
    f.Add("attention", absl::StrCat("every layer full attention with ",
                                    Plural(m.n_head_kv(), "key/value head", "key/value heads")));
  } else {
    for (size_t i = 0; i < groups.size(); ++i) f.Add(i == 0 ? "attention" : "", groups[i]);
  }
  // What the cache costs, from the server: bytes per token do not depend on the context.
  v1::PlanKvCacheRequest request;
  *request.mutable_model()->mutable_spec() = m;
  request.set_context_tokens(m.max_context_tokens() > 0 ? 0 : 1);
  absl::StatusOr<v1::PlanKvCacheResponse> plan = planner.PlanKvCache(request);
  if (!plan.ok()) return ReportError(c, plan.status());
  std::string kv = absl::StrCat(BinaryBytes(plan->bytes_per_token()), " per token");
  if (m.max_context_tokens() > 0) {
    absl::StrAppend(&kv, ", ", BinaryBytes(plan->bytes_per_sequence()), " at ",
                    Count(m.max_context_tokens()), " tokens");
  }
  f.Add("KV cache (float16)", kv);
  f.Add("source", m.source());
  *c.out << m.display_name() << "\n" << f.Render("  ");
  return kExitOk;
}

int RunModel(Context& c) {
  client::PlannerClient planner(c.Channel(), c.connection);
  if (c.args.Has("config") || c.args.Has("gguf")) {
    v1::ModelRef ref;
    if (int code = ResolveModel(c, planner, &ref); code != kExitOk) return code;
    return PrintModelDetails(c, planner, ref.spec());
  }
  if (c.args.positional().size() != 1) {
    return UsageError(c, absl::InvalidArgumentError(
                             "give one model name (see 'attend models'), or --config / --gguf"));
  }
  absl::StatusOr<v1::ModelSpec> m = planner.GetModel(c.args.positional()[0]);
  if (!m.ok()) return ReportError(c, m.status());
  return PrintModelDetails(c, planner, *m);
}

int RunModels(Context& c) {
  if (!c.args.positional().empty() || c.args.Has("config") || c.args.Has("gguf")) {
    return RunModel(c);
  }
  client::PlannerClient planner(c.Channel(), c.connection);
  absl::StatusOr<v1::ListModelsResponse> r = planner.ListModels();
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  Table table({"name", "layers", "heads", "kv heads", "head dim", "window", "params", "max context",
               "source"});
  for (const v1::ModelSpec& m : r->models()) {
    std::string params = Parameters(m.parameters());
    if (m.active_parameters() > 0 && m.active_parameters() != m.parameters()) {
      absl::StrAppend(&params, " (", Parameters(m.active_parameters()), " active)");
    }
    table.AddRow({m.name(), Count(m.layers()), Count(m.n_head()), Count(m.n_head_kv()),
                  m.head_dim_v() == m.head_dim() ? Count(m.head_dim())
                                                 : absl::StrCat(m.head_dim(), "/", m.head_dim_v()),
                  WindowSummary(m), params,
                  m.max_context_tokens() > 0 ? Count(m.max_context_tokens()) : "-",
                  Shorten(m.source(), 60)});
  }
  *c.out << table.Render()
         << "'attend model <name>' shows one in full; 'attend plan <name>' sizes its KV cache.\n";
  return kExitOk;
}

// --- plan ---------------------------------------------------------------------------------------

std::string VariantLabel(const std::string& variant) {
  if (variant == "MHA") return "multi-head (MHA)";
  if (variant == "GQA") return "grouped-query (GQA)";
  if (variant == "MQA") return "multi-query (MQA)";
  return variant;
}

// KiB per token as the lesson prints it (a whole number), with decimals only when needed.
std::string KibPerToken(int64_t bytes) {
  if (bytes % 1024 == 0) return Count(bytes / 1024);
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / 1024.0);
}

void PrintPlan(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  const v1::ModelSpec& m = p.model();
  const std::string dtype = KvDTypeName(p.kv_dtype());
  out << m.display_name() << " (" << m.name() << "): " << Plural(m.layers(), "layer", "layers")
      << ", " << Count(m.n_head()) << " query heads, "
      << Plural(m.n_head_kv(), "key/value head", "key/value heads") << ", head size "
      << m.head_dim() << (m.head_dim_v() != m.head_dim() ? absl::StrCat("/", m.head_dim_v()) : "")
      << "\n"
      << "KV cache in " << dtype << " (" << absl::StrFormat("%g", p.bytes_per_value())
      << (p.bytes_per_value() == 1.0 ? " byte" : " bytes") << " per value), "
      << Count(p.context_tokens()) << " tokens x " << Plural(p.batch(), "sequence", "sequences")
      << "\n";
  if (m.max_context_tokens() > 0 && p.context_tokens() > m.max_context_tokens()) {
    out << "note: " << m.display_name() << " accepts at most " << Count(m.max_context_tokens())
        << " tokens; " << Count(p.context_tokens()) << " is beyond it\n";
  }
  out << "\n";

  Fields f;
  f.Add("bytes per token", BytesWithCount(p.bytes_per_token()));
  if (p.full_attention_bytes_per_token() != p.bytes_per_token()) {
    f.Add("  once windows are full",
          absl::StrCat(BytesWithCount(p.full_attention_bytes_per_token()),
                       " per token (full-attention layers only)"));
  }
  f.Add(absl::StrCat("per sequence (", Count(p.context_tokens()), " tokens)"),
        BytesWithCount(p.bytes_per_sequence()));
  f.Add(absl::StrCat("total (", Plural(p.batch(), "sequence", "sequences"), ")"),
        BytesWithCount(p.total_bytes()));
  if (p.has_paged()) {
    const v1::PagedPlan& pg = p.paged();
    f.Add(absl::StrCat("paged (", Count(pg.block_tokens()), "-token blocks)"),
          absl::StrCat(BytesWithCount(pg.allocated_bytes()), " allocated, ",
                       Plural(pg.blocks_per_sequence(), "block", "blocks"), " per sequence, ",
                       BinaryBytes(pg.waste_bytes()), " unused"));
  }
  out << f.Render();

  if (p.has_budget()) {
    const v1::BudgetPlan& b = p.budget();
    out << "\nbudget " << BytesWithCount(b.budget_bytes());
    if (b.weights_bytes() > 0) {
      out << " - weights " << BinaryBytes(b.weights_bytes()) << " = "
          << BinaryBytes(b.available_bytes()) << " for the cache";
    }
    out << ": " << (b.fits() ? "fits" : "does not fit") << "\n" << Wrap(b.explanation(), 100, "  ");
    if (b.available_bytes() >= 0) {
      Fields bf;
      bf.Add(absl::StrCat("longest context, ", Plural(p.batch(), "sequence", "sequences")),
             b.context_unbounded() ? "unbounded (every layer is windowed)"
                                   : absl::StrCat(Count(b.max_context_tokens()), " tokens"));
      if (p.batch() > 1) {
        bf.Add("longest context, one sequence",
               absl::StrCat(Count(b.max_context_tokens_one_sequence()), " tokens"));
      }
      bf.Add(absl::StrCat("most sequences of ", Count(p.context_tokens()), " tokens"),
             Count(b.max_sequences()));
      out << bf.Render("  ");
    }
  }

  if (p.variants_size() > 0) {
    std::vector<std::string> header = {"variant", "kv heads", "group", "KiB/token",
                                       absl::StrCat("GiB at ", p.context_tokens(), " tokens")};
    if (p.batch() > 1) header.push_back(absl::StrCat("GiB x ", p.batch()));
    Table table(header);
    bool marked = false;
    for (const v1::VariantRow& v : p.variants()) {
      std::vector<std::string> row = {
          absl::StrCat(VariantLabel(v.variant()), v.is_model() ? " *" : ""), Count(v.n_head_kv()),
          Count(v.group_size()), KibPerToken(v.bytes_per_token()),
          absl::StrFormat("%.2f", static_cast<double>(v.bytes_per_sequence()) / kGiB)};
      if (p.batch() > 1) {
        row.push_back(absl::StrFormat(
            "%.2f", static_cast<double>(v.bytes_per_sequence()) * p.batch() / kGiB));
      }
      marked = marked || v.is_model();
      table.AddRow(std::move(row));
    }
    out << "\n" << table.Render();
    if (marked) out << "* the model's own key/value heads\n";
  }
}

// Contexts at which to sample a KV-size curve up to `max_context`: evenly spaced points plus
// every window edge. Between those the size is linear in the context, so the polyline through
// them is the exact curve.
std::vector<int64_t> KvSamples(const v1::ModelSpec& m, int64_t max_context) {
  std::set<int64_t> xs = {1, max_context};
  constexpr int kSteps = 12;
  for (int i = 1; i < kSteps; ++i) {
    xs.insert(
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(max_context) * i / kSteps)));
  }
  for (const v1::LayerSpec& l : m.layer_specs()) {
    if (l.window_tokens() > 0 && l.window_tokens() < max_context) xs.insert(l.window_tokens());
  }
  return std::vector<int64_t>(xs.begin(), xs.end());
}

// Asks the server for the KV size of each variant (or each KV type) at a series of contexts.
absl::StatusOr<LineChart> KvChart(const client::PlannerClient& planner,
                                  const v1::PlanKvCacheRequest& base,
                                  const v1::PlanKvCacheResponse& plan, bool by_dtype) {
  const v1::ModelSpec& m = plan.model();
  const std::vector<int64_t> xs = KvSamples(m, plan.context_tokens());
  LineChart chart;
  chart.title = absl::StrCat(m.display_name(), ": KV cache against context");
  chart.x_label = "context (tokens per sequence)";
  chart.y_label =
      absl::StrCat("KV cache (GiB, ", Plural(plan.batch(), "sequence", "sequences"), ")");
  v1::PlanKvCacheRequest request = base;
  request.clear_memory_budget_bytes();
  request.clear_block_tokens();
  request.set_subtract_weights(false);
  if (!by_dtype) {
    chart.subtitle = absl::StrCat(KvDTypeName(plan.kv_dtype()),
                                  " cache; one line per attention variant (same layers and heads)");
    for (const v1::VariantRow& v : plan.variants()) {
      ChartSeries s;
      s.name = absl::StrCat(v.variant(), ": ", Plural(v.n_head_kv(), "KV head", "KV heads"),
                            v.is_model() ? " (the model)" : "");
      chart.series.push_back(std::move(s));
    }
    for (int64_t x : xs) {
      request.set_context_tokens(x);
      absl::StatusOr<v1::PlanKvCacheResponse> r = planner.PlanKvCache(request);
      if (!r.ok()) return r.status();
      if (r->variants_size() != static_cast<int>(chart.series.size())) {
        return absl::InternalError("the server's variant rows changed between calls");
      }
      for (int i = 0; i < r->variants_size(); ++i) {
        chart.series[i].x.push_back(static_cast<double>(x));
        chart.series[i].y.push_back(static_cast<double>(r->variants(i).bytes_per_sequence()) *
                                    static_cast<double>(r->batch()) / kGiB);
      }
    }
  } else {
    chart.subtitle = absl::StrCat(Plural(m.n_head_kv(), "key/value head", "key/value heads"),
                                  "; one line per KV cache type");
    // bfloat16 sizes as float16 and int8 as fp8: one line each.
    const std::pair<v1::KvDType, const char*> types[] = {{v1::KV_FLOAT32, "float32"},
                                                         {v1::KV_FLOAT16, "float16 / bfloat16"},
                                                         {v1::KV_FP8, "fp8 / int8"},
                                                         {v1::KV_Q8_0, "q8_0"},
                                                         {v1::KV_Q4_0, "q4_0"}};
    for (const auto& [dtype, name] : types) {
      ChartSeries s;
      s.name = name;
      request.set_kv_dtype(dtype);
      for (int64_t x : xs) {
        request.set_context_tokens(x);
        absl::StatusOr<v1::PlanKvCacheResponse> r = planner.PlanKvCache(request);
        if (!r.ok()) return r.status();
        s.x.push_back(static_cast<double>(x));
        s.y.push_back(static_cast<double>(r->total_bytes()) / kGiB);
      }
      chart.series.push_back(std::move(s));
    }
  }
  if (plan.has_budget() && plan.budget().available_bytes() > 0) {
    ChartSeries budget;
    budget.name =
        absl::StrCat("budget: ", BinaryBytes(plan.budget().available_bytes()), " for the cache");
    budget.dashed = true;
    const double gib = static_cast<double>(plan.budget().available_bytes()) / kGiB;
    budget.x = {0.0, static_cast<double>(plan.context_tokens())};
    budget.y = {gib, gib};
    chart.series.push_back(std::move(budget));
  }
  std::set<int64_t> windows;
  for (const v1::LayerSpec& l : m.layer_specs()) {
    if (l.window_tokens() > 0 && l.window_tokens() < plan.context_tokens()) {
      windows.insert(l.window_tokens());
    }
  }
  for (int64_t w : windows) {
    chart.markers.push_back({static_cast<double>(w), absl::StrCat("window ", Count(w))});
  }
  return chart;
}

int RunPlan(Context& c) {
  v1::PlanKvCacheRequest request;
  absl::StatusOr<int64_t> context = c.args.GetInt("context", 0);
  absl::StatusOr<int64_t> batch = c.args.GetInt("batch", 0);
  absl::StatusOr<int64_t> block = c.args.GetInt("block_tokens", 0);
  for (const auto* v : {&context, &batch, &block}) {
    if (!v->ok()) return UsageError(c, v->status());
  }
  request.set_context_tokens(*context);
  request.set_batch(*batch);
  request.set_block_tokens(*block);
  absl::StatusOr<v1::KvDType> dtype = ParseKvDType(c.args.GetString("kv_dtype"));
  if (!dtype.ok()) return UsageError(c, dtype.status());
  request.set_kv_dtype(*dtype);
  if (c.args.Has("budget")) {
    absl::StatusOr<int64_t> budget = ParseByteSize(c.args.GetString("budget"), "--budget");
    if (!budget.ok()) return UsageError(c, budget.status());
    request.set_memory_budget_bytes(*budget);
  }
  request.set_subtract_weights(c.args.GetBool("subtract_weights"));
  if (c.args.Has("weights_bytes")) {
    absl::StatusOr<int64_t> w = ParseByteSize(c.args.GetString("weights_bytes"), "--weights_bytes");
    if (!w.ok()) return UsageError(c, w.status());
    request.set_weights_bytes(*w);
  }
  request.set_weights_dtype(c.args.GetString("weights_dtype"));
  const std::string plot_by = c.args.GetString("plot_by", "variant");
  if (plot_by != "variant" && plot_by != "dtype") {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "--plot_by: '", plot_by, "'; use variant (default) or dtype")));
  }
  if (c.args.Has("plot_by") && !c.args.Has("plot")) {
    return UsageError(c, absl::InvalidArgumentError("--plot_by goes with --plot <file.svg>"));
  }

  client::PlannerClient planner(c.Channel(), c.connection);
  if (int code = ResolveModel(c, planner, request.mutable_model()); code != kExitOk) return code;
  absl::StatusOr<v1::PlanKvCacheResponse> r = planner.PlanKvCache(request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
  } else {
    PrintPlan(*c.out, *r);
  }
  if (c.args.Has("plot")) {
    absl::StatusOr<LineChart> chart = KvChart(planner, request, *r, plot_by == "dtype");
    if (!chart.ok()) return ReportError(c, chart.status());
    const std::string path = c.args.GetString("plot");
    if (absl::Status s = WriteTextFile(path, RenderSvg(*chart)); !s.ok()) return LocalError(c, s);
    if (!c.json) *c.out << "\nwrote " << path << " (" << chart->series.size() << " lines)\n";
  }
  return kExitOk;
}

// --- cost ---------------------------------------------------------------------------------------

void PrintCost(std::ostream& out, const v1::EstimateCostResponse& e, bool priced) {
  const v1::ModelSpec& m = e.model();
  const v1::HardwareProfile& h = e.hardware();
  out << m.display_name() << " (" << m.name() << ") on " << (h.name().empty() ? "custom" : h.name())
      << ": prompt " << Count(e.prompt_tokens()) << " tokens, decode at "
      << Count(e.context_tokens()) << " tokens of context, "
      << Plural(e.batch(), "sequence", "sequences") << "\n"
      << "P = " << Count(e.parameters()) << " parameters (2P FLOPs per token); "
      << e.compute_dtype() << " at " << SiFine(e.peak_flops(), "FLOP/s") << ", memory "
      << SiFine(h.memory_bandwidth_bytes_per_second(), "B/s") << "\n\n";
  Table table({"phase", "attention FLOPs", "weight FLOPs", "bytes moved", "FLOP/byte", "time",
               "bound", "tokens/s", "$/Mtok"});
  for (const auto& [name, p] :
       {std::pair<const char*, const v1::PhaseCost*>{"prefill", &e.prefill()},
        {"decode", &e.decode()}}) {
    if (p->bound().empty()) {
      table.AddRow({name, "-", "-", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    table.AddRow({name, SiFine(p->attention_flops(), "FLOP"), SiFine(p->weight_flops(), "FLOP"),
                  SiFine(p->bytes_moved(), "B"), Rate(p->arithmetic_intensity()),
                  Duration(p->roofline_seconds()), p->bound(), Rate(p->tokens_per_second()),
                  priced ? absl::StrFormat("%.4g", p->usd_per_million_tokens()) : "-"});
  }
  out << table.Render();
  if (!e.prefill().bound().empty()) {
    out << "prefill: the prompt's KV cache written (" << SiFine(e.prefill().kv_bytes(), "B")
        << ") and the weights read once (" << SiFine(e.prefill().weight_bytes(), "B") << ")\n";
  }
  out << "decode: one token per sequence; the whole cache read ("
      << SiFine(e.decode().kv_bytes(), "B") << ") and the weights ("
      << SiFine(e.decode().weight_bytes(), "B") << ")\n";
  out << "crossover: ";
  if (e.prefill_crossover_tokens() > 0) {
    out << "a prompt's attention FLOPs exceed its weight FLOPs from "
        << Count(e.prefill_crossover_tokens()) << " tokens";
  } else {
    out << "a prompt's attention FLOPs never exceed its weight FLOPs (every layer windowed)";
  }
  if (e.decode_crossover_tokens() > 0) {
    out << "; a decode step's from " << Count(e.decode_crossover_tokens())
        << " tokens of context\n";
  } else {
    out << "; a decode step's never do\n";
  }
  if (!h.note().empty()) out << "hardware: " << h.note() << "\n";
}

// Picks the FLOP unit that keeps the largest value of a chart between 1 and 1000.
std::pair<double, std::string> FlopUnit(double largest) {
  const std::pair<double, const char*> units[] = {
      {1e18, "EFLOP"}, {1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}};
  for (const auto& [scale, name] : units) {
    if (largest >= scale) return {scale, name};
  }
  return {1.0, "FLOP"};
}

absl::StatusOr<LineChart> CostChart(const client::PlannerClient& planner,
                                    const v1::EstimateCostRequest& base,
                                    const v1::EstimateCostResponse& e) {
  const int64_t crossover = e.prefill_crossover_tokens();
  int64_t x_max = std::max(e.prompt_tokens(), e.context_tokens());
  if (crossover > 0) {
    x_max = std::max(x_max, static_cast<int64_t>(std::ceil(1.25 * static_cast<double>(crossover))));
  }
  constexpr int kPoints = 32;
  std::set<int64_t> xs = {1};
  for (int i = 1; i <= kPoints; ++i) {
    xs.insert(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(x_max) * i / kPoints)));
  }
  ChartSeries attention{"prefill attention", {}, {}};
  ChartSeries weights{"prefill weights (2P per token)", {}, {}};
  v1::EstimateCostRequest request = base;
  request.clear_context_tokens();
  for (int64_t x : xs) {
    request.set_prompt_tokens(x);
    absl::StatusOr<v1::EstimateCostResponse> r = planner.EstimateCost(request);
    if (!r.ok()) return r.status();
    attention.x.push_back(static_cast<double>(x));
    attention.y.push_back(r->prefill().attention_flops());
    weights.x.push_back(static_cast<double>(x));
    weights.y.push_back(r->prefill().weight_flops());
  }
  double largest = 0;
  for (const ChartSeries* s : {&attention, &weights}) {
    for (double y : s->y) largest = std::max(largest, y);
  }
  const auto [scale, unit] = FlopUnit(largest);
  for (ChartSeries* s : {&attention, &weights}) {
    for (double& y : s->y) y /= scale;
  }
  LineChart chart;
  chart.title = absl::StrCat(e.model().display_name(), ": prefill FLOPs against prompt length");
  chart.subtitle = absl::StrCat(
      Plural(e.batch(), "sequence", "sequences"), ", P = ", Count(e.parameters()),
      base.non_causal() ? ", non-causal" : "",
      crossover > 0
          ? absl::StrCat("; attention overtakes the weights at ", Count(crossover), " tokens")
          : "; attention never overtakes the weights");
  chart.x_label = "prompt (tokens)";
  chart.y_label = absl::StrCat("FLOPs (", unit, ")");
  chart.series = {std::move(attention), std::move(weights)};
  if (crossover > 0) {
    chart.markers.push_back(
        {static_cast<double>(crossover), absl::StrCat("crossover ", Count(crossover))});
  }
  if (e.prompt_tokens() > 0 && e.prompt_tokens() != crossover) {
    chart.markers.push_back({static_cast<double>(e.prompt_tokens()),
                             absl::StrCat("prompt ", Count(e.prompt_tokens()))});
  }
  return chart;
}

int RunCost(Context& c) {
  v1::EstimateCostRequest request;
  absl::StatusOr<int64_t> prompt = c.args.GetInt("prompt", 0);
  absl::StatusOr<int64_t> context = c.args.GetInt("context", 0);
  absl::StatusOr<int64_t> batch = c.args.GetInt("batch", 0);
  for (const auto* v : {&prompt, &context, &batch}) {
    if (!v->ok()) return UsageError(c, v->status());
  }
  if (!c.args.Has("prompt") && !c.args.Has("context")) {
    return UsageError(c, absl::InvalidArgumentError(
                             "give --prompt N (the prefill length) and/or --context N (the cache "
                             "length of a decode step)"));
  }
  request.set_prompt_tokens(*prompt);
  request.set_context_tokens(*context);
  request.set_batch(*batch);
  request.set_non_causal(c.args.GetBool("non_causal"));
  request.set_compute_dtype(c.args.GetString("compute_dtype"));
  request.set_weights_dtype(c.args.GetString("weights_dtype"));
  absl::StatusOr<v1::KvDType> dtype = ParseKvDType(c.args.GetString("kv_dtype"));
  if (!dtype.ok()) return UsageError(c, dtype.status());
  request.set_kv_dtype(*dtype);
  if (c.args.Has("parameters")) {
    absl::StatusOr<int64_t> p = ParseCount(c.args, "parameters");
    if (!p.ok()) return UsageError(c, p.status());
    request.set_parameters(*p);
  }
  if (c.args.Has("price")) {
    absl::StatusOr<double> price = ParseRate(c.args, "price");
    if (!price.ok()) return UsageError(c, price.status());
    request.set_price_per_hour_usd(*price);
  }
  // Any hardware figure on the command line makes a custom profile.
  const bool custom = c.args.Has("peak_flops") || c.args.Has("peak_flops_f32") ||
                      c.args.Has("peak_flops_fp8") || c.args.Has("bandwidth") ||
                      c.args.Has("memory");
  if (custom) {
    v1::HardwareProfile* h = request.mutable_custom();
    h->set_name(c.args.GetString("hardware", "custom"));
    for (const auto& [flag, setter] :
         {std::pair<const char*, void (v1::HardwareProfile::*)(double)>{
              "peak_flops", &v1::HardwareProfile::set_peak_flops_bf16},
          {"peak_flops_f32", &v1::HardwareProfile::set_peak_flops_f32},
          {"peak_flops_fp8", &v1::HardwareProfile::set_peak_flops_fp8}}) {
      if (!c.args.Has(flag)) continue;
      absl::StatusOr<double> v = ParseRate(c.args, flag);
      if (!v.ok()) return UsageError(c, v.status());
      (h->*setter)(*v);
    }
    for (const auto& [flag, setter] :
         {std::pair<const char*, void (v1::HardwareProfile::*)(double)>{
              "bandwidth", &v1::HardwareProfile::set_memory_bandwidth_bytes_per_second},
          {"memory", &v1::HardwareProfile::set_memory_bytes}}) {
      if (!c.args.Has(flag)) continue;
      absl::StatusOr<int64_t> v = ParseByteSize(c.args.GetString(flag), absl::StrCat("--", flag));
      if (!v.ok()) return UsageError(c, v.status());
      (h->*setter)(static_cast<double>(*v));
    }
  } else {
    request.set_profile(c.args.GetString("hardware", "h100"));
  }

  client::PlannerClient planner(c.Channel(), c.connection);
  if (int code = ResolveModel(c, planner, request.mutable_model()); code != kExitOk) return code;
  absl::StatusOr<v1::EstimateCostResponse> r = planner.EstimateCost(request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
  } else {
    PrintCost(*c.out, *r, request.price_per_hour_usd() > 0);
  }
  if (c.args.Has("plot")) {
    absl::StatusOr<LineChart> chart = CostChart(planner, request, *r);
    if (!chart.ok()) return ReportError(c, chart.status());
    const std::string path = c.args.GetString("plot");
    if (absl::Status s = WriteTextFile(path, RenderSvg(*chart)); !s.ok()) return LocalError(c, s);
    if (!c.json) *c.out << "\nwrote " << path << "\n";
  }
  return kExitOk;
}

std::vector<FlagSpec> ModelSourceFlags() {
  return {
      {"config", "a Hugging Face config.json to import (instead of a preset)"},
      {"gguf", "a GGUF file to import (its header is read; instead of a preset)"},
  };
}

}  // namespace

std::vector<Command> PlannerCommands() {
  std::vector<Command> commands;
  commands.push_back(
      {"models", "list the model presets, or show one ('attend models <name>')",
       "attend models [<name>] [--json]",
       "Presets of published configurations; each names its source. With a name, the same as\n"
       "'attend model <name>'.\n"
       "Examples:\n  attend models\n  attend models llama-3-8b\n  attend --json models\n",
       ModelSourceFlags(), RunModels});
  commands.push_back(
      {"model", "show one model preset (or an imported config.json / GGUF) in full",
       "attend model <name> | attend model --config config.json | --gguf model.gguf [<name>]",
       "Shape, parameter count and its source, per-layer attention (sliding windows) and the KV\n"
       "cache per token.\n"
       "Examples:\n  attend model llama-3-70b\n  attend model gemma-2-9b\n"
       "  attend model --config ~/models/Llama-3-8B/config.json\n",
       ModelSourceFlags(), RunModel});
  std::vector<FlagSpec> plan_flags = {
      {"context", "tokens per sequence", false, "the model's max context"},
      {"batch", "concurrent sequences", false, "1"},
      {"kv_dtype", "f16, bf16, f32, fp8, int8, q8_0 or q4_0", false, "f16"},
      {"block_tokens", "paged allocation block size (0 = no paging)", false, "0"},
      {"budget", "memory for the cache, e.g. 80GiB, 80GB, 512MiB, 1e9"},
      {"subtract_weights", "take the weights out of the budget first", true},
      {"weights_dtype", "type of the weights to subtract", false, "the model's"},
      {"weights_bytes", "bytes of weights to subtract (instead of parameters x type)"},
      {"plot", "also write an SVG of KV-cache size against context to this file"},
      {"plot_by", "one line per 'variant' (MHA/GQA/MQA) or per KV 'dtype'", false, "variant"},
  };
  for (FlagSpec& f : ModelSourceFlags()) plan_flags.push_back(f);
  commands.push_back(
      {"plan", "KV-cache size of a model: per token, per sequence, batch, budget, MHA/GQA/MQA",
       "attend plan <model> [--context N] [--batch B] [--kv_dtype fp8] [--budget 80GiB] "
       "[--plot kv.svg]",
       "Sizes in binary units (GiB = 2^30 bytes). With --budget, says whether the batch fits,\n"
       "the longest context and the most sequences that do. Sliding-window layers stop growing\n"
       "at their window.\n"
       "Examples:\n  attend plan llama-3-8b --context 8192\n"
       "  attend plan llama-3-70b --context 32768 --batch 16 --kv_dtype fp8 --budget 80GiB\n"
       "  attend plan llama-3-8b --budget 80GB --subtract_weights --block_tokens 16\n"
       "  attend plan mistral-7b --plot kv.svg\n"
       "  attend plan --config config.json --context 32768 --plot kv.svg --plot_by dtype\n",
       plan_flags, RunPlan});
  std::vector<FlagSpec> cost_flags = {
      {"prompt", "prefill length in tokens"},
      {"context", "cache length of a decode step", false, "--prompt"},
      {"batch", "sequences", false, "1"},
      {"hardware", "h100, h200, a100, cpu-socket or local (this server, measured)", false, "h100"},
      {"price", "price per hour in USD, for $ per million tokens"},
      {"compute_dtype", "bfloat16, float32 or fp8", false, "bfloat16"},
      {"kv_dtype", "f16, bf16, f32, fp8, int8, q8_0 or q4_0", false, "f16"},
      {"weights_dtype", "type of the weights read", false, "the model's"},
      {"parameters", "P for weight FLOPs, e.g. 8e9", false, "the model's active parameters"},
      {"non_causal", "count n^2 prefill pairs instead of n(n+1)/2", true},
      {"peak_flops", "custom hardware: bf16/f16 peak FLOP/s, e.g. 989.5e12"},
      {"peak_flops_f32", "custom hardware: f32 peak FLOP/s"},
      {"peak_flops_fp8", "custom hardware: fp8/int8 peak FLOP/s"},
      {"bandwidth", "custom hardware: memory bytes per second, e.g. 3.35e12 or 3.35TB"},
      {"memory", "custom hardware: memory capacity, e.g. 80GiB"},
      {"plot", "also write an SVG of prefill FLOPs against prompt length to this file"},
  };
  for (FlagSpec& f : ModelSourceFlags()) cost_flags.push_back(f);
  commands.push_back(
      {"cost", "prefill and decode FLOPs, bytes, roofline time and the attention crossover",
       "attend cost <model> --prompt N [--context N] [--batch B] [--hardware h100] [--price 2.5]",
       "FLOPs count 2 x (head_dim + head_dim_v) per attention pair and head, and 2P per token\n"
       "for the weights; time is the roofline max(FLOPs / peak, bytes / bandwidth).\n"
       "Any of --peak_flops, --bandwidth, ... makes a custom profile (named by --hardware).\n"
       "Examples:\n  attend cost llama-3-8b --prompt 8192 --hardware h100\n"
       "  attend cost llama-3-8b --prompt 8192 --parameters 8e9 --plot cost.svg\n"
       "  attend cost llama-3-70b --prompt 2048 --context 32768 --batch 32 --price 2.5\n"
       "  attend cost llama-3-8b --prompt 1024 --hardware local\n"
       "  attend cost llama-3-8b --prompt 1024 --peak_flops 100e12 --bandwidth 1TB\n",
       cost_flags, RunCost});
  return commands;
}

}  // namespace attend::cli
