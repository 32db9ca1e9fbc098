// Conversions between the attend.v1 KvCache messages and the core KV cache's structs
// (core/kv_cache/kv_cache.h), under the naming scheme of server/convert/planner.h:
// FromProto(message) returns the core value, ToProto(value, message*) fills the message.
//
// A SequenceConfig's kv_dtype maps through server/convert/dtype.h with DTYPE_UNSPECIFIED as
// BFLOAT16 (kUnspecifiedKvDType), the storage default kv_cache.proto documents; any known dtype
// is passed on, FLOAT16 included, so that the cache refuses what it cannot store with its own
// reason. Every other check of a config is the cache's (KvCache::Create).
//
// Thread-safety: pure functions.
#ifndef ATTEND_SERVER_CONVERT_KV_CACHE_H_
#define ATTEND_SERVER_CONVERT_KV_CACHE_H_

#include "absl/status/statusor.h"
#include "attend/v1/kv_cache.pb.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::server {

// INVALID_ARGUMENT naming config.kv_dtype for a value that is not a DType (proto3 enums are
// open: any int32 arrives).
absl::StatusOr<kv::SequenceConfig> FromProto(const v1::SequenceConfig& config);
void ToProto(const kv::SequenceInfo& info, v1::SequenceInfo* out);
// Also derives usage_ratio (0 for a cache of no capacity) and names the eviction policy.
void ToProto(const kv::CacheStats& stats, v1::CacheStats* out);

}  // namespace attend::server

#endif  // ATTEND_SERVER_CONVERT_KV_CACHE_H_
