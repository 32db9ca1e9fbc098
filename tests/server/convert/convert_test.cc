// server/convert: every value of each proto enum maps to the core's or the planner's and back,
// and each field's DTYPE_UNSPECIFIED (KV_DTYPE_UNSPECIFIED, PRECISION_UNSPECIFIED) means what its
// proto documents; numbers outside an enum (proto3 enums are open) are refused naming the field.
#include <optional>
#include <string>

#include "attend/v1/kv_cache.pb.h"
#include "attend/v1/planner.pb.h"
#include "attend/v1/tensor.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "server/convert/dtype.h"
#include "server/convert/kv_cache.h"
#include "server/convert/planner.h"
#include "server/convert/tensor.h"
#include "tests/test_util.h"

namespace attend::server {
namespace {

using ::attend::testing::StatusIs;

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt8};

TEST(ConvertDType, EveryProtoValueMapsAndRoundTrips) {
  const google::protobuf::EnumDescriptor* values = v1::DType_descriptor();
  ASSERT_GT(values->value_count(), 1);
  for (int i = 0; i < values->value_count(); ++i) {
    const auto value = static_cast<v1::DType>(values->value(i)->number());
    SCOPED_TRACE(values->value(i)->name());
    if (value == v1::DTYPE_UNSPECIFIED) continue;
    const std::optional<DType> core = FromProto(value, kUnspecifiedTensorDType);
    ASSERT_TRUE(core.has_value());
    EXPECT_EQ(FromProto(value, kUnspecifiedKvDType), core);  // the default only for UNSPECIFIED
    EXPECT_EQ(ToProto(*core), value);
  }
}

TEST(ConvertDType, EveryCoreDTypeHasItsOwnProtoValue) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const v1::DType proto = ToProto(dtype);
    EXPECT_NE(proto, v1::DTYPE_UNSPECIFIED);
    EXPECT_EQ(FromProto(proto, kUnspecifiedTensorDType), dtype);
  }
}

TEST(ConvertDType, UnspecifiedIsTheCallersDefault) {
  for (DType dtype : kAllDTypes) EXPECT_EQ(FromProto(v1::DTYPE_UNSPECIFIED, dtype), dtype);
  // As tensor.proto and kv_cache.proto document them.
  EXPECT_EQ(kUnspecifiedTensorDType, DType::kFloat32);
  EXPECT_EQ(kUnspecifiedKvDType, DType::kBFloat16);
}

TEST(ConvertDType, NumbersOutsideTheEnumAreNoDType) {
  EXPECT_EQ(FromProto(static_cast<v1::DType>(99), DType::kFloat32), std::nullopt);
  EXPECT_EQ(FromProto(static_cast<v1::DType>(-1), DType::kFloat32), std::nullopt);
}

TEST(ConvertTensor, UnspecifiedTensorAndOutputDTypesAreFloat32) {
  v1::Tensor tensor;
  tensor.add_shape(2);
  tensor.add_values(1.0f);
  tensor.add_values(2.0f);
  absl::StatusOr<DecodedTensor> decoded = DecodeTensor(tensor, "q", 1 << 20);
  ASSERT_OK(decoded);
  EXPECT_EQ(decoded->view.dtype, DType::kFloat32);
  EXPECT_TRUE(decoded->from_values);
  EXPECT_EQ(DecodeOutputDType(v1::DTYPE_UNSPECIFIED, "output_dtype").value(), DType::kFloat32);
}

TEST(ConvertTensor, TensorsAndOutputsTakeEveryDTypeButInt8) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    EXPECT_EQ(DecodeOutputDType(ToProto(dtype), "output_dtype").value(), dtype);
    v1::Tensor tensor;
    tensor.set_dtype(ToProto(dtype));
    tensor.add_shape(3);
    tensor.set_data(std::string(static_cast<size_t>(3 * DTypeSize(dtype)), '\0'));
    absl::StatusOr<DecodedTensor> decoded = DecodeTensor(tensor, "k", 1 << 20);
    ASSERT_OK(decoded);
    EXPECT_EQ(decoded->view.dtype, dtype);
  }
  EXPECT_THAT(DecodeOutputDType(v1::INT8, "output_dtype"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"output_dtype: INT8", "storage"}));
  EXPECT_THAT(
      DecodeOutputDType(static_cast<v1::DType>(99), "output_dtype"),
      StatusIs(absl::StatusCode::kInvalidArgument, {"output_dtype: unknown dtype value 99"}));
  v1::Tensor tensor;
  tensor.add_shape(1);
  tensor.set_data("x");
  tensor.set_dtype(v1::INT8);
  EXPECT_THAT(DecodeTensor(tensor, "steps[2].k", 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, {"steps[2].k.dtype: INT8", "storage"}));
  tensor.set_dtype(static_cast<v1::DType>(7));
  EXPECT_THAT(DecodeTensor(tensor, "v", 1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, {"v.dtype: unknown value 7"}));
}

