#include "server/convert/planner.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace attend::server {

namespace pl = ::attend::planner;

absl::StatusOr<pl::ModelSpec> FromProto(const v1::ModelSpec& spec, absl::string_view field_prefix) {
  // Bounded before the copy: a hostile message may carry millions of entries.
  if (spec.layer_specs_size() > pl::kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(pl::FieldPath(field_prefix, "layer_specs"), ": ",
                                                   spec.layer_specs_size(), " entries; at most ",
                                                   pl::kMaxLayers));
  }
  pl::ModelSpec m;
  m.name = spec.name();
  m.display_name = spec.display_name();
  m.source = spec.source();
  m.architecture = spec.architecture();
  m.layers = spec.layers();
  m.n_head = spec.n_head();
  m.n_head_kv = spec.n_head_kv();
  m.head_dim = spec.head_dim();
  m.head_dim_v = spec.head_dim_v();
  m.d_model = spec.d_model();
  m.vocab_size = spec.vocab_size();
  m.intermediate_size = spec.intermediate_size();
  m.experts = spec.experts();
  m.experts_active = spec.experts_active();
  m.parameters = spec.parameters();
  m.active_parameters = spec.active_parameters();
  m.parameters_source = spec.parameters_source();
  m.layer_specs.reserve(static_cast<size_t>(spec.layer_specs_size()));
  for (int i = 0; i < spec.layer_specs_size(); ++i) {
    const v1::LayerSpec& l = spec.layer_specs(i);
    // Proto3 enums are open: any int32 arrives.
    if (l.kind() < v1::LAYER_ATTENTION || l.kind() > v1::LAYER_KIMI_DELTA_ATTENTION) {
      return absl::InvalidArgumentError(
          absl::StrCat(pl::FieldPath(field_prefix, absl::StrCat("layer_specs[", i, "].kind")), ": ",
                       static_cast<int>(l.kind()), " is not a LayerKind (0 to 7)"));
    }
    pl::LayerSpec layer{l.n_head_kv(), l.window_tokens()};
    layer.kind = static_cast<pl::LayerKind>(l.kind());
    layer.kv_lora_rank = l.kv_lora_rank();
    layer.qk_rope_head_dim = l.qk_rope_head_dim();
    layer.conv_state_values = l.conv_state_values();
    layer.recurrent_state_values = l.recurrent_state_values();
    layer.index_head_dim = l.index_head_dim();
    m.layer_specs.push_back(layer);
  }
  m.max_context_tokens = spec.max_context_tokens();
  m.weights_dtype = spec.weights_dtype();
  m.tied_embeddings = spec.tied_embeddings();
  return m;
}

void ToProto(const pl::ModelSpec& m, v1::ModelSpec* out) {
  // The int32 fields hold counts that CanonicalModel bounds far below 2^31 (kMaxHeads etc.).
  out->set_name(m.name);
  out->set_display_name(m.display_name);
  out->set_source(m.source);
  out->set_layers(static_cast<int32_t>(m.layers));
  out->set_n_head(static_cast<int32_t>(m.n_head));
  out->set_n_head_kv(static_cast<int32_t>(m.n_head_kv));
  out->set_head_dim(static_cast<int32_t>(m.head_dim));
  out->set_head_dim_v(static_cast<int32_t>(m.head_dim_v));
  out->set_d_model(m.d_model);
  out->set_vocab_size(m.vocab_size);
  out->set_intermediate_size(m.intermediate_size);
  out->set_experts(static_cast<int32_t>(m.experts));
  out->set_experts_active(static_cast<int32_t>(m.experts_active));
  out->set_parameters(m.parameters);
  out->set_active_parameters(m.active_parameters);
  out->clear_layer_specs();
  for (const pl::LayerSpec& l : m.layer_specs) ToProto(l, out->add_layer_specs());
  out->set_max_context_tokens(m.max_context_tokens);
  out->set_weights_dtype(m.weights_dtype);
  out->set_tied_embeddings(m.tied_embeddings);
  out->set_architecture(m.architecture);
  out->set_parameters_source(m.parameters_source);
}

