// `attend plan`: the KV cache of a model, per token, per sequence, for a batch and against a
// memory budget, by attention variant, and with --plot its size against the context.
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands/plan_layers.h"
#include "client/cli/commands/planner_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/render/svg_chart.h"
#include "client/output_file.h"
#include "common/byte_size.h"

namespace attend::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

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

// The model's shape, the cache's type and size, and a note when the context is beyond the model.
void PrintPlanHeadline(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  const v1::ModelSpec& m = p.model();
  const std::string dtype = KvDTypeName(p.kv_dtype());
  out << m.display_name() << " (" << m.name() << "): " << Plural(m.layers(), "layer", "layers");
  if (m.n_head() > 0) {
    out << ", " << Count(m.n_head()) << " query heads, "
        << Plural(m.n_head_kv(), "key/value head", "key/value heads") << ", head size "
        << m.head_dim()
        << (m.head_dim_v() != m.head_dim() ? absl::StrCat("/", m.head_dim_v()) : "");
  } else {
    out << ", no attention";
  }
  out << "\n"
      << "KV cache in " << dtype << " (" << absl::StrFormat("%g", p.bytes_per_value())
      << (p.bytes_per_value() == 1.0 ? " byte" : " bytes") << " per value), "
      << Count(p.context_tokens()) << " tokens x " << Plural(p.batch(), "sequence", "sequences")
      << "\n";
  if (m.max_context_tokens() > 0 && p.context_tokens() > m.max_context_tokens()) {
    out << "note: " << m.display_name() << " accepts at most " << Count(m.max_context_tokens())
        << " tokens; " << Count(p.context_tokens()) << " is beyond it\n";
  }
  out << "\n";
}

// The key and value halves of a size, as llama.cpp's load log splits it ("K (f16): 2.00 MiB,
// V (f16): 2.00 MiB"); they differ when the value heads are smaller than the key heads.
std::string KeysPlusValues(int64_t keys, int64_t values) {
  return absl::StrCat(BinaryBytes(keys), " + ", BinaryBytes(values));
}

// Bytes per token, per sequence and in total, each split into keys and values, and what paging
// allocates.
void PrintPlanSizes(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  constexpr char kHalves[] = "  keys + values";
  Fields f;
  f.Add("bytes per token", BytesWithCount(p.bytes_per_token()));
  f.Add(kHalves, KeysPlusValues(p.k_bytes_per_token(), p.v_bytes_per_token()));
  if (p.full_attention_bytes_per_token() != p.bytes_per_token()) {
    f.Add("  once windows are full",
          absl::StrCat(BytesWithCount(p.full_attention_bytes_per_token()),
                       " per token (full-attention layers only)"));
  }
  f.Add(absl::StrCat("per sequence (", Count(p.context_tokens()), " tokens)"),
        BytesWithCount(p.bytes_per_sequence()));
  f.Add(kHalves, KeysPlusValues(p.k_bytes_per_sequence(), p.v_bytes_per_sequence()));
  f.Add(absl::StrCat("total (", Plural(p.batch(), "sequence", "sequences"), ")"),
        BytesWithCount(p.total_bytes()));
  // For one sequence the total is the sequence, already split above.
  if (p.batch() > 1) f.Add(kHalves, KeysPlusValues(p.k_total_bytes(), p.v_total_bytes()));
  AddPlanStateFields(p, &f);
  if (p.has_paged()) {
    const v1::PagedPlan& pg = p.paged();
    f.Add(absl::StrCat("paged (", Count(pg.block_tokens()), "-token blocks)"),
          absl::StrCat(BytesWithCount(pg.allocated_bytes()), " allocated, ",
                       Plural(pg.blocks_per_sequence(), "block", "blocks"), " per sequence, ",
                       BinaryBytes(pg.waste_bytes()), " unused"));
  }
  out << f.Render();
}

