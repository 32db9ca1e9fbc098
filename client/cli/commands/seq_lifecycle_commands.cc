// `attend seq` subcommands of a sequence's life: create, fork, truncate, release, get, list
// and stats.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands/seq_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/kv_cache_client.h"

namespace attend::cli {
namespace {

std::string ShortDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return "f32";
    case v1::INT8:
      return "int8";
    default:
      return "bf16";
  }
}

// The subcommands that take --id alone.
struct IdOptions {
  std::string id;
  void Declare(Flags& f) { DeclareSequenceId(f, &id); }
};

struct CreateOptions {
  std::string id;
  int64_t layers = 2;
  int64_t n_head = 4;
  std::optional<int64_t> n_head_kv;  // unset: n_head
  int64_t head_dim = 16;
  std::optional<int64_t> head_dim_v;  // unset: head_dim
  std::string kv_dtype = "bf16";
  int64_t window = 0;
  int64_t reserve = 0;

  void Declare(Flags& f) {
    f.Add("id", &id, "sequence id, 1-128 of [A-Za-z0-9._:/-]").Shown("seq-<16 random hex digits>");
    f.Add("layers", &layers, "layers").Range(1, 1 << 16);
    f.Add("n_head", &n_head, "query heads").Range(1, 1 << 16);
    f.Add("n_head_kv", &n_head_kv, "key/value heads (divides n_head)")
        .Range(1, 1 << 16)
        .Shown("n_head");
    f.Add("head_dim", &head_dim, "query/key head size").Range(1, 1 << 16);
    f.Add("head_dim_v", &head_dim_v, "value head size").Range(1, 1 << 16).Shown("head_dim");
    f.Add("kv_dtype", &kv_dtype, "storage of keys and values: f32, bf16 or int8");
    f.Add("window", &window, "sliding window in tokens (0 = unlimited)").Range(0, int64_t{1} << 40);
    f.Add("reserve", &reserve, "tokens to reserve in every layer").Range(0, int64_t{1} << 40);
  }
};

int RunCreate(Context& c, const CreateOptions& o) {
  v1::SequenceConfig config;
  const std::string& dtype = o.kv_dtype;
  if (dtype == "bf16" || dtype == "bfloat16") {
    config.set_kv_dtype(v1::BFLOAT16);
  } else if (dtype == "f32" || dtype == "float32") {
    config.set_kv_dtype(v1::FLOAT32);
  } else if (dtype == "int8") {
    config.set_kv_dtype(v1::INT8);
  } else {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "--kv_dtype: '", dtype, "'; the cache stores f32, bf16 or int8")));
  }
  config.set_layers(static_cast<int32_t>(o.layers));
  config.set_n_head(static_cast<int32_t>(o.n_head));
  config.set_n_head_kv(static_cast<int32_t>(o.n_head_kv.value_or(o.n_head)));
  config.set_head_dim(static_cast<int32_t>(o.head_dim));
  config.set_head_dim_v(static_cast<int32_t>(o.head_dim_v.value_or(o.head_dim)));
  config.set_window_tokens(o.window);
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.CreateSequence(config, o.id, o.reserve);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(c, *info, absl::StrCat("created sequence ", Quoted(info->sequence_id())));
  return kExitOk;
}

struct ForkOptions {
  std::string id;
  std::string new_id;
  std::optional<int64_t> tokens;  // unset: every token all layers hold

  void Declare(Flags& f) {
    f.Add("id", &id, "the source sequence");
    f.Add("new_id", &new_id, "id of the fork").Shown("<source key>/<16 hex digits>, by the server");
    f.Add("tokens", &tokens, "tokens to share").Range(0, int64_t{1} << 40).Shown("all");
  }
};

int RunFork(Context& c, const ForkOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "fork");
  if (!id.ok()) return UsageError(c, id.status());
  const std::optional<int64_t>& tokens = o.tokens;
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.Fork(*id, o.new_id, tokens);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(
      c, *info,
      absl::StrCat("forked ", Quoted(*id), " at ", Plural(info->tokens(), "token", "tokens"),
                   " into ", Quoted(info->sequence_id()), ": ", Count(info->shared_blocks()),
                   " of its ", Count(info->blocks()), " blocks are shared"));
  return kExitOk;
}

struct TruncateOptions {
  std::string id;
  std::optional<int64_t> tokens;

