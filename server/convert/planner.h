// Conversions between the attend.v1 planner messages and the planner's structs, under one naming
// scheme: FromProto(message, ...) returns the planner value, and ToProto(value, message*) fills
// the message (ToProto(KvDType) returns the enum value). FromProto returns StatusOr where the
// message can hold what the planner cannot take: an unknown enum value (a KvDType, a layer's
// LayerKind), or more layer_specs than a model has layers.
//
// The planner structs mirror the protos field by field; KvDType's planner value is the proto
// value minus 1, LayerKind's the proto value. KvDType is planner.proto's own enum (it has FP8 and
// the GGUF block types), not attend.v1.DType (server/convert/dtype.h). KV_DTYPE_UNSPECIFIED
// means float16 in kv_dtype (planner.proto), but "the kv_dtype" (nullopt) in a request's
// state_dtype and "as published" (nullopt) in its indexer_dtype: FromProto(KvDType) maps it to
// float16, and the request conversions test for it before calling that. The conversions check only
// what a copy needs; every other check is the planner's (CanonicalModel, ValidateHardware,
// PlanKvCache, EstimateCost). Errors are INVALID_ARGUMENT and name the field by its path in the
// request, which the caller passes in (`field`, or `field_prefix` for the fields of a message).
//
// Thread-safety: pure functions.
#ifndef ATTEND_SERVER_CONVERT_PLANNER_H_
#define ATTEND_SERVER_CONVERT_PLANNER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attend/v1/planner.pb.h"
#include "planner/cost.h"
#include "planner/hardware.h"
#include "planner/kv_plan.h"
#include "planner/model.h"
#include "planner/parameter_counts.h"

namespace attend::server {

// Bounds the repeated field (layer_specs, at most kMaxLayers entries) before copying it, so that
// a hostile message cannot make the copy large; errors name "<field_prefix>.layer_specs".
absl::StatusOr<planner::ModelSpec> FromProto(const v1::ModelSpec& spec,
                                             absl::string_view field_prefix = "");
void ToProto(const planner::ModelSpec& model, v1::ModelSpec* out);

// INVALID_ARGUMENT naming `field` for a value that is not a KvDType (proto3 enums are open: any
// int32 arrives).
absl::StatusOr<planner::KvDType> FromProto(v1::KvDType value, absl::string_view field);
v1::KvDType ToProto(planner::KvDType dtype);

planner::HardwareProfile FromProto(const v1::HardwareProfile& profile);
void ToProto(const planner::HardwareProfile& profile, v1::HardwareProfile* out);

// The request's figures, without its model (a ModelRef, which the service resolves). Errors name
// the request's fields ("kv_dtype: ...").
absl::StatusOr<planner::KvPlanRequest> FromProto(const v1::PlanKvCacheRequest& request);
void ToProto(const planner::KvPlan& plan, v1::PlanKvCacheResponse* out);
void ToProto(const planner::PagedPlan& paged, v1::PagedPlan* out);
void ToProto(const planner::FleetPlan& fleet, v1::FleetPlan* out);
void ToProto(const planner::BudgetPlan& budget, v1::BudgetPlan* out);
void ToProto(const planner::VariantRow& variant, v1::VariantRow* out);
void ToProto(const planner::LayerProjectionKind& kind, v1::ProjectionParameters* out);
void ToProto(const planner::LayerSpec& layer, v1::LayerSpec* out);
void ToProto(const planner::LayerGroupPlan& group, v1::LayerGroupPlan* out);

// The request's figures, without its model and hardware (which the service resolves). Errors
// name the request's fields ("kv_dtype: ...").
absl::StatusOr<planner::CostRequest> FromProto(const v1::EstimateCostRequest& request);
void ToProto(const planner::CostEstimate& estimate, v1::EstimateCostResponse* out);
void ToProto(const planner::PhaseCost& phase, v1::PhaseCost* out);

}  // namespace attend::server

#endif  // ATTEND_SERVER_CONVERT_PLANNER_H_
