#include <cmath>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attention_client.h"
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/npy.h"
#include "google/protobuf/util/json_util.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

FloatTensor RandomTensor(std::mt19937_64& rng, std::vector<int64_t> shape, float stddev = 1.0f) {
  FloatTensor t;
  t.shape = std::move(shape);
  std::normal_distribution<float> normal(0.0f, stddev);
  t.values.resize(static_cast<size_t>(t.size()));
  for (float& x : t.values) x = normal(rng);
  return t;
}

std::vector<FlagSpec> CommonAttentionFlags() {
  return {
      {"causal", "hide keys after each query's position", true},
      {"window", "sliding window in tokens (0 = unlimited)", false, "0"},
      {"scale", "multiplies q.k before softmax", false, "1/sqrt(head_dim)"},
      {"precision", "f32 or bf16 products", false, "f32 (bf16 when inputs are bf16)"},
      {"wire", "how tensors travel: f32, bf16, f16 or values", false, "f32"},
      {"seed", "seed of the random inputs", false, "1"},
      {"weights", "print the attention weights per head", true},
      {"out", "write the output to this .npy file", false},
      {"weights_out", "write the weights to this .npy file", false},
  };
}

absl::Status ApplyCommon(const Args& args, client::MaskSettings* mask, std::optional<float>* scale,
                         v1::Precision* precision, client::Wire* wire) {
  mask->causal = args.GetBool("causal");
  absl::StatusOr<int64_t> window = args.GetInt("window", 0);
  if (!window.ok()) return window.status();
  mask->window_tokens = *window;
  if (args.Has("scale")) {
    absl::StatusOr<double> s = args.GetDouble("scale", 0.0);
    if (!s.ok()) return s.status();
    *scale = static_cast<float>(*s);
  }
  const std::string p = args.GetString("precision", "");
  if (p.empty()) {
    *precision = v1::PRECISION_UNSPECIFIED;
  } else if (p == "f32" || p == "float32") {
    *precision = v1::PRECISION_FLOAT32;
  } else if (p == "bf16" || p == "bfloat16") {
    *precision = v1::PRECISION_BFLOAT16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--precision: '", p, "'; use f32 or bf16"));
  }
  absl::StatusOr<client::Wire> w = client::ParseWire(args.GetString("wire", "f32"));
  if (!w.ok()) return w.status();
  *wire = *w;
  return absl::OkStatus();
}

// Prints rows [token, head] of a [n, heads, dim] tensor, at most `max_rows` of them.
void PrintTokensByHead(std::ostream& out, const FloatTensor& t, int64_t max_rows = 16,
                       int64_t max_cols = 8) {
  const int64_t n = t.shape[0], heads = t.shape.size() > 2 ? t.shape[1] : 1;
  const int64_t dim = t.shape.back();
  std::vector<std::string> header = {"token", "head"};
  for (int64_t c = 0; c < std::min(dim, max_cols); ++c) header.push_back(absl::StrCat("[", c, "]"));
  if (dim > max_cols) header.push_back("...");
  Table table(header);
  int64_t rows = 0;
  for (int64_t i = 0; i < n && rows < max_rows; ++i) {
    for (int64_t h = 0; h < heads && rows < max_rows; ++h, ++rows) {
      std::vector<std::string> row = {absl::StrCat(i), absl::StrCat(h)};
      for (int64_t c = 0; c < std::min(dim, max_cols); ++c) {
        row.push_back(Fixed(t.values[(i * heads + h) * dim + c], 4));
      }
      if (dim > max_cols) row.push_back("...");
      table.AddRow(row);
    }
  }
  out << table.Render();
  if (n * heads > max_rows) out << "(" << n * heads - max_rows << " more rows)\n";
}

// Prints each head's weight matrix [queries x keys] (at most 16 x 16).
void PrintWeights(std::ostream& out, const FloatTensor& w) {
  const int64_t heads = w.shape[0], n_q = w.shape[1], n_kv = w.shape[2];
  const int64_t max = 16;
  for (int64_t h = 0; h < heads; ++h) {
    out << "weights, head " << h << " (row = query, column = key):\n";
    std::vector<std::string> header = {"q\\k"};
    for (int64_t j = 0; j < std::min(n_kv, max); ++j) header.push_back(absl::StrCat(j));
    if (n_kv > max) header.push_back("...");
    Table table(header);
    for (int64_t i = 0; i < std::min(n_q, max); ++i) {
      std::vector<std::string> row = {absl::StrCat(i)};
      for (int64_t j = 0; j < std::min(n_kv, max); ++j) {
        row.push_back(Fixed(w.values[(h * n_q + i) * n_kv + j], 3));
      }
      if (n_kv > max) row.push_back("...");
      table.AddRow(row);
    }
    out << table.Render();
    if (n_q > max) out << "(" << n_q - max << " more queries)\n";
  }
}