void ToProto(const pl::LayerSpec& l, v1::LayerSpec* out) {
  // CanonicalModel bounds heads and ranks by kMaxHeads / kMaxHeadDim, far below 2^31.
  out->set_n_head_kv(static_cast<int32_t>(l.n_head_kv));
  out->set_window_tokens(l.window_tokens);
  out->set_kind(static_cast<v1::LayerKind>(l.kind));
  out->set_kv_lora_rank(static_cast<int32_t>(l.kv_lora_rank));
  out->set_qk_rope_head_dim(static_cast<int32_t>(l.qk_rope_head_dim));
  out->set_conv_state_values(l.conv_state_values);
  out->set_recurrent_state_values(l.recurrent_state_values);
  out->set_index_head_dim(static_cast<int32_t>(l.index_head_dim));
}

void ToProto(const pl::LayerGroupPlan& g, v1::LayerGroupPlan* out) {
  ToProto(g.layer, out->mutable_layer());
  for (int64_t i : g.layer_indices) out->add_layer_indices(static_cast<int32_t>(i));
  out->set_bytes_per_token(g.bytes_per_token);
  out->set_expanded_bytes_per_token(g.expanded_bytes_per_token);
  out->set_state_bytes_per_sequence(g.state_bytes_per_sequence);
  out->set_bytes_per_sequence(g.bytes_per_sequence);
  out->set_indexer_bytes_per_token(g.indexer_bytes_per_token);
}

absl::StatusOr<pl::KvDType> FromProto(v1::KvDType value, absl::string_view field) {
  switch (value) {
    case v1::KV_DTYPE_UNSPECIFIED:
    case v1::KV_FLOAT16:
      return pl::KvDType::kFloat16;
    case v1::KV_FLOAT32:
      return pl::KvDType::kFloat32;
    case v1::KV_BFLOAT16:
      return pl::KvDType::kBFloat16;
    case v1::KV_FP8:
      return pl::KvDType::kFp8;
    case v1::KV_INT8:
      return pl::KvDType::kInt8;
    case v1::KV_Q8_0:
      return pl::KvDType::kQ8_0;
    case v1::KV_Q4_0:
      return pl::KvDType::kQ4_0;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", static_cast<int>(value),
      " is not a KvDType; use KV_FLOAT32 (1), KV_FLOAT16 (2, also 0), KV_BFLOAT16 (3), KV_FP8 (4), "
      "KV_INT8 (5), KV_Q8_0 (6) or KV_Q4_0 (7)"));
}

v1::KvDType ToProto(pl::KvDType dtype) {
  // The planner's enum lists the same types in the proto's order, without UNSPECIFIED.
  return static_cast<v1::KvDType>(static_cast<int>(dtype) + 1);
}

pl::HardwareProfile FromProto(const v1::HardwareProfile& p) {
  pl::HardwareProfile h;
  h.name = p.name();
  h.peak_flops_f32 = p.peak_flops_f32();
  h.peak_flops_bf16 = p.peak_flops_bf16();
  h.peak_flops_fp8 = p.peak_flops_fp8();
  h.memory_bandwidth_bytes_per_second = p.memory_bandwidth_bytes_per_second();
  h.memory_bytes = p.memory_bytes();
  h.note = p.note();
  return h;
}

void ToProto(const pl::HardwareProfile& h, v1::HardwareProfile* out) {
  out->set_name(h.name);
  out->set_peak_flops_f32(h.peak_flops_f32);
  out->set_peak_flops_bf16(h.peak_flops_bf16);
  out->set_peak_flops_fp8(h.peak_flops_fp8);
  out->set_memory_bandwidth_bytes_per_second(h.memory_bandwidth_bytes_per_second);
  out->set_memory_bytes(h.memory_bytes);
  out->set_note(h.note);
}