TEST(ConvertTensor, EncodedTensorsCarryTheirDType) {
  const float values[] = {1.0f, -2.0f};
  const int64_t shape[] = {2};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    v1::Tensor out;
    EncodeTensor(values, shape, /*as_values=*/false, dtype, &out);
    EXPECT_EQ(out.dtype(), ToProto(dtype));
    EXPECT_EQ(static_cast<int64_t>(out.data().size()), 2 * DTypeSize(dtype));
    EncodeTensor(values, shape, /*as_values=*/true, dtype, &out);
    EXPECT_EQ(out.dtype(), v1::FLOAT32);  // values are float32 whatever was asked
    EXPECT_EQ(out.values_size(), 2);
  }
}

TEST(ConvertTensor, EveryPrecisionMaps) {
  const google::protobuf::EnumDescriptor* values = v1::Precision_descriptor();
  for (int i = 0; i < values->value_count(); ++i) {
    SCOPED_TRACE(values->value(i)->name());
    EXPECT_OK(DecodePrecision(static_cast<v1::Precision>(values->value(i)->number())));
  }
  EXPECT_EQ(DecodePrecision(v1::PRECISION_UNSPECIFIED).value(), Precision::kAuto);
  EXPECT_EQ(DecodePrecision(v1::PRECISION_FLOAT32).value(), Precision::kFloat32);
  EXPECT_EQ(DecodePrecision(v1::PRECISION_BFLOAT16).value(), Precision::kBFloat16);
  EXPECT_THAT(DecodePrecision(static_cast<v1::Precision>(9)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"precision: unknown value 9"}));
}

TEST(ConvertTensor, ComputeStatsGetTheEnginesFigures) {
  AttentionStats stats;
  stats.attended_pairs = 12;
  stats.attention_flops = 3072;
  stats.compute_seconds = 0.25;
  stats.engine = "onednn/f32";
  v1::ComputeStats out;
  out.set_queue_seconds(1.5);  // the service's: left as it was
  ToProto(stats, &out);
  EXPECT_EQ(out.attended_pairs(), 12);
  EXPECT_EQ(out.attention_flops(), 3072);
  EXPECT_EQ(out.compute_seconds(), 0.25);
  EXPECT_EQ(out.engine(), "onednn/f32");
  EXPECT_EQ(out.queue_seconds(), 1.5);
}

v1::SequenceConfig ProtoConfig(v1::DType kv_dtype) {
  v1::SequenceConfig c;
  c.set_layers(2);
  c.set_n_head(8);
  c.set_n_head_kv(2);
  c.set_head_dim(64);
  c.set_head_dim_v(32);
  c.set_kv_dtype(kv_dtype);
  c.set_window_tokens(100);
  return c;
}

TEST(ConvertKvCache, SequenceConfigKvDTypeDefaultsToBFloat16) {
  absl::StatusOr<kv::SequenceConfig> config = FromProto(ProtoConfig(v1::DTYPE_UNSPECIFIED));
  ASSERT_OK(config);
  EXPECT_EQ(config->kv_dtype, DType::kBFloat16);
  EXPECT_EQ(config->layers, 2);
  EXPECT_EQ(config->n_head, 8);
  EXPECT_EQ(config->n_head_kv, 2);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->head_dim_v, 32);
  EXPECT_EQ(config->window, 100);
  EXPECT_FALSE(config->scale.has_value());
}

