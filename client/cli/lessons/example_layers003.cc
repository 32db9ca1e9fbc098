// Lesson 003, Examples 9 to 13: multi-head attention, grouped-query and multi-query attention
// (the planner's parameter and KV-cache counts), attention cost with sequence length (the
// planner's FLOP estimates), and the hand-built previous-token head.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/lessons/example_command.h"
#include "client/cli/render/format.h"

namespace attend::cli::examples {
namespace {

using client::FloatTensor;

// Example 9: java.util.Random(3) draws x (4 x 8), Wq, Wk, Wv and Wo (8 x 8); 2 heads of 4,
// causal. The lesson prints each head's weights for the last position.
absl::StatusOr<Result> RunMultiHead(const Services& s) {
  client::MultiHeadInput in;
  v1::LessonInit init;
  init.set_seed(3);
  init.set_n(4);
  init.set_d_model(8);
  init.set_with_wo(true);
  in.init = init;
  in.n_head = 2;
  in.mask.causal = true;
  in.return_weights = true;
  absl::StatusOr<client::MultiHeadOutput> r = s.attention.MultiHeadAttend(in);
  if (!r.ok()) return r.status();
  if (absl::Status st = Returned(r->weights, "weights"); !st.ok()) return st;
  const FloatTensor& w = *r->weights;
  const int64_t heads = w.shape[0], n = w.shape[1];
  Result result;
  for (int64_t h = 0; h < heads; ++h) {
    absl::StrAppend(&result.text, "head ", h, " weights of the last position:");
    for (int64_t j = 0; j < n; ++j) {
      absl::StrAppend(
          &result.text,
          absl::StrFormat(" %.3f", w.values[static_cast<size_t>((h * n + (n - 1)) * n + j)]));
    }
    absl::StrAppend(&result.text, "\n");
  }
  const int64_t concat_cols = heads * r->head_dim_v;
  absl::StrAppend(&result.text, "concatenated: ", n, " x ", concat_cols,
                  ", after Wo: ", r->output.shape[0], " x ", r->output.shape[1], "\n",
                  "parameters in Wq, Wk, Wv, Wo: ", r->parameters.total(), "\n");
  result.json.Add("weights", JsonTensor(w))
      .Add("concatenated_shape", absl::StrCat("[", n, ", ", concat_cols, "]"))
      .Add("output", JsonTensor(r->output))
      .Add("parameters", ToJson(r->parameters));
  result.weights = Weights{w, in.mask, {}, {}};
  return result;
}

v1::PlanKvCacheRequest Plan(const std::string& model, int64_t context_tokens) {
  v1::PlanKvCacheRequest request;
  request.mutable_model()->set_name(model);
  request.set_kv_dtype(v1::KV_FLOAT16);
  request.set_context_tokens(context_tokens);
  return request;
}

const v1::VariantRow* FindVariant(const v1::PlanKvCacheResponse& plan, int32_t n_head_kv) {
  for (const v1::VariantRow& row : plan.variants()) {
    if (row.n_head_kv() == n_head_kv) return &row;
  }
  return nullptr;
}

// Which key/value head each of 8 query heads reads, seen in the server's output: with equal
// scores each query head's output is its key/value head's value, and key/value head g's value
// is g.
absl::StatusOr<std::vector<float>> KvHeadOfEachQueryHead(const Services& s) {
  client::AttendInput in;
  in.q = {{1, 8, 1}, std::vector<float>(8, 0.0f)};
  in.k = {{1, 2, 1}, {0, 0}};
  in.v = {{1, 2, 1}, {0, 1}};
  absl::StatusOr<client::AttendOutput> r = s.attention.Attend(in);
  if (!r.ok()) return r.status();
  return r->output.values;
}

// Example 10: the query-to-KV-head map, the tiny model's cache, and Llama 3 8B's per-layer
// projections and cache per token with 32 and 8 key/value heads.
absl::StatusOr<Result> RunGqa(const Services& s) {
  absl::StatusOr<std::vector<float>> kv_head = KvHeadOfEachQueryHead(s);
  if (!kv_head.ok()) return kv_head.status();
  absl::StatusOr<v1::PlanKvCacheResponse> tiny = s.planner.PlanKvCache(Plan("tiny", 4096));
  if (!tiny.ok()) return tiny.status();
  absl::StatusOr<v1::PlanKvCacheResponse> llama = s.planner.PlanKvCache(Plan("llama-3-8b", 8192));
  if (!llama.ok()) return llama.status();
  if (llama->projections_size() == 0) return absl::InternalError("the plan has no projections");
  const v1::ProjectionParameters& p = llama->projections(0);
  Result result;
  for (size_t h = 0; h < kv_head->size(); ++h) {
    absl::StrAppend(&result.text, "query head ", h, " -> key/value head ",
                    absl::StrFormat("%.0f", (*kv_head)[h]), "\n");
  }
  const int64_t tiny_bytes = tiny->bytes_per_sequence();
  absl::StrAppend(&result.text,
                  absl::StrFormat("tiny model, 4096 tokens: %s bytes = %.2f MiB of KV cache\n",
                                  Count(tiny_bytes), tiny_bytes / std::pow(1024.0, 2)),
                  absl::StrFormat("per layer: Wq %s  Wk %s  Wv %s  Wo %s parameters\n",
                                  Count(p.wq()), Count(p.wk()), Count(p.wv()), Count(p.wo())));
  std::vector<std::string> rows;
  for (int32_t nkv : {32, 8}) {
    const v1::VariantRow* row = FindVariant(*llama, nkv);
    if (row == nullptr) return absl::InternalError("the plan has no variant of that head count");
    absl::StrAppend(
        &result.text,
        absl::StrFormat("%2d key/value heads: %s bytes of KV cache per token (%d KiB); 8192 "
                        "tokens = %.2f GiB\n",
                        nkv, Count(row->bytes_per_token()), row->bytes_per_token() / 1024,
                        row->bytes_per_sequence() / std::pow(1024.0, 3)));
    rows.push_back(ToJson(*row));
  }
  result.json.Add("kv_head_of_query_head", JsonNumbers(*kv_head))
      .Add("tiny_bytes_per_sequence", absl::StrCat(tiny_bytes))
      .Add("llama_3_8b_projections", ToJson(p))
      .Add("mha", rows[0])
      .Add("gqa", rows[1]);
  return result;
}

// Example 11: the planner's MHA, GQA and MQA rows for 32 query heads of 128 in 32 layers (Llama
// 3 8B's shape) at 32768 tokens.
absl::StatusOr<Result> RunVariants(const Services& s) {
  absl::StatusOr<v1::PlanKvCacheResponse> plan = s.planner.PlanKvCache(Plan("llama-3-8b", 32768));
  if (!plan.ok()) return plan.status();
  Result result;
  result.text = "variant               kv heads  group  KiB/token  GiB at 32768 tokens\n";
  const struct {
    const char* name;
    const char* variant;
  } kNames[] = {
      {"multi-head (MHA)", "MHA"}, {"grouped-query (GQA)", "GQA"}, {"multi-query (MQA)", "MQA"}};
  std::vector<std::string> rows;
  for (const auto& name : kNames) {
    const v1::VariantRow* row = nullptr;
    for (const v1::VariantRow& r : plan->variants()) {
      if (r.variant() == name.variant) row = &r;
    }
    if (row == nullptr) return absl::InternalError(absl::StrCat("the plan has no ", name.variant));
    absl::StrAppend(&result.text,
                    absl::StrFormat("%-20s %8d %6d %10d %20.2f\n", name.name, row->n_head_kv(),
                                    row->group_size(), row->bytes_per_token() / 1024,
                                    row->bytes_per_sequence() / std::pow(1024.0, 3)));
    rows.push_back(ToJson(*row));
  }
  result.json.Add("variants", absl::StrCat("[", absl::StrJoin(rows, ", "), "]"));
  return result;
}

// Example 12: the planner's attention and weight FLOPs for Llama 3 8B's shape with the lesson's
// P = 8e9, prefill of n tokens and one decode step over n (the planner counts the causal
// n(n + 1) / 2 pairs and 2 P weight FLOPs per token, as the lesson does).
absl::StatusOr<Result> RunCost(const Services& s) {
  Result result;
  result.text =
      "      n   prefill attention   prefill weights   decode attention   decode weights\n";
  std::vector<std::string> rows;
  for (int64_t n : {1024, 8192, 32768, 131072}) {
    v1::EstimateCostRequest request;
    request.mutable_model()->set_name("llama-3-8b");
    request.set_prompt_tokens(n);
    request.set_context_tokens(n);
    request.set_parameters(8000000000);
    // FLOP counts do not depend on the hardware, but the estimate needs one for its times.
    request.set_profile("h100");
    absl::StatusOr<v1::EstimateCostResponse> r = s.planner.EstimateCost(request);
    if (!r.ok()) return r.status();
    const v1::PhaseCost &prefill = r->prefill(), &decode = r->decode();
    absl::StrAppend(&result.text,
                    absl::StrFormat("%7d %14.1f TFLOP %12.1f TFLOP %12.1f GFLOP %11.1f GFLOP\n", n,
                                    prefill.attention_flops() / 1e12, prefill.weight_flops() / 1e12,
                                    decode.attention_flops() / 1e9, decode.weight_flops() / 1e9));
    rows.push_back(examples::JsonObject()
                       .Add("n", absl::StrCat(n))
                       .Add("prefill_attention_flops", JsonExact(prefill.attention_flops()))
                       .Add("prefill_weight_flops", JsonExact(prefill.weight_flops()))
                       .Add("decode_attention_flops", JsonExact(decode.attention_flops()))
                       .Add("decode_weight_flops", JsonExact(decode.weight_flops()))
                       .Render());
  }
  result.json.Add("rows", absl::StrCat("[", absl::StrJoin(rows, ", "), "]"));
  return result;
}

// Example 13: x = [one-hot position (4), content (2)]; Wk copies the position code, Wq copies it
// shifted back one slot times 10 (position 0 asks for itself), Wv copies the content. Causal,
// scale 1/sqrt(4).
absl::StatusOr<Result> RunPreviousToken(const Services& s) {
  const float content[4][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 0}};
  client::MultiHeadInput in;
  in.x = {{4, 6}, std::vector<float>(24, 0.0f)};
  in.wq = {{6, 4}, std::vector<float>(24, 0.0f)};
  in.wk = in.wq;
  in.wv = {{6, 2}, std::vector<float>(12, 0.0f)};
  for (int i = 0; i < 4; ++i) {
    in.x.values[i * 6 + i] = 1;
    in.x.values[i * 6 + 4] = content[i][0];
    in.x.values[i * 6 + 5] = content[i][1];
    in.wk.values[i * 4 + i] = 1;
    if (i > 0) in.wq.values[i * 4 + (i - 1)] = 10;
  }
  in.wq.values[0] = 10;
  in.wv.values[4 * 2 + 0] = 1;
  in.wv.values[5 * 2 + 1] = 1;
  in.n_head = 1;
  in.mask.causal = true;
  in.return_weights = true;
  absl::StatusOr<client::MultiHeadOutput> r = s.attention.MultiHeadAttend(in);
  if (!r.ok()) return r.status();
  if (absl::Status st = Returned(r->weights, "weights"); !st.ok()) return st;
  Result result;
  result.text = "attention weights:\n";
  const FloatTensor& w = *r->weights;
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      absl::StrAppend(&result.text, absl::StrFormat("%8.3f", w.values[i * 4 + j]));
    }
    absl::StrAppend(&result.text, "\n");
  }
  for (int i = 0; i < 4; ++i) {
    const std::vector<float> out = Row(r->output, i);
    absl::StrAppend(
        &result.text,
        absl::StrFormat("position %d: own content (%.0f, %.0f) -> output (%.2f, %.2f)\n", i,
                        content[i][0], content[i][1], out[0], out[1]));
  }
  result.json.Add("weights", JsonTensor(w)).Add("output", JsonTensor(r->output));
  result.weights = Weights{w, in.mask, {}, {}};
  return result;
}

}  // namespace

std::vector<Example> Lesson003LayerExamples() {
  return {
      {"multi-head", "003 Example 9", "2 heads of seed 3: each head's weights of the last position",
       RunMultiHead},
      {"gqa", "003 Example 10", "query heads sharing KV heads; Llama 3 8B projections and cache",
       RunGqa},
      {"variants", "003 Example 11", "KV cache of MHA, GQA and MQA at 32768 tokens", RunVariants},
      {"cost", "003 Example 12", "prefill and decode FLOPs of attention and weights with n",
       RunCost},
      {"previous-token", "003 Example 13", "a hand-built head that attends to the previous token",
       RunPreviousToken},
  };
}

}  // namespace attend::cli::examples