absl::StatusOr<pl::KvPlanRequest> FromProto(const v1::PlanKvCacheRequest& request) {
  pl::KvPlanRequest r;
  ATTEND_ASSIGN_OR_RETURN(r.kv_dtype, FromProto(request.kv_dtype(), "kv_dtype"));
  if (request.state_dtype() != v1::KV_DTYPE_UNSPECIFIED) {
    ATTEND_ASSIGN_OR_RETURN(r.state_dtype, FromProto(request.state_dtype(), "state_dtype"));
  }
  if (request.indexer_dtype() != v1::KV_DTYPE_UNSPECIFIED) {
    ATTEND_ASSIGN_OR_RETURN(r.indexer_dtype, FromProto(request.indexer_dtype(), "indexer_dtype"));
  }
  r.context_tokens = request.context_tokens();
  r.batch = request.batch();
  r.block_tokens = request.block_tokens();
  r.memory_budget_bytes = request.memory_budget_bytes();
  r.subtract_weights = request.subtract_weights();
  if (request.has_weights_bytes()) r.weights_bytes = request.weights_bytes();
  r.weights_dtype = request.weights_dtype();
  r.replica_memory_bytes = request.replica_memory_bytes();
  return r;
}

void ToProto(const pl::KvPlan& plan, v1::PlanKvCacheResponse* out) {
  ToProto(plan.model, out->mutable_model());
  out->set_kv_dtype(ToProto(plan.kv_dtype));
  out->set_bytes_per_value(plan.bytes_per_value);
  out->set_bytes_per_token(plan.bytes_per_token);
  out->set_bytes_per_sequence(plan.bytes_per_sequence);
  out->set_total_bytes(plan.total_bytes);
  if (plan.paged) ToProto(*plan.paged, out->mutable_paged());
  if (plan.budget) ToProto(*plan.budget, out->mutable_budget());
  if (plan.fleet) ToProto(*plan.fleet, out->mutable_fleet());
  for (const pl::VariantRow& v : plan.variants) ToProto(v, out->add_variants());
  out->set_full_attention_bytes_per_token(plan.full_attention_bytes_per_token);
  out->set_context_tokens(plan.context_tokens);
  out->set_batch(plan.batch);
  out->set_k_bytes_per_token(plan.k_bytes_per_token);
  out->set_v_bytes_per_token(plan.v_bytes_per_token);
  out->set_k_bytes_per_sequence(plan.k_bytes_per_sequence);
  out->set_v_bytes_per_sequence(plan.v_bytes_per_sequence);
  out->set_k_total_bytes(plan.k_total_bytes);
  out->set_v_total_bytes(plan.v_total_bytes);
  for (const pl::LayerProjectionKind& k : plan.projections) ToProto(k, out->add_projections());
  out->set_state_bytes_per_sequence(plan.state_bytes_per_sequence);
  out->set_state_total_bytes(plan.state_total_bytes);
  out->set_state_dtype(ToProto(plan.state_dtype));
  out->set_expanded_bytes_per_token(plan.expanded_bytes_per_token);
  for (const pl::LayerGroupPlan& g : plan.layer_groups) ToProto(g, out->add_layer_groups());
  out->set_indexer_bytes_per_token(plan.indexer_bytes_per_token);
  out->set_indexer_bytes_per_sequence(plan.indexer_bytes_per_sequence);
  out->set_indexer_total_bytes(plan.indexer_total_bytes);
  out->set_indexer_format(plan.indexer_format);
}

void ToProto(const pl::LayerProjectionKind& kind, v1::ProjectionParameters* out) {
  out->set_wq(kind.parameters.wq);
  out->set_wk(kind.parameters.wk);
  out->set_wv(kind.parameters.wv);
  out->set_wo(kind.parameters.wo);
  out->set_total(kind.parameters.total());
  // Head and layer counts are bounded by CanonicalModel (kMaxHeads, kMaxLayers).
  out->set_n_head_kv(static_cast<int32_t>(kind.n_head_kv));
  out->set_layers(static_cast<int32_t>(kind.layers));
  out->set_first_layer(static_cast<int32_t>(kind.first_layer));
}

void ToProto(const pl::FleetPlan& f, v1::FleetPlan* out) {
  out->set_replica_memory_bytes(f.replica_memory_bytes);
  out->set_weights_bytes(f.weights_bytes);
  out->set_available_bytes_per_replica(f.available_bytes_per_replica);
  out->set_sequences_per_replica(f.sequences_per_replica);
  out->set_even_replicas(f.even_replicas);
  out->set_replicas(f.replicas);
  out->set_busiest_replica_sequences(f.busiest_replica_sequences);
  out->set_mean_sequences_per_replica(f.mean_sequences_per_replica);
  out->set_explanation(f.explanation);
}