// Whether the batch fits the budget, why, and the longest context and most sequences that do.
void PrintPlanBudget(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  if (!p.has_budget()) return;
  const v1::BudgetPlan& b = p.budget();
  out << "\nbudget " << BytesWithCount(b.budget_bytes());
  if (b.weights_bytes() > 0) {
    out << " - weights " << BinaryBytes(b.weights_bytes()) << " = "
        << BinaryBytes(b.available_bytes()) << " for the cache";
  }
  out << ": " << (b.fits() ? "fits" : "does not fit") << "\n" << Wrap(b.explanation(), 100, "  ");
  if (b.available_bytes() >= 0) {
    Fields bf;
    const std::string unbounded = p.bytes_per_token() == 0
                                      ? "unbounded (no layer grows with the context)"
                                      : "unbounded (every layer is windowed)";
    bf.Add(
        absl::StrCat("longest context, ", Plural(p.batch(), "sequence", "sequences")),
        b.context_unbounded() ? unbounded : absl::StrCat(Count(b.max_context_tokens()), " tokens"));
    if (p.batch() > 1) {
      // One sequence fits whenever the batch does, so an unbounded batch is unbounded here too
      // (the response carries the planner's cap, not a limit of the memory).
      bf.Add("longest context, one sequence",
             b.context_unbounded()
                 ? unbounded
                 : absl::StrCat(Count(b.max_context_tokens_one_sequence()), " tokens"));
    }
    bf.Add(absl::StrCat("most sequences of ", Count(p.context_tokens()), " tokens"),
           Count(b.max_sequences()));
    out << bf.Render("  ");
  }
}

// With --replica_memory: how many replicas hold the batch behind the consistent-hash proxy.
void PrintPlanFleet(std::ostream& out, const v1::PlanKvCacheResponse& p) {
  if (!p.has_fleet()) return;
  const v1::FleetPlan& f = p.fleet();
  out << "\nfleet, " << BinaryBytes(f.replica_memory_bytes()) << " per replica";
  if (f.weights_bytes() > 0) {
    out << " - weights " << BinaryBytes(f.weights_bytes()) << " = "
        << BinaryBytes(f.available_bytes_per_replica()) << " for the cache";
  }
  out << ": "
      << (f.replicas() > 0
              ? absl::StrCat(Count(f.replicas()), f.replicas() == 1 ? " replica" : " replicas")
              : "no replica count works")
      << "\n"
      << Wrap(f.explanation(), 100, "  ");
  if (f.replicas() > 0) {
    Fields ff;
    ff.Add(absl::StrCat("sequences of ", Count(p.context_tokens()), " tokens per replica"),
           Count(f.sequences_per_replica()));
    ff.Add("replicas if spread evenly", Count(f.even_replicas()));
    ff.Add("replicas behind the consistent hash", Count(f.replicas()));
    ff.Add("busiest replica (99th percentile)",
           absl::StrCat(Count(f.busiest_replica_sequences()), " sequences, mean ",
                        absl::StrFormat("%.1f", f.mean_sequences_per_replica())));
    out << ff.Render("  ");
  }
}

// The same layers and heads as multi-head, grouped-query and multi-query attention; the model's
// own row is marked. The table fits `style` (note of hidden columns on `err` with --no-headers).
void PrintPlanVariants(std::ostream& out, std::ostream& err, const v1::PlanKvCacheResponse& p,
                       const TableStyle& style) {
  if (p.variants_size() == 0) return;
  std::vector<std::string> header = {"variant", "kv heads", "group", "KiB/token",
                                     absl::StrCat("GiB at ", p.context_tokens(), " tokens")};
  if (p.batch() > 1) header.push_back(absl::StrCat("GiB x ", p.batch()));
  Table table(header);
  table.set_drop_order({"group", "KiB/token", "kv heads"});
  bool marked = false;
  for (const v1::VariantRow& v : p.variants()) {
    std::vector<std::string> row = {
        absl::StrCat(VariantLabel(v.variant()), v.is_model() ? " *" : ""), Count(v.n_head_kv()),
        Count(v.group_size()), KibPerToken(v.bytes_per_token()),
        absl::StrFormat("%.2f", static_cast<double>(v.bytes_per_sequence()) / kGiB)};
    if (p.batch() > 1) {
      row.push_back(
          absl::StrFormat("%.2f", static_cast<double>(v.bytes_per_sequence()) * p.batch() / kGiB));
    }
    marked = marked || v.is_model();
    table.AddRow(std::move(row));
  }
  out << "\n";
  PrintTable(table, style, out, err);
  if (marked && style.headers) out << "* the model's own key/value heads\n";
}

