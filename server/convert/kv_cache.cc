#include "server/convert/kv_cache.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/convert/dtype.h"

namespace attend::server {

absl::StatusOr<kv::SequenceConfig> FromProto(const v1::SequenceConfig& c) {
  kv::SequenceConfig config;
  config.layers = c.layers();
  config.n_head = c.n_head();
  config.n_head_kv = c.n_head_kv();
  config.head_dim = c.head_dim();
  config.head_dim_v = c.head_dim_v();
  const std::optional<DType> kv_dtype = FromProto(c.kv_dtype(), kUnspecifiedKvDType);
  if (!kv_dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.kv_dtype: unknown value ", static_cast<int>(c.kv_dtype())));
  }
  config.kv_dtype = *kv_dtype;  // FLOAT16 too: refused by the cache with the reason
  if (c.has_scale()) config.scale = c.scale();
  config.window = c.window_tokens();
  return config;
}

void ToProto(const kv::SequenceInfo& info, v1::SequenceInfo* out) {
  out->set_sequence_id(info.id);
  v1::SequenceConfig* c = out->mutable_config();
  // The cache bounds these far below 2^31 (KvCache::Create).
  c->set_layers(static_cast<int32_t>(info.config.layers));
  c->set_n_head(static_cast<int32_t>(info.config.n_head));
  c->set_n_head_kv(static_cast<int32_t>(info.config.n_head_kv));
  c->set_head_dim(static_cast<int32_t>(info.config.head_dim));
  c->set_head_dim_v(static_cast<int32_t>(info.config.head_dim_v));
  c->set_kv_dtype(ToProto(info.config.kv_dtype));
  if (info.config.scale) c->set_scale(*info.config.scale);
  c->set_window_tokens(info.config.window);
  out->mutable_layer_tokens()->Add(info.layer_tokens.begin(), info.layer_tokens.end());
  out->set_tokens(info.tokens);
  out->set_blocks(info.blocks);
  out->set_shared_blocks(info.shared_blocks);
  out->set_bytes(info.bytes);
  out->set_reserved_tokens(info.reserved_tokens);
  out->set_forked_from(info.forked_from);
  out->set_created_unix_ms(info.created_ms);
  out->set_last_used_unix_ms(info.last_used_ms);
  out->set_tokens_per_block(info.tokens_per_block);
}

void ToProto(const kv::CacheStats& s, v1::CacheStats* out) {
  out->set_capacity_bytes(s.capacity_bytes);
  out->set_used_bytes(s.used_bytes);
  out->set_usage_ratio(s.capacity_bytes > 0 ? static_cast<double>(s.used_bytes) / s.capacity_bytes
                                            : 0.0);
  out->set_block_bytes(s.block_bytes);
  out->set_blocks_total(s.blocks_total);
  out->set_blocks_used(s.blocks_used);
  out->set_blocks_free(s.blocks_free);
  out->set_sequences(s.sequences);
  out->set_tokens(s.tokens);
  out->set_evictions(s.evictions);
  out->set_rejections(s.rejections);
  out->set_eviction_policy(std::string(kv::EvictionPolicyName(s.policy)));
  out->set_bookkeeping_bytes(s.bookkeeping_bytes);
  out->set_bookkeeping_limit_bytes(s.bookkeeping_limit_bytes);
}

}  // namespace attend::server