void ToProto(const pl::PagedPlan& p, v1::PagedPlan* out) {
  out->set_block_tokens(p.block_tokens);
  out->set_blocks_per_sequence(p.blocks_per_sequence);
  out->set_allocated_bytes_per_sequence(p.allocated_bytes_per_sequence);
  out->set_allocated_bytes(p.allocated_bytes);
  out->set_waste_bytes(p.waste_bytes);
}

void ToProto(const pl::BudgetPlan& b, v1::BudgetPlan* out) {
  out->set_budget_bytes(b.budget_bytes);
  out->set_weights_bytes(b.weights_bytes);
  out->set_available_bytes(b.available_bytes);
  out->set_fits(b.fits);
  out->set_max_context_tokens(b.max_context_tokens);
  out->set_max_sequences(b.max_sequences);
  out->set_explanation(b.explanation);
  out->set_max_context_tokens_one_sequence(b.max_context_tokens_one_sequence);
  out->set_context_unbounded(b.context_unbounded);
}

void ToProto(const pl::VariantRow& v, v1::VariantRow* out) {
  out->set_variant(v.variant);
  out->set_n_head_kv(static_cast<int32_t>(v.n_head_kv));
  out->set_group_size(static_cast<int32_t>(v.group_size));
  out->set_bytes_per_token(v.bytes_per_token);
  out->set_bytes_per_sequence(v.bytes_per_sequence);
  out->set_is_model(v.is_model);
}

absl::StatusOr<pl::CostRequest> FromProto(const v1::EstimateCostRequest& request) {
  pl::CostRequest r;
  r.prompt_tokens = request.prompt_tokens();
  r.context_tokens = request.context_tokens();
  r.batch = request.batch();
  r.non_causal = request.non_causal();
  r.compute_dtype = request.compute_dtype();
  ATTEND_ASSIGN_OR_RETURN(r.kv_dtype, FromProto(request.kv_dtype(), "kv_dtype"));
  if (request.state_dtype() != v1::KV_DTYPE_UNSPECIFIED) {
    ATTEND_ASSIGN_OR_RETURN(r.state_dtype, FromProto(request.state_dtype(), "state_dtype"));
  }
  r.weights_dtype = request.weights_dtype();
  if (request.has_parameters()) r.parameters = request.parameters();
  r.price_per_hour_usd = request.price_per_hour_usd();
  return r;
}

void ToProto(const pl::CostEstimate& e, v1::EstimateCostResponse* out) {
  ToProto(e.model, out->mutable_model());
  ToProto(e.hardware, out->mutable_hardware());
  ToProto(e.prefill, out->mutable_prefill());
  ToProto(e.decode, out->mutable_decode());
  out->set_prefill_crossover_tokens(e.prefill_crossover_tokens);
  out->set_decode_crossover_tokens(e.decode_crossover_tokens);
  out->set_prompt_tokens(e.prompt_tokens);
  out->set_context_tokens(e.context_tokens);
  out->set_batch(e.batch);
  out->set_parameters(e.parameters);
  out->set_compute_dtype(e.compute_dtype);
  out->set_peak_flops(e.peak_flops);
  out->set_weights_bytes(e.weights_bytes);
  out->set_kv_cache_bytes(e.kv_cache_bytes);
  out->set_state_bytes(e.state_bytes);
  if (e.fits.has_value()) out->set_fits(*e.fits);
}

void ToProto(const pl::PhaseCost& p, v1::PhaseCost* out) {
  out->set_attention_flops(p.attention_flops);
  out->set_weight_flops(p.weight_flops);
  out->set_bytes_moved(p.bytes_moved);
  out->set_arithmetic_intensity(p.arithmetic_intensity);
  out->set_compute_seconds(p.compute_seconds);
  out->set_memory_seconds(p.memory_seconds);
  out->set_roofline_seconds(p.roofline_seconds);
  out->set_bound(p.bound);
  out->set_tokens_per_second(p.tokens_per_second);
  out->set_usd_per_million_tokens(p.usd_per_million_tokens);
  out->set_weight_bytes(p.weight_bytes);
  out->set_kv_bytes(p.kv_bytes);
  out->set_state_bytes(p.state_bytes);
}

}  // namespace attend::server
