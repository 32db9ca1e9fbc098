#include "server/planner_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "planner/catalog.h"
#include "planner/cost.h"
#include "planner/import/gguf.h"
#include "planner/import/hf_config.h"
#include "planner/kv_plan.h"
#include "server/service_support.h"

namespace attend::server {
namespace {

namespace pl = ::attend::planner;

// Core errors name fields relative to the struct they check ("n_head_kv: 3 does not divide
// n_head 32"); a caller sees them relative to the request ("model.spec.n_head_kv: ..."). A
// message that does not start with a field gets the path as its subject instead.
absl::Status Prefixed(const absl::Status& status, absl::string_view path) {
  if (status.ok()) return status;
  const absl::string_view message = status.message();
  size_t i = 0;
  while (i < message.size() && (absl::ascii_islower(message[i]) ||
                                absl::ascii_isdigit(message[i]) || message[i] == '_')) {
    ++i;
  }
  const bool starts_with_field =
      i > 0 && i < message.size() && (message[i] == ':' || message[i] == '.' || message[i] == '[');
  return absl::Status(status.code(), starts_with_field ? absl::StrCat(path, ".", message)
                                                       : absl::StrCat(path, ": ", message));
}

// Import errors name keys inside the input ("num_hidden_layers is missing", "config.json: line 3,
// column 5: ..."); the request field they came through is their subject.
absl::Status InField(const absl::Status& status, absl::string_view field) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

// ValidateHardware names fields "hardware.<figure>"; in EstimateCostRequest they sit in
// `custom`.
absl::Status RenamedHardwareError(const absl::Status& status) {
  if (status.ok()) return status;
  absl::string_view message = status.message();
  if (absl::ConsumePrefix(&message, "hardware")) {
    return absl::Status(status.code(), absl::StrCat("custom", message));
  }
  return Prefixed(status, "custom");
}

absl::Status MissingModel() {
  return absl::InvalidArgumentError(absl::StrCat(
      "model: missing; give model.name (a catalog key: ", absl::StrJoin(pl::CatalogNames(), ", "),
      ") or model.spec"));
}

absl::StatusOr<pl::ModelSpec> FindPreset(absl::string_view name, absl::string_view field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": empty; give a catalog key: ", absl::StrJoin(pl::CatalogNames(), ", ")));
  }
  absl::StatusOr<pl::ModelSpec> model = pl::FindModel(name);
  if (!model.ok()) return Prefixed(model.status(), field);
  return model;
}

// The canonical model a ModelRef names or spells out.
absl::StatusOr<pl::ModelSpec> ResolveModel(bool has_model, const v1::ModelRef& ref) {
  if (!has_model) return MissingModel();
  switch (ref.model_case()) {
    case v1::ModelRef::kName:
      return FindPreset(ref.name(), "model.name");
    case v1::ModelRef::kSpec: {
      absl::StatusOr<pl::ModelSpec> model = ModelFromProto(ref.spec());
      if (model.ok()) model = pl::CanonicalModel(*model);
      if (!model.ok()) return Prefixed(model.status(), "model.spec");
      return model;
    }
    case v1::ModelRef::MODEL_NOT_SET:
      break;
  }
  return MissingModel();
}

absl::Status CheckImportSize(absl::string_view field, size_t bytes, int64_t limit,
                             absl::string_view hint) {
  if (static_cast<int64_t>(bytes) <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", bytes, " bytes, over the limit of ", limit, " bytes; ", hint));
}

void BudgetToProto(const pl::BudgetPlan& b, v1::BudgetPlan* out) {
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

void PhaseToProto(const pl::PhaseCost& p, v1::PhaseCost* out) {
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
}

}  // namespace

absl::StatusOr<pl::ModelSpec> ModelFromProto(const v1::ModelSpec& spec) {
  // Bounded before the copy: a hostile message may carry millions of entries.
  if (spec.layer_specs_size() > pl::kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_specs: ", spec.layer_specs_size(),
                                                   " entries; at most ", pl::kMaxLayers));
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
  for (const v1::LayerSpec& l : spec.layer_specs()) {
    m.layer_specs.push_back(pl::LayerSpec{l.n_head_kv(), l.window_tokens()});
  }
  m.max_context_tokens = spec.max_context_tokens();
  m.weights_dtype = spec.weights_dtype();
  m.tied_embeddings = spec.tied_embeddings();
  return m;
}

