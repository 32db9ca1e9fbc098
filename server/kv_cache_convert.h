// What the KvCache service's handlers share across its files (kv_cache_service.cc and
// kv_cache_snapshot_rpcs.cc): the id check of every call that names a sequence, and a
// SequenceInfo in the API's form.
#ifndef ATTEND_SERVER_KV_CACHE_CONVERT_H_
#define ATTEND_SERVER_KV_CACHE_CONVERT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attend/v1/kv_cache.pb.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::server {

// INVALID_ARGUMENT naming `field` when `id` is empty; OK otherwise.
absl::Status RequireId(absl::string_view id, absl::string_view field);

void ToProto(const kv::SequenceInfo& info, v1::SequenceInfo* out);

}  // namespace attend::server

#endif  // ATTEND_SERVER_KV_CACHE_CONVERT_H_