  void Declare(Flags& f) {
    DeclareSequenceId(f, &id);
    f.Add("tokens", &tokens, "the new length").Range(0, int64_t{1} << 40);
  }
};

int RunTruncate(Context& c, const TruncateOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "truncate");
  if (!id.ok()) return UsageError(c, id.status());
  if (!o.tokens) {
    return UsageError(c, absl::InvalidArgumentError("'attend seq truncate' needs --tokens <n>"));
  }
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.Truncate(*id, *o.tokens);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(
      c, *info,
      absl::StrCat("truncated ", Quoted(*id), " to ", Plural(*o.tokens, "token", "tokens")));
  return kExitOk;
}

int RunRelease(Context& c, const IdOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "release");
  if (!id.ok()) return UsageError(c, id.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<int64_t> freed = kv.Release(*id);
  if (!freed.ok()) return ReportError(c, freed.status());
  if (c.json) {
    *c.out << "{\"sequence_id\": " << JsonString(*id) << ", \"freed_bytes\": " << *freed << "}\n";
    return kExitOk;
  }
  *c.out << "released " << Quoted(*id) << ": " << BinaryBytes(*freed)
         << " returned to the cache (blocks still shared with forks stay with them)\n";
  return kExitOk;
}

int RunGet(Context& c, const IdOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "get");
  if (!id.ok()) return UsageError(c, id.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(*id);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(c, *info, absl::StrCat("sequence ", Quoted(*id)));
  return kExitOk;
}

struct ListOptions {
  int64_t page_size = 0;  // 0: the server's default, 100
  std::optional<std::string> page_token;

  void Declare(Flags& f) {
    f.Add("page_size", &page_size, "sequences per call (at most 1000)").Range(0, 1000).Shown("100");
    f.Add("page_token", &page_token, "print only the page after this token");
  }
};

int RunList(Context& c, const ListOptions& o) {
  client::KvCacheClient kv(c.Channel(), c.connection);
  v1::ListSequencesResponse listed;
  if (o.page_token) {
    // The page asked for, and where the next one starts.
    absl::StatusOr<v1::ListSequencesResponse> page =
        kv.ListSequences(static_cast<int32_t>(o.page_size), *o.page_token);
    if (!page.ok()) return ReportError(c, page.status());
    listed = *std::move(page);
  } else {
    absl::StatusOr<std::vector<v1::SequenceInfo>> all =
        kv.ListAllSequences(static_cast<int32_t>(o.page_size));
    if (!all.ok()) return ReportError(c, all.status());
    for (v1::SequenceInfo& info : *all) *listed.add_sequences() = std::move(info);
  }
  if (c.json) {
    *c.out << ToJson(listed);
    return kExitOk;
  }
  if (listed.sequences_size() == 0) {
    *c.out << "no sequences\n";
  } else {
    Table table({"id", "layers", "heads", "dims", "kv", "tokens", "blocks", "shared", "bytes",
                 "forked from", "idle"});
    table.set_drop_order({"forked from", "shared", "blocks", "idle", "dims", "layers", "heads"});
    for (const v1::SequenceInfo& s : listed.sequences()) {
      const v1::SequenceConfig& config = s.config();
      table.AddRow({s.sequence_id(), absl::StrCat(config.layers()),
                    absl::StrCat(config.n_head(), "/", config.n_head_kv()),
                    config.head_dim_v() == config.head_dim()
                        ? absl::StrCat(config.head_dim())
                        : absl::StrCat(config.head_dim(), "/", config.head_dim_v()),
                    ShortDTypeName(config.kv_dtype()), Count(s.tokens()), Count(s.blocks()),
                    Count(s.shared_blocks()), BinaryBytes(s.bytes()),
                    s.forked_from().empty() ? "-" : s.forked_from(), Ago(s.last_used_unix_ms())});
    }
    const TableStyle style = TableStyleFromFlags(c.no_headers, c.wide);
    PrintTable(table, style, *c.out, *c.err);
    // The summary is a note below the table: --no-headers leaves the rows alone.
    if (style.headers) {
      *c.out << Plural(listed.sequences_size(), "sequence", "sequences");
      int64_t bytes = 0;
      for (const v1::SequenceInfo& s : listed.sequences()) bytes += s.bytes();
      *c.out << ", " << BinaryBytes(bytes) << " referenced (shared blocks counted by each user)\n";
    }
  }
  if (!listed.next_page_token().empty()) {
    *c.out << "next page: --page_token " << listed.next_page_token() << "\n";
  }
  return kExitOk;
}