void PrintStats(std::ostream& out, const v1::ComputeStats& stats) {
  out << "engine " << stats.engine() << ": " << stats.attended_pairs() << " attended pairs, "
      << Si(static_cast<double>(stats.attention_flops()), "FLOP") << " in "
      << Duration(stats.compute_seconds());
  if (stats.compute_seconds() > 0) {
    out << " (" << Si(stats.attention_flops() / stats.compute_seconds(), "FLOP/s") << ")";
  }
  out << "\n";
}

absl::Status SaveIfAsked(const Args& args, const std::string& flag, const FloatTensor& t) {
  if (!args.Has(flag)) return absl::OkStatus();
  return client::WriteNpyFile(args.GetString(flag), t);
}

int RunHealth(Context& c) {
  std::vector<std::string> services;
  if (c.args.Has("service")) {
    services.push_back(c.args.GetString("service"));
  } else {
    services = {"", "attend.v1.Attention", "attend.v1.KvCache", "attend.v1.Planner"};
  }
  Table table({"service", "status"});
  std::string json = "{";
  bool all_serving = true;
  for (const std::string& service : services) {
    absl::StatusOr<std::string> status =
        client::CheckHealth(c.Channel(), service, c.connection.deadline);
    if (!status.ok()) return ReportError(c, status.status());
    all_serving = all_serving && *status == "SERVING";
    table.AddRow({service.empty() ? "(server)" : service, *status});
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", JsonString(service), ": ",
                    JsonString(*status));
  }
  *c.out << (c.json ? json + "}\n" : table.Render());
  return all_serving ? kExitOk : kExitNotServing;
}

int RunSoftmax(Context& c) {
  std::vector<double> logits;
  for (const std::string& token : c.args.positional()) {
    double value;
    if (!absl::SimpleAtod(token, &value)) {
      return UsageError(c, absl::InvalidArgumentError(
                               absl::StrCat("'", token, "' is not a number (use -inf to mask)")));
    }
    logits.push_back(value);
  }
  if (logits.empty()) {
    return UsageError(c,
                      absl::InvalidArgumentError("give the scores, e.g. attend softmax 2 1 0.5"));
  }
  std::optional<double> temperature;
  if (c.args.Has("temperature")) {
    absl::StatusOr<double> t = c.args.GetDouble("temperature", 1.0);
    if (!t.ok()) return UsageError(c, t.status());
    temperature = *t;
  }
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<v1::SoftmaxResponse> r =
      client.Softmax(logits, c.args.GetBool("jacobian"), temperature);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  // exp(logit) is shown for learning (it may overflow); the shares come from the server's
  // stable computation, which subtracts the largest score first.
  Table table({"i", "logit", "exp(logit)", "probability", "share"});
  for (size_t i = 0; i < logits.size(); ++i) {
    table.AddRow({absl::StrCat(i), absl::StrFormat("%g", logits[i]),
                  absl::StrFormat("%.4g", std::exp(logits[i])), Fixed(r->probabilities(i), 6),
                  absl::StrCat(Fixed(100 * r->probabilities(i), 1), "%")});
  }
  *c.out << table.Render();
  *c.out << "sum of exp(logit) = " << absl::StrFormat("%.6g", std::exp(r->log_sum_exp()))
         << " (log " << Fixed(r->log_sum_exp(), 6) << "), entropy " << Fixed(r->entropy_nats(), 4)
         << " nats\n";
  if (c.args.GetBool("jacobian")) {
    const size_t n = logits.size();
    *c.out << "jacobian diag(p) - p p^T (each row sums to 0):\n";
    std::vector<std::string> header = {""};
    for (size_t j = 0; j < n; ++j) header.push_back(absl::StrCat(j));
    Table jt(header);
    for (size_t i = 0; i < n; ++i) {
      std::vector<std::string> row = {absl::StrCat(i)};
      for (size_t j = 0; j < n; ++j) row.push_back(Fixed(r->jacobian(i * n + j), 4));
      jt.AddRow(row);
    }
    *c.out << jt.Render();
  }
  return kExitOk;
}