void ModelToProto(const pl::ModelSpec& m, v1::ModelSpec* out) {
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
  for (const pl::LayerSpec& l : m.layer_specs) {
    v1::LayerSpec* layer = out->add_layer_specs();
    layer->set_n_head_kv(static_cast<int32_t>(l.n_head_kv));
    layer->set_window_tokens(l.window_tokens);
  }
  out->set_max_context_tokens(m.max_context_tokens);
  out->set_weights_dtype(m.weights_dtype);
  out->set_tied_embeddings(m.tied_embeddings);
  out->set_architecture(m.architecture);
  out->set_parameters_source(m.parameters_source);
}

absl::StatusOr<pl::KvDType> KvDTypeFromProto(int value, absl::string_view field) {
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
      field, ": ", value,
      " is not a KvDType; use KV_FLOAT32 (1), KV_FLOAT16 (2, also 0), KV_BFLOAT16 (3), KV_FP8 (4), "
      "KV_INT8 (5), KV_Q8_0 (6) or KV_Q4_0 (7)"));
}

v1::KvDType KvDTypeToProto(pl::KvDType dtype) {
  // The core enum lists the same types in the proto's order, without UNSPECIFIED.
  return static_cast<v1::KvDType>(static_cast<int>(dtype) + 1);
}

pl::HardwareProfile HardwareFromProto(const v1::HardwareProfile& p) {
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

void HardwareToProto(const pl::HardwareProfile& h, v1::HardwareProfile* out) {
  out->set_name(h.name);
  out->set_peak_flops_f32(h.peak_flops_f32);
  out->set_peak_flops_bf16(h.peak_flops_bf16);
  out->set_peak_flops_fp8(h.peak_flops_fp8);
  out->set_memory_bandwidth_bytes_per_second(h.memory_bandwidth_bytes_per_second);
  out->set_memory_bytes(h.memory_bytes);
  out->set_note(h.note);
}

PlannerService::PlannerService(WorkerPool* pool, Metrics* metrics, CallGate* gate,
                               PlannerOptions options)
    : options_(options), pool_(pool), metrics_(metrics), gate_(gate) {
  if (options_.measure_local_after != absl::InfiniteDuration()) {
    measure_thread_ = std::thread([this] {
      if (stop_.WaitForNotificationWithTimeout(options_.measure_local_after)) return;
      (void)pl::LocalHardware();  // cached for the process; failures are reported per request
      local_measured_.Notify();
    });
  }
}

PlannerService::~PlannerService() {
  stop_.Notify();
  // A measurement in progress cannot be interrupted (it is one static initialisation in core);
  // joining it keeps oneDNN and OpenMP from running while the process exits.
  if (measure_thread_.joinable()) measure_thread_.join();
}

grpc::ServerUnaryReactor* PlannerService::ListModels(grpc::CallbackServerContext* context,
                                                     const v1::ListModelsRequest*,
                                                     v1::ListModelsResponse* response) {
  return RunOnPool(context, pool_, metrics_, gate_, [response](const CallWork&) {
    for (const pl::ModelSpec& m : pl::Catalog()) ModelToProto(m, response->add_models());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PlannerService::GetModel(grpc::CallbackServerContext* context,
                                                   const v1::GetModelRequest* request,
                                                   v1::ModelSpec* response) {
  return RunOnPool(
      context, pool_, metrics_, gate_, [request, response](const CallWork&) -> absl::Status {
        ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec m, FindPreset(request->name(), "name"));
        ModelToProto(m, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* PlannerService::ImportModel(grpc::CallbackServerContext* context,
                                                      const v1::ImportModelRequest* request,
                                                      v1::ModelSpec* response) {
  return RunOnPool(context, pool_, metrics_, gate_, [this, request, response](const CallWork&) {
    return DoImportModel(*request, response);
  });
}

grpc::ServerUnaryReactor* PlannerService::PlanKvCache(grpc::CallbackServerContext* context,
                                                      const v1::PlanKvCacheRequest* request,
                                                      v1::PlanKvCacheResponse* response) {
  return RunOnPool(context, pool_, metrics_, gate_, [this, request, response](const CallWork&) {
    return DoPlanKvCache(*request, response);
  });
}

grpc::ServerUnaryReactor* PlannerService::EstimateCost(grpc::CallbackServerContext* context,
                                                       const v1::EstimateCostRequest* request,
                                                       v1::EstimateCostResponse* response) {
  return RunOnPool(context, pool_, metrics_, gate_, [this, request, response](const CallWork&) {
    return DoEstimateCost(*request, response);
  });
}

absl::Status PlannerService::DoImportModel(const v1::ImportModelRequest& request,
                                           v1::ModelSpec* response) const {
  // Checked here rather than by CanonicalModel so that the error names this request's field.
  if (request.name().size() > pl::kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: ", request.name().size(), " bytes; at most ", pl::kMaxNameBytes));
  }
  absl::StatusOr<pl::ModelSpec> model;
  switch (request.source_case()) {
    case v1::ImportModelRequest::kHfConfigJson:
      ATTEND_RETURN_IF_ERROR(CheckImportSize("hf_config_json", request.hf_config_json().size(),
                                             options_.max_hf_config_json_bytes,
                                             "send the model's config.json, which is a few KiB"));
      model = pl::ImportHfConfig(request.hf_config_json(), request.name());
      if (!model.ok()) return InField(model.status(), "hf_config_json");
      break;
    case v1::ImportModelRequest::kGguf:
      ATTEND_RETURN_IF_ERROR(CheckImportSize(
          "gguf", request.gguf().size(), options_.max_gguf_bytes,
          "send only the start of the file (header and metadata), not the tensors"));
      model = pl::ImportGguf(request.gguf(), request.name());
      // The GGUF reader's messages already start with "gguf: ".
      if (!model.ok() && !absl::StartsWith(model.status().message(), "gguf")) {
        return InField(model.status(), "gguf");
      }
      break;
    case v1::ImportModelRequest::SOURCE_NOT_SET:
      return absl::InvalidArgumentError(
          "source: neither hf_config_json (the text of a Hugging Face config.json) nor gguf (the "
          "start of a GGUF file) is set");
  }
  if (!model.ok()) return model.status();
  ModelToProto(*model, response);
  return absl::OkStatus();
}

absl::Status PlannerService::DoPlanKvCache(const v1::PlanKvCacheRequest& request,
                                           v1::PlanKvCacheResponse* response) const {
  ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec model,
                          ResolveModel(request.has_model(), request.model()));
  pl::KvPlanRequest r;
  ATTEND_ASSIGN_OR_RETURN(r.kv_dtype, KvDTypeFromProto(request.kv_dtype(), "kv_dtype"));
  r.context_tokens = request.context_tokens();
  r.batch = request.batch();
  r.block_tokens = request.block_tokens();
  r.memory_budget_bytes = request.memory_budget_bytes();
  r.subtract_weights = request.subtract_weights();
  if (request.has_weights_bytes()) r.weights_bytes = request.weights_bytes();
  r.weights_dtype = request.weights_dtype();
  ATTEND_ASSIGN_OR_RETURN(const pl::KvPlan plan, pl::PlanKvCache(model, r));

  ModelToProto(plan.model, response->mutable_model());
  response->set_kv_dtype(KvDTypeToProto(plan.kv_dtype));
  response->set_bytes_per_value(plan.bytes_per_value);
  response->set_bytes_per_token(plan.bytes_per_token);
  response->set_bytes_per_sequence(plan.bytes_per_sequence);
  response->set_total_bytes(plan.total_bytes);
  if (plan.paged) {
    v1::PagedPlan* p = response->mutable_paged();
    p->set_block_tokens(plan.paged->block_tokens);
    p->set_blocks_per_sequence(plan.paged->blocks_per_sequence);
    p->set_allocated_bytes_per_sequence(plan.paged->allocated_bytes_per_sequence);
    p->set_allocated_bytes(plan.paged->allocated_bytes);
    p->set_waste_bytes(plan.paged->waste_bytes);
  }
  if (plan.budget) BudgetToProto(*plan.budget, response->mutable_budget());
  for (const pl::VariantRow& v : plan.variants) {
    v1::VariantRow* row = response->add_variants();
    row->set_variant(v.variant);
    row->set_n_head_kv(static_cast<int32_t>(v.n_head_kv));
    row->set_group_size(static_cast<int32_t>(v.group_size));
    row->set_bytes_per_token(v.bytes_per_token);
    row->set_bytes_per_sequence(v.bytes_per_sequence);
    row->set_is_model(v.is_model);
  }
  response->set_full_attention_bytes_per_token(plan.full_attention_bytes_per_token);
  response->set_context_tokens(plan.context_tokens);
  response->set_batch(plan.batch);
  return absl::OkStatus();
}

absl::Status PlannerService::DoEstimateCost(const v1::EstimateCostRequest& request,
                                            v1::EstimateCostResponse* response) const {
  ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec model,
                          ResolveModel(request.has_model(), request.model()));
  pl::HardwareProfile hardware;
  switch (request.hardware_case()) {
    case v1::EstimateCostRequest::kProfile: {
      // "local" waits here for the measurement when the background run has not finished.
      absl::StatusOr<pl::HardwareProfile> found = pl::FindHardware(request.profile());
      if (!found.ok()) return Prefixed(found.status(), "profile");
      hardware = *std::move(found);
      break;
    }
    case v1::EstimateCostRequest::kCustom:
      hardware = HardwareFromProto(request.custom());
      ATTEND_RETURN_IF_ERROR(RenamedHardwareError(pl::ValidateHardware(hardware)));
      break;
    case v1::EstimateCostRequest::HARDWARE_NOT_SET: {
      std::vector<std::string> names;
      for (const pl::HardwareProfile& h : pl::HardwareCatalog()) names.push_back(h.name);
      names.push_back("local");
      return absl::InvalidArgumentError(
          absl::StrCat("hardware: missing; give profile (", absl::StrJoin(names, ", "),
                       ") or custom (peak FLOP/s and memory bandwidth)"));
    }
  }
  pl::CostRequest r;
  r.prompt_tokens = request.prompt_tokens();
  r.context_tokens = request.context_tokens();
  r.batch = request.batch();
  r.non_causal = request.non_causal();
  r.compute_dtype = request.compute_dtype();
  ATTEND_ASSIGN_OR_RETURN(r.kv_dtype, KvDTypeFromProto(request.kv_dtype(), "kv_dtype"));
  r.weights_dtype = request.weights_dtype();
  if (request.has_parameters()) r.parameters = request.parameters();
  r.price_per_hour_usd = request.price_per_hour_usd();
  ATTEND_ASSIGN_OR_RETURN(const pl::CostEstimate e, pl::EstimateCost(model, r, hardware));

  ModelToProto(e.model, response->mutable_model());
  HardwareToProto(e.hardware, response->mutable_hardware());
  PhaseToProto(e.prefill, response->mutable_prefill());
  PhaseToProto(e.decode, response->mutable_decode());
  response->set_prefill_crossover_tokens(e.prefill_crossover_tokens);
  response->set_decode_crossover_tokens(e.decode_crossover_tokens);
  response->set_prompt_tokens(e.prompt_tokens);
  response->set_context_tokens(e.context_tokens);
  response->set_batch(e.batch);
  response->set_parameters(e.parameters);
  response->set_compute_dtype(e.compute_dtype);
  response->set_peak_flops(e.peak_flops);
  return absl::OkStatus();
}

}  // namespace attend::server