int RunStats(Context& c) {
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::CacheStats> s = kv.Stats();
  if (!s.ok()) return ReportError(c, s.status());
  if (c.json) {
    *c.out << ToJson(*s);
    return kExitOk;
  }
  Fields f;
  f.Add("capacity", absl::StrCat(BinaryBytes(s->capacity_bytes()), " (", Count(s->capacity_bytes()),
                                 " bytes) in ", Plural(s->blocks_total(), "block", "blocks"),
                                 " of ", BinaryBytes(s->block_bytes())));
  f.Add("used", absl::StrCat(BinaryBytes(s->used_bytes()), " (",
                             absl::StrFormat("%.1f%%", 100.0 * s->usage_ratio()),
                             "): ", Count(s->blocks_used()), " blocks used, ",
                             Count(s->blocks_free()), " free"));
  f.Add("sequences", Count(s->sequences()));
  f.Add("tokens", absl::StrCat(Count(s->tokens()), " (summed over sequences and layers)"));
  f.Add(
      "eviction",
      absl::StrCat(s->eviction_policy(), "; ", Plural(s->evictions(), "eviction", "evictions"),
                   ", ", Plural(s->rejections(), "rejection", "rejections"), " for lack of room"));
  *c.out << "KV cache of " << c.connection.target << "\n"
         << f.Render("  ", TableStyleFromFlags(c.no_headers, c.wide).max_width);
  return kExitOk;
}

}  // namespace

Command SeqCreateSubcommand() {
  return {
      "create", "create a sequence of a given shape",
      "attend seq create [--id ID] [--layers L --n_head H --n_head_kv G --head_dim D] "
      "[--kv_dtype f32|bf16|int8] [--window W] [--reserve N]",
      "The shape is fixed for the sequence's life. --reserve takes the blocks of N tokens in\n"
      "every layer now, so that appends up to that length cannot fail for lack of room.\n"
      "Examples:\n  attend seq create --id chat-1\n"
      "  attend seq create --id llama-like --layers 32 --n_head 32 --n_head_kv 8 --head_dim 128\n"
      "  attend seq create --id local --kv_dtype f32 --window 4096 --reserve 1024\n",
      Define(RunCreate)};
}

std::vector<Command> SeqLifecycleSubcommands() {
  std::vector<Command> subs;
  subs.push_back(
      {"fork", "fork a sequence copy-on-write (e.g. to branch a conversation)",
       "attend seq fork --id SOURCE [--new_id ID] [--tokens N]",
       "The fork shares the source's first N tokens (default: every token all layers hold);\n"
       "blocks are copied only when one side writes into a shared one.\n"
       "Behind a fleet's proxy a fork lives on its source's replica, so its id must route by\n"
       "the source's key (the id up to its first '/'): fork chat-1 as chat-1/<name>.\n"
       "Examples:\n  attend seq fork --id chat-1 --new_id chat-1/b\n"
       "  attend seq fork --id chat-1 --new_id chat-1/retry --tokens 12\n",
       Define(RunFork)});
  subs.push_back({"truncate", "drop every token at or after a position in every layer",
                  "attend seq truncate --id ID --tokens N",
                  "Examples:\n  attend seq truncate --id chat-1 --tokens 12\n",
                  Define(RunTruncate)});
  subs.push_back({"release", "remove a sequence and return its memory",
                  "attend seq release --id ID", "Examples:\n  attend seq release --id chat-1\n",
                  Define(RunRelease)});
  subs.push_back({"get", "show a sequence: shape, tokens per layer, blocks, bytes",
                  "attend seq get --id ID",
                  "Examples:\n  attend seq get --id chat-1\n  attend --json seq get --id chat-1\n",
                  Define(RunGet)});
  subs.push_back(
      {"list", "list the sequences", "attend seq list [--page_size N] [--page_token T]",
       "Follows every page unless --page_token asks for one page (whose next token is printed).\n"
       "Examples:\n  attend seq list\n  attend seq list --page_size 10 --page_token chat-1\n",
       Define(RunList)});
  subs.push_back({"stats", "the cache: capacity, usage, blocks, sequences, evictions",
                  "attend seq stats", "Examples:\n  attend seq stats\n  attend --json seq stats\n",
                  Define(RunStats)});
  return subs;
}

}  // namespace attend::cli