void PrintPlan(std::ostream& out, std::ostream& err, const v1::PlanKvCacheResponse& p,
               const TableStyle& style, bool layers) {
  PrintPlanHeadline(out, p);
  PrintPlanSizes(out, p);
  if (layers) PrintPlanLayers(out, p);
  PrintPlanBudget(out, p);
  PrintPlanFleet(out, p);
  PrintPlanVariants(out, err, p, style);
}

// Contexts at which to sample a KV-size curve up to `max_context`: evenly spaced points plus
// every window edge (and on a log axis powers of two). Between those the size is linear in the
// context, so the polyline through them is the exact curve.
std::vector<int64_t> KvSamples(const v1::ModelSpec& m, int64_t max_context, bool log_y) {
  std::set<int64_t> xs = {1, max_context};
  // On a log axis a straight segment is not the curve: powers of two keep the short contexts,
  // where it bends, finely sampled.
  for (int64_t x = 2; log_y && x < max_context; x *= 2) xs.insert(x);
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

// One line per attention variant of the plan (the same layers and heads with other key/value
// heads): the KV size of the batch at each context of `xs`, from the server.
absl::Status AddVariantSeries(const client::PlannerClient& planner, v1::PlanKvCacheRequest request,
                              const v1::PlanKvCacheResponse& plan, const std::vector<int64_t>& xs,
                              LineChart* chart) {
  chart->subtitle = absl::StrCat(KvDTypeName(plan.kv_dtype()),
                                 " cache; one line per attention variant (same layers and heads)");
  for (const v1::VariantRow& v : plan.variants()) {
    ChartSeries s;
    s.name = absl::StrCat(v.variant(), ": ", Plural(v.n_head_kv(), "KV head", "KV heads"),
                          v.is_model() ? " (the model)" : "");
    chart->series.push_back(std::move(s));
  }
  for (int64_t x : xs) {
    request.set_context_tokens(x);
    absl::StatusOr<v1::PlanKvCacheResponse> r = planner.PlanKvCache(request);
    if (!r.ok()) return r.status();
    if (r->variants_size() != static_cast<int>(chart->series.size())) {
      return absl::InternalError("the server's variant rows changed between calls");
    }
    for (int i = 0; i < r->variants_size(); ++i) {
      chart->series[i].x.push_back(static_cast<double>(x));
      chart->series[i].y.push_back(static_cast<double>(r->variants(i).bytes_per_sequence()) *
                                   static_cast<double>(r->batch()) / kGiB);
    }
  }
  return absl::OkStatus();
}

// One line per KV cache type: the total KV size at each context of `xs`, from the server.
absl::Status AddDTypeSeries(const client::PlannerClient& planner, v1::PlanKvCacheRequest request,
                            const v1::ModelSpec& m, const std::vector<int64_t>& xs,
                            LineChart* chart) {
  chart->subtitle = absl::StrCat(Plural(m.n_head_kv(), "key/value head", "key/value heads"),
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
    chart->series.push_back(std::move(s));
  }
  return absl::OkStatus();
}

// Where `s` first rises through `level`, by linear interpolation between its samples (exact
// for KV sizes, which are linear in the context between the samples); nullopt when it starts at
// or above the level or never reaches it.
std::optional<double> CrossingX(const ChartSeries& s, double level) {
  for (size_t i = 0; i + 1 < std::min(s.x.size(), s.y.size()); ++i) {
    if (i == 0 && s.y[0] >= level) return std::nullopt;
    if (s.y[i] < level && s.y[i + 1] >= level) {
      return s.x[i] + (level - s.y[i]) / (s.y[i + 1] - s.y[i]) * (s.x[i + 1] - s.x[i]);
    }
  }
  return std::nullopt;
}

// The budget as a dashed line, and where each line meets it a point "fits to N tokens": the
// longest context whose cache fits (the server's figure for the model's own line).
void AddBudget(const v1::PlanKvCacheResponse& plan, bool by_dtype, LineChart* chart) {
  const v1::BudgetPlan& b = plan.budget();
  const double gib = static_cast<double>(b.available_bytes()) / kGiB;
  const size_t lines = chart->series.size();
  for (size_t i = 0; i < lines; ++i) {
    const ChartSeries& s = chart->series[i];
    const std::optional<double> x = CrossingX(s, gib);
    if (!x) continue;
    // The model's own line, unpaged like the curves: the server's longest context.
    const bool own =
        !by_dtype && !plan.has_paged() && plan.variants(static_cast<int>(i)).is_model();
    const int64_t tokens = own && !b.context_unbounded() && b.max_context_tokens() > 0
                               ? b.max_context_tokens()
                               : static_cast<int64_t>(std::floor(*x));
    chart->points.push_back({static_cast<double>(tokens), gib,
                             absl::StrCat("fits to ", Count(tokens), " tokens"), s.name});
  }
  ChartSeries budget;
  budget.name = absl::StrCat("budget: ", BinaryBytes(b.available_bytes()), " for the cache");
  budget.dashed = true;
  budget.x = {0.0, static_cast<double>(plan.context_tokens())};
  budget.y = {gib, gib};
  chart->series.push_back(std::move(budget));
}

// Asks the server for the KV size of each variant (or each KV type) at a series of contexts,
// and adds the budget with the fit points, the window edges as markers, and a note when the
// axis runs past the model's maximum context.
absl::StatusOr<LineChart> KvChart(const client::PlannerClient& planner,
                                  const v1::PlanKvCacheRequest& base,
                                  const v1::PlanKvCacheResponse& plan, bool by_dtype, bool log_y) {
  const v1::ModelSpec& m = plan.model();
  const std::vector<int64_t> xs = KvSamples(m, plan.context_tokens(), log_y);
  LineChart chart;
  chart.title = absl::StrCat(m.display_name(), ": KV cache against context");
  chart.x_label = "context (tokens per sequence)";
  chart.y_label = absl::StrCat("KV cache (GiB, ", Plural(plan.batch(), "sequence", "sequences"),
                               log_y ? ", log scale)" : ")");
  chart.log_y = log_y;
  v1::PlanKvCacheRequest request = base;
  request.clear_memory_budget_bytes();
  request.clear_block_tokens();
  request.set_subtract_weights(false);
  const absl::Status added = by_dtype ? AddDTypeSeries(planner, request, m, xs, &chart)
                                      : AddVariantSeries(planner, request, plan, xs, &chart);
  if (!added.ok()) return added;
  AddStateSeries(plan, xs, &chart);
  if (plan.has_budget() && plan.budget().available_bytes() > 0) AddBudget(plan, by_dtype, &chart);
  std::set<int64_t> windows;
  for (const v1::LayerSpec& l : m.layer_specs()) {
    if (l.window_tokens() > 0 && l.window_tokens() < plan.context_tokens()) {
      windows.insert(l.window_tokens());
    }
  }
  for (int64_t w : windows) {
    chart.markers.push_back({static_cast<double>(w), absl::StrCat("window ", Count(w))});
  }
  if (m.max_context_tokens() > 0 && plan.context_tokens() > m.max_context_tokens()) {
    chart.markers.push_back({static_cast<double>(m.max_context_tokens()),
                             absl::StrCat("max context ", Count(m.max_context_tokens()))});
    chart.notes.push_back(absl::StrCat("note: the axis runs past ", m.display_name(),
                                       "'s maximum context of ", Count(m.max_context_tokens()),
                                       " tokens, to ", Count(plan.context_tokens())));
  }
  return chart;
}

struct PlanOptions {
  int64_t context = 0;  // 0: the server sizes the model's max context
  int64_t batch = 0;    // 0: the server's default, one sequence
  std::string kv_dtype;
  int64_t block_tokens = 0;
  std::optional<std::string> indexer_dtype;
  std::optional<std::string> budget;
  bool subtract_weights = false;
  std::string weights_dtype;
  std::optional<std::string> weights_bytes;
  std::optional<std::string> replica_memory;
  bool layers = false;
  std::optional<std::string> plot;
  std::optional<std::string> plot_by;  // unset: variant
  bool log_y = false;
  ModelSource model;

  void Declare(Flags& f) {
    f.Add("context", &context, "tokens per sequence").Shown("the model's max context");
    f.Add("batch", &batch, "concurrent sequences").Shown("1");
    f.Add("kv_dtype", &kv_dtype, "f16, bf16, f32, fp8, int8, q8_0 or q4_0").Shown("f16");
    f.Add("block_tokens", &block_tokens, "paged allocation block size (0 = no paging)");
    f.Add("indexer_dtype", &indexer_dtype,
          "type of sparse-attention indexer keys (DeepSeek-V3.2, GLM-5): 'kv' (the KV type) or a "
          "type name")
        .Shown("fp8 + scale, as published");
    f.Add("budget", &budget, "memory for the cache, e.g. 80GiB, 80GB, 512MiB, 1e9");
    f.Add("subtract_weights", &subtract_weights, "take the weights out of the budget first");
    f.Add("weights_dtype", &weights_dtype, "type of the weights to subtract").Shown("the model's");
    f.Add("weights_bytes", &weights_bytes,
          "bytes of weights to subtract (instead of parameters x type)");
    f.Add("replica_memory", &replica_memory,
          "memory of one replica of a fleet (e.g. 64GiB): how many replicas hold --batch "
          "sequences behind the consistent-hash proxy");
    f.Add("layers", &layers, "also print the per-layer breakdown (kind, heads, bytes, state)");
    f.Add("plot", &plot, "also write an SVG of KV-cache size against context to this file");
    f.Add("plot_by", &plot_by, "one line per 'variant' (MHA/GQA/MQA) or per KV 'dtype'")
        .Values({"variant", "dtype"}, "--plot_by: '%s'; use variant (default) or dtype")
        .Shown("variant");
    f.Add("log_y", &log_y, "--plot with a log y axis (MQA's megabytes beside MHA's gigabytes)");
    model.Declare(f);
  }
};

int RunPlan(Context& c, const PlanOptions& o) {
  v1::PlanKvCacheRequest request;
  request.set_context_tokens(o.context);
  request.set_batch(o.batch);
  request.set_block_tokens(o.block_tokens);
  absl::StatusOr<v1::KvDType> dtype = ParseKvDType(o.kv_dtype);
  if (!dtype.ok()) return UsageError(c, dtype.status());
  request.set_kv_dtype(*dtype);
  if (o.indexer_dtype) {
    // "kv" keeps the indexer in the KV type; otherwise a type name. Without the flag the
    // server sizes it as published (fp8 values and a float32 scale).
    const std::string& name = *o.indexer_dtype;
    if (name.empty()) {
      // ParseKvDType reads empty as float16, which is neither the default nor "kv".
      return UsageError(c, absl::InvalidArgumentError(
                               "--indexer_dtype: empty; use 'kv' (the KV type) or a type name "
                               "(f16, bf16, f32, fp8, int8, q8_0 or q4_0), or leave the flag out "
                               "for fp8 + scale, as published"));
    }
    absl::StatusOr<v1::KvDType> indexer =
        name == "kv" ? *dtype : ParseKvDType(name, "--indexer_dtype");
    if (!indexer.ok()) return UsageError(c, indexer.status());
    request.set_indexer_dtype(*indexer);
  }
  if (o.budget) {
    absl::StatusOr<int64_t> budget = ParseByteSize(*o.budget, "--budget");
    if (!budget.ok()) return UsageError(c, budget.status());
    request.set_memory_budget_bytes(*budget);
  }
  request.set_subtract_weights(o.subtract_weights);
  if (o.weights_bytes) {
    absl::StatusOr<int64_t> w = ParseByteSize(*o.weights_bytes, "--weights_bytes");
    if (!w.ok()) return UsageError(c, w.status());
    request.set_weights_bytes(*w);
  }
  request.set_weights_dtype(o.weights_dtype);
  if (o.replica_memory) {
    absl::StatusOr<int64_t> replica = ParseByteSize(*o.replica_memory, "--replica_memory");
    if (!replica.ok()) return UsageError(c, replica.status());
    request.set_replica_memory_bytes(*replica);
  }
  const bool by_dtype = o.plot_by.value_or("variant") == "dtype";
  for (const auto& [flag, given] :
       {std::pair{"plot_by", o.plot_by.has_value()}, std::pair{"log_y", o.log_y}}) {
    if (given && !o.plot) {
      return UsageError(
          c, absl::InvalidArgumentError(absl::StrCat("--", flag, " goes with --plot <file.svg>")));
    }
  }

  client::PlannerClient planner(c.Channel(), c.connection);
  if (int code = ResolveModel(c, planner, o.model, request.mutable_model()); code != kExitOk) {
    return code;
  }
  absl::StatusOr<v1::PlanKvCacheResponse> r = planner.PlanKvCache(request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
  } else {
    PrintPlan(*c.out, *c.err, *r, TableStyleFromFlags(c.no_headers, c.wide), o.layers);
    if (o.indexer_dtype && r->indexer_bytes_per_token() == 0) {
      *c.err << "note: --indexer_dtype: the model has no sparse-attention indexer; the flag "
                "changes nothing\n";
    }
  }
  if (o.plot) {
    absl::StatusOr<LineChart> chart = KvChart(planner, request, *r, by_dtype, o.log_y);
    if (!chart.ok()) return ReportError(c, chart.status());
    const std::string& path = *o.plot;
    if (absl::Status s = client::WriteFile(path, RenderSvg(*chart)); !s.ok())
      return LocalError(c, s);
    if (!c.json) *c.out << "\nwrote " << path << " (" << chart->series.size() << " lines)\n";
  }
  return kExitOk;
}

}  // namespace

