#include "server/planner_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "planner/catalog.h"
#include "planner/cost.h"
#include "planner/import/gguf.h"
#include "planner/import/hf_config.h"
#include "planner/kv_plan.h"
#include "server/convert/planner.h"
#include "server/service_support.h"

namespace attend::server {
namespace {

namespace pl = ::attend::planner;

// Import errors name keys inside the input ("num_hidden_layers is missing", "config.json: line 3,
// column 5: ..."); the request field they came through is their subject.
absl::Status InField(const absl::Status& status, absl::string_view field) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
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
  return pl::FindModel(name, field);
}

// The canonical model a ModelRef names or spells out.
absl::StatusOr<pl::ModelSpec> ResolveModel(bool has_model, const v1::ModelRef& ref) {
  if (!has_model) return MissingModel();
  switch (ref.model_case()) {
    case v1::ModelRef::kName:
      return FindPreset(ref.name(), "model.name");
    case v1::ModelRef::kSpec: {
      ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec model, FromProto(ref.spec(), "model.spec"));
      return pl::CanonicalModel(model, "model.spec");
    }
    case v1::ModelRef::MODEL_NOT_SET:
      break;
  }
  return MissingModel();
}

// The hardware an EstimateCostRequest names (profile) or spells out (custom).
absl::StatusOr<pl::HardwareProfile> ResolveHardware(const v1::EstimateCostRequest& request) {
  switch (request.hardware_case()) {
    case v1::EstimateCostRequest::kProfile:
      // "local" waits here for the measurement when the background run has not finished.
      return pl::FindHardware(request.profile(), "profile");
    case v1::EstimateCostRequest::kCustom: {
      pl::HardwareProfile hardware = FromProto(request.custom());
      ATTEND_RETURN_IF_ERROR(pl::ValidateHardware(hardware, "custom"));
      return hardware;
    }
    case v1::EstimateCostRequest::HARDWARE_NOT_SET:
      break;
  }
  std::vector<std::string> names;
  for (const pl::HardwareProfile& h : pl::HardwareCatalog()) names.push_back(h.name);
  names.push_back("local");
  return absl::InvalidArgumentError(absl::StrCat("hardware: missing; give profile (",
                                                 absl::StrJoin(names, ", "),
                                                 ") or custom (peak FLOP/s and memory bandwidth)"));
}

absl::Status CheckImportSize(absl::string_view field, size_t bytes, int64_t limit,
                             absl::string_view hint) {
  if (static_cast<int64_t>(bytes) <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(field, ": ", bytes, " bytes, over the limit of ", limit, " bytes; ", hint));
}

}  // namespace

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
  // A measurement in progress cannot be interrupted (it is one static initialisation in the
  // planner); joining it keeps oneDNN and OpenMP from running while the process exits.
  if (measure_thread_.joinable()) measure_thread_.join();
}

grpc::ServerUnaryReactor* PlannerService::ListModels(grpc::CallbackServerContext* context,
                                                     const v1::ListModelsRequest*,
                                                     v1::ListModelsResponse* response) {
  return RunOnPool(context, "ListModels", pool_, metrics_, gate_, [response](const CallWork&) {
    for (const pl::ModelSpec& m : pl::Catalog()) ToProto(m, response->add_models());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PlannerService::GetModel(grpc::CallbackServerContext* context,
                                                   const v1::GetModelRequest* request,
                                                   v1::ModelSpec* response) {
  return RunOnPool(context, "GetModel", pool_, metrics_, gate_,
                   [request, response](const CallWork&) -> absl::Status {
                     ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec m,
                                             FindPreset(request->name(), "name"));
                     ToProto(m, response);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* PlannerService::ImportModel(grpc::CallbackServerContext* context,
                                                      const v1::ImportModelRequest* request,
                                                      v1::ModelSpec* response) {
  return RunOnPool(
      context, "ImportModel", pool_, metrics_, gate_,
      [this, request, response](const CallWork&) { return DoImportModel(*request, response); });
}

grpc::ServerUnaryReactor* PlannerService::PlanKvCache(grpc::CallbackServerContext* context,
                                                      const v1::PlanKvCacheRequest* request,
                                                      v1::PlanKvCacheResponse* response) {
  return RunOnPool(
      context, "PlanKvCache", pool_, metrics_, gate_,
      [this, request, response](const CallWork&) { return DoPlanKvCache(*request, response); });
}

grpc::ServerUnaryReactor* PlannerService::EstimateCost(grpc::CallbackServerContext* context,
                                                       const v1::EstimateCostRequest* request,
                                                       v1::EstimateCostResponse* response) {
  return RunOnPool(
      context, "EstimateCost", pool_, metrics_, gate_,
      [this, request, response](const CallWork&) { return DoEstimateCost(*request, response); });
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
      // ImportGguf's errors start with "gguf: ", which is this field's name too.
      model = pl::ImportGguf(request.gguf(), request.name());
      break;
    case v1::ImportModelRequest::SOURCE_NOT_SET:
      return absl::InvalidArgumentError(
          "source: neither hf_config_json (the text of a Hugging Face config.json) nor gguf (the "
          "start of a GGUF file) is set");
  }
  if (!model.ok()) return model.status();
  ToProto(*model, response);
  return absl::OkStatus();
}

absl::Status PlannerService::DoPlanKvCache(const v1::PlanKvCacheRequest& request,
                                           v1::PlanKvCacheResponse* response) const {
  ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec model,
                          ResolveModel(request.has_model(), request.model()));
  ATTEND_ASSIGN_OR_RETURN(const pl::KvPlanRequest r, FromProto(request));
  ATTEND_ASSIGN_OR_RETURN(const pl::KvPlan plan, pl::PlanKvCache(model, r));
  ToProto(plan, response);
  return absl::OkStatus();
}

absl::Status PlannerService::DoEstimateCost(const v1::EstimateCostRequest& request,
                                            v1::EstimateCostResponse* response) const {
  ATTEND_ASSIGN_OR_RETURN(const pl::ModelSpec model,
                          ResolveModel(request.has_model(), request.model()));
  ATTEND_ASSIGN_OR_RETURN(const pl::HardwareProfile hardware, ResolveHardware(request));
  ATTEND_ASSIGN_OR_RETURN(const pl::CostRequest r, FromProto(request));
  ATTEND_ASSIGN_OR_RETURN(const pl::CostEstimate e, pl::EstimateCost(model, r, hardware));
  ToProto(e, response);
  return absl::OkStatus();
}

}  // namespace attend::server
