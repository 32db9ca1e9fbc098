// `attend cost`: prefill and decode FLOPs, bytes moved and roofline times of a model on some
// hardware, the attention crossover, and with --plot prefill FLOPs against the prompt length.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands/planner_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/render/svg_chart.h"
#include "client/output_file.h"
#include "common/byte_size.h"

namespace attend::cli {
namespace {

// A count flag that may be written in scientific notation ("8e9"), rounded to a whole number.
absl::StatusOr<int64_t> ParseCount(const std::string& text, const std::string& flag) {
  double value;
  if (!ParseDecimal(text, &value) || !std::isfinite(value) || value < 0 || value >= 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " needs a non-negative count such as 8030261248 or 8e9, got '", text, "'"));
  }
  return static_cast<int64_t>(std::llround(value));
}

absl::StatusOr<double> ParseRate(const std::string& text, const std::string& flag) {
  double value;
  if (!ParseDecimal(text, &value) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " needs a number such as 989.5e12, got '", text, "'"));
  }
  return value;
}

void PrintCost(std::ostream& out, std::ostream& err, const v1::EstimateCostResponse& e, bool priced,
               const TableStyle& style) {
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
  // Unpriced, $/Mtok says nothing; the ratios and byte counts matter less than time and rate.
  table.set_drop_order(priced
                           ? std::vector<std::string>{"FLOP/byte", "bytes moved", "weight FLOPs",
                                                      "attention FLOPs", "bound"}
                           : std::vector<std::string>{"$/Mtok", "FLOP/byte", "bytes moved",
                                                      "weight FLOPs", "attention FLOPs", "bound"});
  PrintTable(table, style, out, err);
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

// "warning: ..." on `err` when the weights and the KV cache need more than the hardware's memory
// (EstimateCostResponse.fits false); nothing when they fit or the memory is unknown.
void WarnIfNotFits(std::ostream& err, const v1::EstimateCostRequest& request,
                   const v1::EstimateCostResponse& e) {
  if (!e.has_fits() || e.fits()) return;
  const v1::HardwareProfile& h = e.hardware();
  const std::string weights_dtype =
      request.weights_dtype().empty() ? e.model().weights_dtype() : request.weights_dtype();
  err << "warning: does not fit: weights " << SiFine(e.weights_bytes(), "B") << " ("
      << weights_dtype << ") + KV cache " << SiFine(e.kv_cache_bytes(), "B") << " ("
      << Count(e.batch()) << " x " << Plural(e.context_tokens(), "token", "tokens")
      << ") = " << SiFine(e.weights_bytes() + e.kv_cache_bytes(), "B") << " > "
      << (h.name().empty() ? "custom" : h.name()) << " memory " << SiFine(h.memory_bytes(), "B")
      << " (" << BinaryBytes(static_cast<int64_t>(h.memory_bytes())) << ")\n";
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

// Picks the time unit that keeps the largest value of a chart between 1 and 1000.
std::pair<double, std::string> TimeUnit(double largest_seconds) {
  if (largest_seconds >= 1) return {1, "s"};
  if (largest_seconds >= 1e-3) return {1e-3, "ms"};
  return {1e-6, "us"};
}

// The cost of prefilling a prompt of each length of `xs` (and of a decode step at that
// context), from the server.
absl::StatusOr<std::vector<v1::EstimateCostResponse>> CostSamples(
    const client::PlannerClient& planner, v1::EstimateCostRequest request,
    const std::set<int64_t>& xs) {
  request.clear_context_tokens();
  std::vector<v1::EstimateCostResponse> samples;
  for (int64_t x : xs) {
    request.set_prompt_tokens(x);
    absl::StatusOr<v1::EstimateCostResponse> r = planner.EstimateCost(request);
    if (!r.ok()) return r.status();
    samples.push_back(*std::move(r));
  }
  return samples;
}

// The second panel: roofline time of the whole prefill and of one decode step against the
// tokens (the prompt's, and the context's), on the request's hardware.
LineChart TimeChart(const v1::EstimateCostResponse& e,
                    const std::vector<v1::EstimateCostResponse>& samples) {
  ChartSeries prefill{"prefill (the whole prompt)", {}, {}};
  ChartSeries decode{"decode step (one token per sequence)", {}, {}};
  double largest = 0;
  for (const v1::EstimateCostResponse& r : samples) {
    prefill.x.push_back(static_cast<double>(r.prompt_tokens()));
    prefill.y.push_back(r.prefill().roofline_seconds());
    decode.x.push_back(static_cast<double>(r.context_tokens()));
    decode.y.push_back(r.decode().roofline_seconds());
    largest = std::max({largest, prefill.y.back(), decode.y.back()});
  }
  const auto [scale, unit] = TimeUnit(largest);
  for (ChartSeries* s : {&prefill, &decode}) {
    for (double& y : s->y) y /= scale;
  }
  const std::string hardware = e.hardware().name().empty() ? "custom" : e.hardware().name();
  LineChart chart;
  chart.title = absl::StrCat(e.model().display_name(), " on ", hardware, ": roofline time");
  chart.subtitle = absl::StrCat(Plural(e.batch(), "sequence", "sequences"));
  if (!e.prefill().bound().empty()) {
    absl::StrAppend(&chart.subtitle, "; at ", Count(e.prompt_tokens()), " tokens prefill takes ",
                    Duration(e.prefill().roofline_seconds()), " (", e.prefill().bound(),
                    "-bound), a decode step ", Duration(e.decode().roofline_seconds()), " (",
                    e.decode().bound(), "-bound)");
  }
  // A whole prefill and one decode step differ by orders of magnitude: on a linear axis the
  // decode line would lie on the x axis.
  chart.log_y = true;
  chart.x_label = "prompt (prefill) or context (decode), tokens";
  chart.y_label = absl::StrCat("time (", unit, ", log scale)");
  chart.series = {std::move(prefill), std::move(decode)};
  return chart;
}

// Two panels: prefill FLOPs (attention and weights) against the prompt's length, with the
// crossover and the prompt marked, and the roofline time of prefill and decode.
absl::StatusOr<std::vector<LineChart>> CostCharts(const client::PlannerClient& planner,
                                                  const v1::EstimateCostRequest& base,
                                                  const v1::EstimateCostResponse& e, bool log_y) {
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
  absl::StatusOr<std::vector<v1::EstimateCostResponse>> samples = CostSamples(planner, base, xs);
  if (!samples.ok()) return samples.status();
  ChartSeries attention{"prefill attention", {}, {}};
  ChartSeries weights{"prefill weights (2P per token)", {}, {}};
  for (const v1::EstimateCostResponse& r : *samples) {
    attention.x.push_back(static_cast<double>(r.prompt_tokens()));
    attention.y.push_back(r.prefill().attention_flops());
    weights.x.push_back(static_cast<double>(r.prompt_tokens()));
    weights.y.push_back(r.prefill().weight_flops());
  }
  double largest = 0;
  for (const ChartSeries* s : {&attention, &weights}) {
    for (double y : s->y) largest = std::max(largest, y);
  }
  const auto [scale, unit] = FlopUnit(largest);
  for (ChartSeries* s : {&attention, &weights}) {
    for (double& y : s->y) y /= scale;
  }
  LineChart flops;
  flops.title = absl::StrCat(e.model().display_name(), ": prefill FLOPs against prompt length");
  flops.subtitle = absl::StrCat(
      Plural(e.batch(), "sequence", "sequences"), ", P = ", Count(e.parameters()),
      base.non_causal() ? ", non-causal" : "",
      crossover > 0
          ? absl::StrCat("; attention overtakes the weights at ", Count(crossover), " tokens")
          : "; attention never overtakes the weights");
  flops.x_label = "prompt (tokens)";
  flops.y_label = absl::StrCat("FLOPs (", unit, ")");
  flops.series = {std::move(attention), std::move(weights)};
  if (crossover > 0) {
    flops.markers.push_back(
        {static_cast<double>(crossover), absl::StrCat("crossover ", Count(crossover))});
  }
  std::vector<LineChart> charts = {std::move(flops), TimeChart(e, *samples)};
  const int64_t max_context = e.model().max_context_tokens();
  if (log_y) {
    charts[0].log_y = true;
    charts[0].y_label.insert(charts[0].y_label.size() - 1, ", log scale");
  }
  for (LineChart& chart : charts) {
    if (e.prompt_tokens() > 0 && e.prompt_tokens() != crossover) {
      chart.markers.push_back(
          {static_cast<double>(e.prompt_tokens()),
           absl::StrCat("prompt ", Count(e.prompt_tokens()),
                        e.prompt_tokens() == max_context ? " (the maximum context)" : "")});
    }
    if (max_context > 0 && x_max > max_context) {
      if (e.prompt_tokens() != max_context) {
        chart.markers.push_back(
            {static_cast<double>(max_context), absl::StrCat("max context ", Count(max_context))});
      }
      chart.notes.push_back(absl::StrCat("note: the axis runs past ", e.model().display_name(),
                                         "'s maximum context of ", Count(max_context),
                                         " tokens, to ", Count(x_max)));
    }
  }
  return charts;
}

struct CostOptions {
  std::optional<int64_t> prompt;
  std::optional<int64_t> context;
  int64_t batch = 0;  // 0: the server's default, one sequence
  std::optional<std::string> hardware;
  std::optional<std::string> price;
  std::string compute_dtype;
  std::string kv_dtype;
  std::string weights_dtype;
  std::optional<std::string> parameters;
  bool non_causal = false;
  std::optional<std::string> peak_flops;
  std::optional<std::string> peak_flops_f32;
  std::optional<std::string> peak_flops_fp8;
  std::optional<std::string> bandwidth;
  std::optional<std::string> memory;
  std::optional<std::string> plot;
  bool log_y = false;
  ModelSource model;

  void Declare(Flags& f) {
    f.Add("prompt", &prompt, "prefill length in tokens");
    f.Add("context", &context, "cache length of a decode step").Shown("--prompt");
    f.Add("batch", &batch, "sequences").Shown("1");
    f.Add("hardware", &hardware, "h100, h200, a100, cpu-socket or local (this server, measured)")
        .Shown("h100");
    f.Add("price", &price, "price per hour in USD, for $ per million tokens");
    f.Add("compute_dtype", &compute_dtype, "bfloat16, float32 or fp8").Shown("bfloat16");
    f.Add("kv_dtype", &kv_dtype, "f16, bf16, f32, fp8, int8, q8_0 or q4_0").Shown("f16");
    f.Add("weights_dtype", &weights_dtype, "type of the weights read").Shown("the model's");
    f.Add("parameters", &parameters, "P for weight FLOPs, e.g. 8e9")
        .Shown("the model's active parameters");
    f.Add("non_causal", &non_causal, "count n^2 prefill pairs instead of n(n+1)/2");
    f.Add("peak_flops", &peak_flops, "custom hardware: bf16/f16 peak FLOP/s, e.g. 989.5e12");
    f.Add("peak_flops_f32", &peak_flops_f32, "custom hardware: f32 peak FLOP/s");
    f.Add("peak_flops_fp8", &peak_flops_fp8, "custom hardware: fp8/int8 peak FLOP/s");
    f.Add("bandwidth", &bandwidth,
          "custom hardware: memory bytes per second, e.g. 3.35e12 or 3.35TB");
    f.Add("memory", &memory, "custom hardware: memory capacity, e.g. 80GiB");
    f.Add("plot", &plot,
          "also write an SVG of prefill FLOPs against prompt length, and of prefill and decode "
          "roofline time, to this file");
    f.Add("log_y", &log_y, "--plot with a log y axis for FLOPs too (time always has one)");
    model.Declare(f);
  }
};

// The hardware of --hardware, or a custom profile (named by --hardware) when any hardware figure
// is on the command line. INVALID_ARGUMENT for a figure that is not a number or byte size.
absl::Status HardwareFromFlags(const CostOptions& o, v1::EstimateCostRequest* request) {
  const bool custom =
      o.peak_flops || o.peak_flops_f32 || o.peak_flops_fp8 || o.bandwidth || o.memory;
  if (!custom) {
    request->set_profile(o.hardware.value_or("h100"));
    return absl::OkStatus();
  }
  v1::HardwareProfile* h = request->mutable_custom();
  h->set_name(o.hardware.value_or("custom"));
  for (const auto& [flag, value, setter] :
       {std::tuple{"peak_flops", &o.peak_flops, &v1::HardwareProfile::set_peak_flops_bf16},
        std::tuple{"peak_flops_f32", &o.peak_flops_f32, &v1::HardwareProfile::set_peak_flops_f32},
        std::tuple{"peak_flops_fp8", &o.peak_flops_fp8,
                   &v1::HardwareProfile::set_peak_flops_fp8}}) {
    if (!*value) continue;
    absl::StatusOr<double> v = ParseRate(**value, flag);
    if (!v.ok()) return v.status();
    (h->*setter)(*v);
  }
  for (const auto& [flag, value, setter] :
       {std::tuple{"bandwidth", &o.bandwidth,
                   &v1::HardwareProfile::set_memory_bandwidth_bytes_per_second},
        std::tuple{"memory", &o.memory, &v1::HardwareProfile::set_memory_bytes}}) {
    if (!*value) continue;
    absl::StatusOr<int64_t> v = ParseByteSize(**value, absl::StrCat("--", flag));
    if (!v.ok()) return v.status();
    (h->*setter)(static_cast<double>(*v));
  }
  return absl::OkStatus();
}

// The request the flags describe, the model aside. INVALID_ARGUMENT for the first flag that is
// wrong, or when neither --prompt nor --context is given.
absl::StatusOr<v1::EstimateCostRequest> CostRequestFromFlags(const CostOptions& o) {
  v1::EstimateCostRequest request;
  if (!o.prompt && !o.context) {
    return absl::InvalidArgumentError(
        "give --prompt N (the prefill length) and/or --context N (the cache length of a decode "
        "step)");
  }
  request.set_prompt_tokens(o.prompt.value_or(0));
  request.set_context_tokens(o.context.value_or(0));
  request.set_batch(o.batch);
  request.set_non_causal(o.non_causal);
  request.set_compute_dtype(o.compute_dtype);
  request.set_weights_dtype(o.weights_dtype);
  absl::StatusOr<v1::KvDType> dtype = ParseKvDType(o.kv_dtype);
  if (!dtype.ok()) return dtype.status();
  request.set_kv_dtype(*dtype);
  if (o.parameters) {
    absl::StatusOr<int64_t> p = ParseCount(*o.parameters, "parameters");
    if (!p.ok()) return p.status();
    request.set_parameters(*p);
  }
  if (o.price) {
    absl::StatusOr<double> price = ParseRate(*o.price, "price");
    if (!price.ok()) return price.status();
    request.set_price_per_hour_usd(*price);
  }
  if (absl::Status s = HardwareFromFlags(o, &request); !s.ok()) return s;
  return request;
}

int RunCost(Context& c, const CostOptions& o) {
  absl::StatusOr<v1::EstimateCostRequest> request = CostRequestFromFlags(o);
  if (!request.ok()) return UsageError(c, request.status());
  if (o.log_y && !o.plot) {
    return UsageError(c, absl::InvalidArgumentError("--log_y goes with --plot <file.svg>"));
  }
  client::PlannerClient planner(c.Channel(), c.connection);
  if (int code = ResolveModel(c, planner, o.model, request->mutable_model()); code != kExitOk) {
    return code;
  }
  absl::StatusOr<v1::EstimateCostResponse> r = planner.EstimateCost(*request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
  } else {
    PrintCost(*c.out, *c.err, *r, request->price_per_hour_usd() > 0,
              TableStyleFromFlags(c.no_headers, c.wide));
  }
  WarnIfNotFits(*c.err, *request, *r);
  if (o.plot) {
    absl::StatusOr<std::vector<LineChart>> charts = CostCharts(planner, *request, *r, o.log_y);
    if (!charts.ok()) return ReportError(c, charts.status());
    const std::string& path = *o.plot;
    if (absl::Status s = client::WriteFile(path, RenderSvg(*charts)); !s.ok())
      return LocalError(c, s);
    if (!c.json) *c.out << "\nwrote " << path << "\n";
  }
  return kExitOk;
}

}  // namespace

Command CostCommand() {
  Command cost{
      "cost", "prefill and decode FLOPs, bytes, roofline time and the attention crossover",
      "attend cost <model> --prompt N [--context N] [--batch B] [--hardware h100] [--price 2.5]",
      "FLOPs count 2 x (head_dim + head_dim_v) per attention pair and head, and 2P per token\n"
      "for the weights; time is the roofline max(FLOPs / peak, bytes / bandwidth).\n"
      "Any of --peak_flops, --bandwidth, ... makes a custom profile (named by --hardware).\n"
      "--plot draws two panels: prefill FLOPs (attention against the weights, with the\n"
      "crossover) and the roofline time of the prefill and of a decode step against the tokens\n"
      "(on a log axis: a decode step's milliseconds beside prefill's seconds); it marks the\n"
      "model's maximum context when the axis runs past it.\n"
      "Examples:\n  attend cost llama-3-8b --prompt 8192 --hardware h100\n"
      "  attend cost llama-3-8b --prompt 8192 --parameters 8e9 --plot cost.svg\n"
      "  attend cost llama-3-70b --prompt 4096 --hardware a100 --plot cost.svg --log_y\n"
      "  attend cost llama-3-70b --prompt 2048 --context 32768 --batch 32 --price 2.5\n"
      "  attend cost llama-3-8b --prompt 1024 --hardware local\n"
      "  attend cost llama-3-8b --prompt 1024 --peak_flops 100e12 --bandwidth 1TB\n"};
  cost.define = Define(RunCost);
  return cost;
}

}  // namespace attend::cli