Command PlanCommand() {
  Command plan{
      "plan", "KV-cache size of a model: per token, per sequence, batch, budget, MHA/GQA/MQA",
      "attend plan <model> [--context N] [--batch B] [--kv_dtype fp8] [--budget 80GiB] "
      "[--plot kv.svg]",
      "Sizes in binary units (GiB = 2^30 bytes). With --budget, says whether the batch fits,\n"
      "the longest context and the most sequences that do. Sliding-window layers stop growing\n"
      "at their window; linear-attention and state-space layers hold a fixed state per\n"
      "sequence (the state line), and --layers prints each layer kind. With\n"
      "--replica_memory, how many replicas of that memory hold --batch sequences when a\n"
      "consistent-hash proxy places them (the busiest replica holds more\n"
      "than the mean; sized so that it fits in 99 of 100 fleets).\n"
      "--plot draws the budget too, with a point where each line meets it (the longest\n"
      "context that fits), and marks the model's maximum context when --context is beyond it.\n"
      "Examples:\n  attend plan llama-3-8b --context 8192\n"
      "  attend plan llama-3-70b --context 32768 --batch 16 --kv_dtype fp8 --budget 80GiB\n"
      "  attend plan llama-3-8b --budget 80GB --subtract_weights --block_tokens 16\n"
      "  attend plan llama-3-70b --context 32768 --batch 500 --replica_memory 64GiB\n"
      "  attend plan mistral-7b --plot kv.svg\n"
      "  attend plan llama-3-8b --context 32768 --budget 4GiB --plot kv.svg --log_y\n"
      "  attend plan jamba-v0.1 --context 262144 --layers\n"
      "  attend plan --config config.json --context 32768 --plot kv.svg --plot_by dtype\n"};
  plan.define = Define(RunPlan);
  return plan;
}

}  // namespace attend::cli