int RunAttend(Context& c) {
  client::AttendInput input;
  if (absl::Status s =
          ApplyCommon(c.args, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  input.return_weights = c.args.GetBool("weights") || c.args.Has("weights_out");
  const bool from_files = c.args.Has("q") || c.args.Has("k") || c.args.Has("v");
  if (from_files) {
    if (!c.args.Has("q") || !c.args.Has("k") || !c.args.Has("v")) {
      return UsageError(c, absl::InvalidArgumentError("--q, --k and --v go together"));
    }
    for (auto [flag, target] : {std::pair{"q", &input.q}, {"k", &input.k}, {"v", &input.v}}) {
      absl::StatusOr<FloatTensor> t = client::ReadNpyFile(c.args.GetString(flag));
      if (!t.ok()) {
        *c.err << "error: " << t.status().message() << "\n";
        return kExitLocalError;
      }
      *target = *std::move(t);
    }
  } else {
    absl::StatusOr<int64_t> n_q = c.args.GetInt("n_q", 4);
    absl::StatusOr<int64_t> n_kv = c.args.GetInt("n_kv", n_q.ok() ? *n_q : 4);
    absl::StatusOr<int64_t> n_head = c.args.GetInt("n_head", 2);
    absl::StatusOr<int64_t> n_head_kv = c.args.GetInt("n_head_kv", n_head.ok() ? *n_head : 2);
    absl::StatusOr<int64_t> head_dim = c.args.GetInt("head_dim", 8);
    absl::StatusOr<int64_t> head_dim_v = c.args.GetInt("head_dim_v", head_dim.ok() ? *head_dim : 8);
    absl::StatusOr<int64_t> seed = c.args.GetInt("seed", 1);
    for (const auto* s : {&n_q, &n_kv, &n_head, &n_head_kv, &head_dim, &head_dim_v, &seed}) {
      if (!s->ok()) return UsageError(c, s->status());
    }
    for (int64_t d : {*n_q, *n_kv, *n_head, *n_head_kv, *head_dim, *head_dim_v}) {
      if (d < 1 || d > (int64_t{1} << 24)) {
        return UsageError(
            c, absl::InvalidArgumentError("sizes must be between 1 and 2^24 for random inputs"));
      }
    }
    std::mt19937_64 rng(static_cast<uint64_t>(*seed));
    input.q = RandomTensor(rng, {*n_q, *n_head, *head_dim});
    input.k = RandomTensor(rng, {*n_kv, *n_head_kv, *head_dim});
    input.v = RandomTensor(rng, {*n_kv, *n_head_kv, *head_dim_v});
  }
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::AttendOutput> r = client.Attend(input);
  if (!r.ok()) return ReportError(c, r.status());
  for (auto [flag, tensor] : {std::pair<const char*, const FloatTensor*>{"out", &r->output},
                              {"weights_out", r->weights ? &*r->weights : nullptr}}) {
    if (tensor == nullptr) continue;
    if (absl::Status s = SaveIfAsked(c.args, flag, *tensor); !s.ok()) {
      *c.err << "error: " << s.message() << "\n";
      return kExitLocalError;
    }
  }
  if (c.json) {
    *c.out << "{\"output\": " << JsonTensor(r->output);
    if (r->weights) *c.out << ", \"weights\": " << JsonTensor(*r->weights);
    *c.out << ", \"stats\": " << ToJson(r->stats) << "}\n";
    return kExitOk;
  }
  *c.out << "output " << ShapeString(r->output.shape) << " = [n_q, n_head, head_dim_v]:\n";
  PrintTokensByHead(*c.out, r->output);
  if (r->weights && c.args.GetBool("weights")) PrintWeights(*c.out, *r->weights);
  PrintStats(*c.out, r->stats);
  return kExitOk;
}

int RunMultiHead(Context& c) {
  client::MultiHeadInput input;
  if (absl::Status s =
          ApplyCommon(c.args, &input.mask, &input.scale, &input.precision, &input.wire);
      !s.ok()) {
    return UsageError(c, s);
  }
  absl::StatusOr<int64_t> n = c.args.GetInt("n", 4);
  absl::StatusOr<int64_t> d_model = c.args.GetInt("d_model", 8);
  absl::StatusOr<int64_t> n_head = c.args.GetInt("n_head", 2);
  absl::StatusOr<int64_t> n_head_kv = c.args.GetInt("n_head_kv", n_head.ok() ? *n_head : 2);
  absl::StatusOr<int64_t> seed = c.args.GetInt("seed", 1);
  for (const auto* s : {&n, &d_model, &n_head, &n_head_kv, &seed}) {
    if (!s->ok()) return UsageError(c, s->status());
  }
  absl::StatusOr<int64_t> head_dim =
      c.args.GetInt("head_dim", *n_head > 0 ? *d_model / *n_head : 1);
  absl::StatusOr<int64_t> d_out = c.args.GetInt("d_out", *d_model);
  if (!head_dim.ok()) return UsageError(c, head_dim.status());
  if (!d_out.ok()) return UsageError(c, d_out.status());
  for (int64_t d : {*n, *d_model, *n_head, *n_head_kv, *head_dim}) {
    if (d < 1 || d > (int64_t{1} << 20)) {
      return UsageError(c, absl::InvalidArgumentError("sizes must be between 1 and 2^20"));
    }
  }
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  const float init = 1.0f / std::sqrt(static_cast<float>(*d_model));
  input.x = RandomTensor(rng, {*n, *d_model});
  input.wq = RandomTensor(rng, {*d_model, *n_head * *head_dim}, init);
  input.wk = RandomTensor(rng, {*d_model, *n_head_kv * *head_dim}, init);
  input.wv = RandomTensor(rng, {*d_model, *n_head_kv * *head_dim}, init);
  if (*d_out > 0) input.wo = RandomTensor(rng, {*n_head * *head_dim, *d_out}, init);
  input.n_head = static_cast<int32_t>(*n_head);
  input.n_head_kv = static_cast<int32_t>(*n_head_kv);
  input.return_weights = c.args.GetBool("weights") || c.args.Has("weights_out");
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<client::MultiHeadOutput> r = client.MultiHeadAttend(input);
  if (!r.ok()) return ReportError(c, r.status());
  if (absl::Status s = SaveIfAsked(c.args, "out", r->output); !s.ok()) {
    *c.err << "error: " << s.message() << "\n";
    return kExitLocalError;
  }
  if (r->weights) {
    if (absl::Status s = SaveIfAsked(c.args, "weights_out", *r->weights); !s.ok()) {
      *c.err << "error: " << s.message() << "\n";
      return kExitLocalError;
    }
  }
  if (c.json) {
    *c.out << "{\"output\": " << JsonTensor(r->output);
    if (r->weights) *c.out << ", \"weights\": " << JsonTensor(*r->weights);
    *c.out << ", \"parameters\": " << ToJson(r->parameters) << ", \"stats\": " << ToJson(r->stats)
           << "}\n";
    return kExitOk;
  }
  *c.out << "output " << ShapeString(r->output.shape) << ":\n";
  FloatTensor as_rows = r->output;
  as_rows.shape = {r->output.shape[0], 1, r->output.shape[1]};
  PrintTokensByHead(*c.out, as_rows);
  if (r->weights && c.args.GetBool("weights")) PrintWeights(*c.out, *r->weights);
  const v1::ParameterCounts& p = r->parameters;
  *c.out << "parameters: Wq " << p.wq() << ", Wk " << p.wk() << ", Wv " << p.wv() << ", Wo "
         << p.wo() << ", total " << p.total() << " (key/value " << p.kv() << "); head_dim "
         << r->head_dim << "\n";
  PrintStats(*c.out, r->stats);
  return kExitOk;
}

int RunScaling(Context& c) {
  v1::ScalingExperimentRequest request;
  absl::StatusOr<std::vector<int64_t>> dims = c.args.GetIntList("head_dims");
  if (!dims.ok()) return UsageError(c, dims.status());
  for (int64_t d : *dims) {
    if (d < 1 || d > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError("--head_dims must be between 1 and 2^30"));
    }
    request.add_head_dims(static_cast<int32_t>(d));
  }
  for (const char* flag : {"pairs", "trials", "keys"}) {
    absl::StatusOr<int64_t> v = c.args.GetInt(flag, 0);
    if (!v.ok()) return UsageError(c, v.status());
    if (*v < 0 || *v > (int64_t{1} << 30)) {
      return UsageError(c, absl::InvalidArgumentError(absl::StrCat("--", flag, " out of range")));
    }
    const int32_t value = static_cast<int32_t>(*v);
    if (std::string(flag) == "pairs") request.set_pairs(value);
    if (std::string(flag) == "trials") request.set_trials(value);
    if (std::string(flag) == "keys") request.set_keys(value);
  }
  if (c.args.Has("seed")) {
    absl::StatusOr<int64_t> seed = c.args.GetInt("seed", 5);
    if (!seed.ok()) return UsageError(c, seed.status());
    request.set_seed(static_cast<uint64_t>(*seed));
  }
  client::AttentionClient client(c.Channel(), c.connection);
  absl::StatusOr<v1::ScalingExperimentResponse> r = client.ScalingExperiment(request);
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
    return kExitOk;
  }
  Table table({"d_head", "std of q.k", "sqrt(d_head)", "largest weight, unscaled",
               "largest weight, scaled"});
  for (const v1::ScalingRow& row : r->rows()) {
    table.AddRow({absl::StrCat(row.head_dim()), Fixed(row.score_std(), 2),
                  Fixed(row.sqrt_head_dim(), 2), Fixed(row.mean_max_weight_unscaled(), 3),
                  Fixed(row.mean_max_weight_scaled(), 3)});
  }
  *c.out << table.Render() << "seed " << r->seed() << "\n";
  return kExitOk;
}

}  // namespace

