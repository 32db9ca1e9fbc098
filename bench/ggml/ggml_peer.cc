// Times ggml's CPU flash attention (ggml_flash_attn_ext, the attention of llama.cpp) on one of
// attend's benchmark shapes, for bench/compare_peers.py. Built by bench/ggml/build.sh against
// the ggml sources that the npm package llama.rn carries (symbols prefixed lm_); not part of the
// CMake build.
//
//   ggml_peer heads kv_heads n_q n_kv d kv_type causal batch threads reps evict
//
// q is f32 [batch][heads][n_q][d]; k and v are kv_type (f32, f16, bf16) [batch][kv_heads][n_kv][d],
// each head's rows contiguous, as in attend's KV cache; causal puts the n_q queries at the end of
// the n_kv keys. The accumulation precision is set to f32 (GGML_PREC_F32), as attend computes.
// With evict, 64 MiB are read between two timed runs so that K and V come from memory, as in
// decode_bench. Prints one JSON object: the median and best of `reps` timed runs (after one
// untimed), useful FLOP/s (4 * d per attended pair) and K/V bytes read per second.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

namespace {

float EvictCaches() {
  static std::vector<float> buffer(size_t{16} << 20, 1.0f);
  float sum = 0;
  for (size_t i = 0; i < buffer.size(); i += 16) sum += buffer[i];
  return sum;
}

bool TypeOf(const std::string& name, lm_ggml_type* type) {
  if (name == "f32") {
    *type = LM_GGML_TYPE_F32;
  } else if (name == "f16") {
    *type = LM_GGML_TYPE_F16;
  } else if (name == "bf16") {
    *type = LM_GGML_TYPE_BF16;
  } else {
    return false;
  }
  return true;
}

void FillNormal(lm_ggml_tensor* t, std::mt19937* rng) {
  std::normal_distribution<float> normal;
  const int64_t n = lm_ggml_nelements(t);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = normal(*rng);
  if (t->type == LM_GGML_TYPE_F32) {
    std::memcpy(t->data, x.data(), x.size() * sizeof(float));
  } else if (t->type == LM_GGML_TYPE_F16) {
    lm_ggml_fp32_to_fp16_row(x.data(), static_cast<lm_ggml_fp16_t*>(t->data), n);
  } else {
    lm_ggml_fp32_to_bf16_row(x.data(), static_cast<lm_ggml_bf16_t*>(t->data), n);
  }
}

// Row `row` of head `head` of k or v (batch 0) as floats.
void RowToFloat(const lm_ggml_tensor* t, int64_t head, int64_t row, float* out) {
  const char* data = static_cast<const char*>(t->data) + head * t->nb[2] + row * t->nb[1];
  if (t->type == LM_GGML_TYPE_F32) {
    std::memcpy(out, data, t->ne[0] * sizeof(float));
  } else {
    lm_ggml_get_type_traits(t->type)->to_float(data, out, t->ne[0]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  lm_ggml_type kv_type;
  if (argc != 12 || !TypeOf(argv[6], &kv_type)) {
    std::fprintf(stderr,
                 "usage: %s heads kv_heads n_q n_kv d kv_type(f32|f16|bf16) causal(0|1) batch "
                 "threads reps evict(0|1)\n",
                 argv[0]);
    return 2;
  }
  const int64_t heads = std::atoll(argv[1]), kv_heads = std::atoll(argv[2]);
  const int64_t n_q = std::atoll(argv[3]), n_kv = std::atoll(argv[4]), d = std::atoll(argv[5]);
  const bool causal = std::atoi(argv[7]) != 0;
  const int64_t batch = std::atoll(argv[8]);
  const int threads = std::atoi(argv[9]), reps = std::atoi(argv[10]);
  const bool evict = std::atoi(argv[11]) != 0;
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || n_q <= 0 || n_kv < n_q || d <= 0 ||
      batch <= 0 || threads <= 0 || reps <= 0) {
    std::fprintf(stderr, "bad shape: heads %% kv_heads == 0, 0 < n_q <= n_kv, all positive\n");
    return 2;
  }

  const size_t kv_bytes = 2 * lm_ggml_row_size(kv_type, d) * n_kv * kv_heads * batch;
  const size_t q_bytes = sizeof(float) * d * n_q * heads * batch;
  const size_t mask_bytes = causal ? 2 * n_kv * n_q : 0;
  // Tensors, the output, the graph and the CPU backend's work buffer (a few MiB per thread).
  const size_t memory = kv_bytes + 2 * q_bytes + mask_bytes + (size_t{256} << 20);
  lm_ggml_init_params params = {memory, nullptr, false};
  lm_ggml_context* ctx = lm_ggml_init(params);
  if (ctx == nullptr) {
    std::fprintf(stderr, "cannot allocate %zu bytes\n", memory);
    return 1;
  }
  lm_ggml_tensor* q = lm_ggml_new_tensor_4d(ctx, LM_GGML_TYPE_F32, d, n_q, heads, batch);
  lm_ggml_tensor* k = lm_ggml_new_tensor_4d(ctx, kv_type, d, n_kv, kv_heads, batch);
  lm_ggml_tensor* v = lm_ggml_new_tensor_4d(ctx, kv_type, d, n_kv, kv_heads, batch);
  std::mt19937 rng(1);
  FillNormal(q, &rng);
  FillNormal(k, &rng);
  FillNormal(v, &rng);
  lm_ggml_tensor* mask = nullptr;
  if (causal) {
    // Query i (of the last n_q positions) sees keys up to n_kv - n_q + i.
    mask = lm_ggml_new_tensor_4d(ctx, LM_GGML_TYPE_F16, n_kv, n_q, 1, 1);
    std::vector<float> m(static_cast<size_t>(n_kv * n_q));
    for (int64_t i = 0; i < n_q; ++i) {
      for (int64_t j = 0; j < n_kv; ++j) m[i * n_kv + j] = j <= n_kv - n_q + i ? 0.0f : -INFINITY;
    }
    lm_ggml_fp32_to_fp16_row(m.data(), static_cast<lm_ggml_fp16_t*>(mask->data), n_kv * n_q);
  }
  lm_ggml_tensor* out =
      lm_ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / std::sqrt(static_cast<float>(d)), 0, 0);
  lm_ggml_flash_attn_ext_set_prec(out, LM_GGML_PREC_F32);
  lm_ggml_cgraph* graph = lm_ggml_new_graph(ctx);
  lm_ggml_build_forward_expand(graph, out);

  std::vector<double> seconds;
  volatile float sink = 0;
  for (int r = 0; r <= reps; ++r) {
    if (evict) sink = sink + EvictCaches();
    const auto start = std::chrono::steady_clock::now();
    if (lm_ggml_graph_compute_with_ctx(ctx, graph, threads) != LM_GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "ggml's graph compute failed\n");
      return 1;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) seconds.push_back(s);  // the first run warms up
  }
  // A wrong layout or mask would show as a fast time: check the first and last query of the
  // first and last head against attention computed here, in double, from the values ggml holds.
  const float* o = static_cast<const float*>(out->data);
  for (const int64_t h : {int64_t{0}, heads - 1}) {
    for (const int64_t i : {int64_t{0}, n_q - 1}) {
      const int64_t g = h / (heads / kv_heads), visible = causal ? n_kv - n_q + i + 1 : n_kv;
      std::vector<float> qi(d), key(d), value(d);
      std::memcpy(qi.data(), static_cast<const float*>(q->data) + (h * n_q + i) * d, d * 4);
      std::vector<double> score(visible), acc(d, 0.0);
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < visible; ++j) {
        RowToFloat(k, g, j, key.data());
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * key[c];
        score[j] = dot / std::sqrt(static_cast<double>(d));
        max = std::max(max, score[j]);
      }
      for (int64_t j = 0; j < visible; ++j) {
        const double p = std::exp(score[j] - max);
        sum += p;
        RowToFloat(v, g, j, value.data());
        for (int64_t c = 0; c < d; ++c) acc[c] += p * value[c];
      }
      for (int64_t c = 0; c < d; ++c) {
        const double expected = acc[c] / sum, got = o[(i * heads + h) * d + c];
        // ggml rounds q to K's type (f16, bf16) for the dot products.
        if (!(std::abs(got - expected) <= 0.01 + 0.01 * std::abs(expected))) {
          std::fprintf(stderr,
                       "ggml's output differs at head %lld query %lld column %lld: %g, "
                       "expected %g\n",
                       static_cast<long long>(h), static_cast<long long>(i),
                       static_cast<long long>(c), got, expected);
          return 1;
        }
      }
    }
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2], best = seconds[0];
  double pairs = 0;
  for (int64_t i = 0; i < n_q; ++i)
    pairs += causal ? static_cast<double>(n_kv - n_q + i + 1) : n_kv;
  pairs *= static_cast<double>(heads * batch);
  const double flops = 4.0 * static_cast<double>(d) * pairs;
  std::printf(
      "{\"median_seconds\": %.9g, \"best_seconds\": %.9g, \"useful_flops\": %.6g, "
      "\"useful_flops_best\": %.6g, \"kv_bytes_per_second\": %.6g, "
      "\"kv_bytes_per_second_best\": %.6g, \"threads\": %d}\n",
      median, best, flops / median, flops / best, kv_bytes / median, kv_bytes / best, threads);
  lm_ggml_free(ctx);
  return 0;
}