TEST(ConvertKvCache, SequenceConfigPassesEveryKnownDTypeOn) {
  // FLOAT16 too: the cache, not the conversion, refuses it, with its reason.
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    absl::StatusOr<kv::SequenceConfig> config = FromProto(ProtoConfig(ToProto(dtype)));
    ASSERT_OK(config);
    EXPECT_EQ(config->kv_dtype, dtype);
  }
  EXPECT_THAT(FromProto(ProtoConfig(static_cast<v1::DType>(42))),
              StatusIs(absl::StatusCode::kInvalidArgument, {"config.kv_dtype: unknown value 42"}));
}

TEST(ConvertKvCache, SequenceInfoRoundTripsItsConfig) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt8}) {
    SCOPED_TRACE(DTypeName(dtype));
    v1::SequenceConfig proto = ProtoConfig(ToProto(dtype));
    proto.set_scale(0.5f);
    kv::SequenceInfo info;
    info.id = "s";
    info.config = FromProto(proto).value();
    info.layer_tokens = {3, 4};
    info.tokens = 7;
    info.tokens_per_block = 16;
    v1::SequenceInfo out;
    ToProto(info, &out);
    EXPECT_EQ(out.sequence_id(), "s");
    EXPECT_EQ(out.config().SerializeAsString(), proto.SerializeAsString());
    EXPECT_THAT(out.layer_tokens(), ::testing::ElementsAre(3, 4));
    EXPECT_EQ(out.tokens(), 7);
    EXPECT_EQ(out.tokens_per_block(), 16);
  }
}

TEST(ConvertKvCache, CacheStatsDeriveTheUsageRatio) {
  kv::CacheStats stats;
  stats.capacity_bytes = 1000;
  stats.used_bytes = 250;
  stats.policy = kv::EvictionPolicy::kLru;
  v1::CacheStats out;
  ToProto(stats, &out);
  EXPECT_EQ(out.usage_ratio(), 0.25);
  EXPECT_EQ(out.eviction_policy(), "lru");
  stats.capacity_bytes = 0;
  ToProto(stats, &out);
  EXPECT_EQ(out.usage_ratio(), 0.0);
}

TEST(ConvertPlanner, EveryKvDTypeMapsAndRoundTrips) {
  const google::protobuf::EnumDescriptor* values = v1::KvDType_descriptor();
  for (int i = 0; i < values->value_count(); ++i) {
    const auto value = static_cast<v1::KvDType>(values->value(i)->number());
    SCOPED_TRACE(values->value(i)->name());
    absl::StatusOr<planner::KvDType> dtype = FromProto(value, "kv_dtype");
    ASSERT_OK(dtype);
    // KV_DTYPE_UNSPECIFIED is float16 in kv_dtype (planner.proto), and comes back as such.
    EXPECT_EQ(ToProto(*dtype), value == v1::KV_DTYPE_UNSPECIFIED ? v1::KV_FLOAT16 : value);
  }
  EXPECT_THAT(FromProto(static_cast<v1::KvDType>(8), "state_dtype"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"state_dtype: 8 is not a KvDType"}));
}

TEST(ConvertPlanner, UnspecifiedStateAndIndexerDTypesAreLeftToThePlanner) {
  v1::PlanKvCacheRequest plan;
  absl::StatusOr<planner::KvPlanRequest> r = FromProto(plan);
  ASSERT_OK(r);
  EXPECT_EQ(r->kv_dtype, planner::KvDType::kFloat16);
  EXPECT_EQ(r->state_dtype, std::nullopt);    // the kv_dtype
  EXPECT_EQ(r->indexer_dtype, std::nullopt);  // as published
  plan.set_state_dtype(v1::KV_FLOAT32);
  plan.set_indexer_dtype(v1::KV_INT8);
  r = FromProto(plan);
  ASSERT_OK(r);
  EXPECT_EQ(r->state_dtype, planner::KvDType::kFloat32);
  EXPECT_EQ(r->indexer_dtype, planner::KvDType::kInt8);

  v1::EstimateCostRequest cost;
  absl::StatusOr<planner::CostRequest> c = FromProto(cost);
  ASSERT_OK(c);
  EXPECT_EQ(c->kv_dtype, planner::KvDType::kFloat16);
  EXPECT_EQ(c->state_dtype, std::nullopt);
  cost.set_state_dtype(static_cast<v1::KvDType>(-3));
  EXPECT_THAT(FromProto(cost), StatusIs(absl::StatusCode::kInvalidArgument, {"state_dtype: -3"}));
}

}  // namespace
}  // namespace attend::server