std::vector<Command> AttentionCommands() {
  std::vector<Command> commands;
  commands.push_back({"health",
                      "report whether the server and each service is SERVING",
                      "attend health [--service=<name>]",
                      "Exits 0 when every service asked about is SERVING, 5 otherwise.\n"
                      "Examples:\n  attend health\n  attend health --service attend.v1.Attention\n",
                      {{"service", "check only this service (\"\" = the server as a whole)"}},
                      RunHealth});
  commands.push_back({"softmax",
                      "softmax of a list of scores, with the Jacobian on request",
                      "attend softmax <score>... [--jacobian] [--temperature=<t>]",
                      "Scores may be negative or -inf (masked: share exactly 0).\n"
                      "Examples:\n  attend softmax 2 1 0.5\n  attend softmax 3 -inf 1 --jacobian\n",
                      {{"jacobian", "also print diag(p) - p p^T", true},
                       {"temperature", "divide the scores first", false, "1"}},
                      RunSoftmax});
  std::vector<FlagSpec> attend_flags = {
      {"q", ".npy file [n_q, n_head, head_dim] (with --k and --v)"},
      {"k", ".npy file [n_kv, n_head_kv, head_dim]"},
      {"v", ".npy file [n_kv, n_head_kv, head_dim_v]"},
      {"n_q", "random queries", false, "4"},
      {"n_kv", "random keys and values", false, "n_q"},
      {"n_head", "query heads", false, "2"},
      {"n_head_kv", "key/value heads (divides n_head)", false, "n_head"},
      {"head_dim", "query/key head size", false, "8"},
      {"head_dim_v", "value head size", false, "head_dim"},
  };
  for (FlagSpec& f : CommonAttentionFlags()) attend_flags.push_back(f);
  commands.push_back(
      {"attend", "scaled dot-product attention of q over k/v (random or .npy inputs)",
       "attend attend [--q=q.npy --k=k.npy --v=v.npy | --n_q=N --n_kv=N --n_head=H ...] "
       "[--causal] [--weights]",
       "Without files, q/k/v are standard normal from --seed.\n"
       "Examples:\n  attend attend --n_q 4 --causal --weights\n"
       "  attend attend --n_q 1 --n_kv 4096 --n_head 32 --n_head_kv 8 --head_dim 128\n"
       "  attend attend --q q.npy --k k.npy --v v.npy --out o.npy\n",
       attend_flags, RunAttend});
  std::vector<FlagSpec> mha_flags = {
      {"n", "tokens", false, "4"},
      {"d_model", "model width", false, "8"},
      {"n_head", "query heads", false, "2"},
      {"n_head_kv", "key/value heads", false, "n_head"},
      {"head_dim", "head size", false, "d_model / n_head"},
      {"d_out", "columns of Wo; 0 = no Wo", false, "d_model"},
  };
  for (FlagSpec& f : CommonAttentionFlags()) mha_flags.push_back(f);
  commands.push_back(
      {"mha", "a whole attention layer (Wq, Wk, Wv, Wo) on random inputs",
       "attend mha [--n=N --d_model=D --n_head=H --n_head_kv=G] [--causal] [--weights]",
       "Examples:\n  attend mha --n 4 --d_model 8 --n_head 2 --causal --weights\n"
       "  attend mha --d_model 4096 --n_head 32 --n_head_kv 8 --n 16\n",
       mha_flags, RunMultiHead});
  commands.push_back(
      {"scaling",
       "the sqrt(d_head) experiment: why scores are scaled",
       "attend scaling [--head_dims=4,64,1024] [--seed=5]",
       "With the defaults (seed 5) this prints the lesson's table.\n"
       "Examples:\n  attend scaling\n  attend scaling --head_dims 8,128,512 --trials 200\n",
       {{"head_dims", "comma-separated head sizes", false, "4,64,1024"},
        {"pairs", "random pairs for the spread of q.k", false, "2000"},
        {"trials", "softmax trials per head size", false, "500"},
        {"keys", "keys per trial", false, "8"},
        {"seed", "java.util.Random seed", false, "5"}},
       RunScaling});
  return commands;
}

}  // namespace attend::cli
