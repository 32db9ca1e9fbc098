#include "client/cli/seq_commands.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/command.h"
#include "client/cli/format.h"
#include "client/cli/terminal_notes.h"
#include "client/kv_cache_client.h"
#include "client/npy.h"

namespace attend::cli {
namespace {

using client::FloatTensor;

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

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return "float32";
    case v1::FLOAT16:
      return "float16";
    case v1::INT8:
      return "int8 (per-token, per-head scales)";
    default:
      return "bfloat16";
  }
}

// --- flags ---------------------------------------------------------------------------------------

// The required --id.
absl::StatusOr<std::string> RequiredId(const std::string& id, const std::string& sub) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'attend seq ", sub, "' needs --id <sequence id>"));
  }
  return id;
}

// A required string flag: "'attend seq <sub>' needs --<flag> <what>" when absent or empty.
absl::StatusOr<std::string> RequiredFlag(const std::string& value, const std::string& sub,
                                         const std::string& flag, const std::string& what) {
  if (value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'attend seq ", sub, "' needs --", flag, " <", what, ">"));
  }
  return value;
}

// --id of the subcommands about one existing sequence.
void DeclareSequenceId(Flags& f, std::string* id) { f.Add("id", id, "the sequence"); }

// The subcommands that take --id alone.
struct IdOptions {
  std::string id;
  void Declare(Flags& f) { DeclareSequenceId(f, &id); }
};

// --- printing ------------------------------------------------------------------------------------

// Layers grouped into runs of equal token counts: "0-31  128".
Table LayerTokensTable(const v1::SequenceInfo& info) {
  Table table({"layers", "tokens"});
  const auto& tokens = info.layer_tokens();
  for (int i = 0; i < tokens.size();) {
    int j = i;
    while (j + 1 < tokens.size() && tokens[j + 1] == tokens[i]) ++j;
    table.AddRow({i == j ? absl::StrCat(i) : absl::StrCat(i, "-", j), Count(tokens[i])});
    i = j + 1;
  }
  return table;
}

std::string ShapeSummary(const v1::SequenceConfig& c) {
  const std::string kind = AttentionVariantName(c.n_head(), c.n_head_kv());
  std::string dims = c.head_dim_v() == c.head_dim()
                         ? absl::StrCat("head_dim ", c.head_dim())
                         : absl::StrCat("head_dim ", c.head_dim(), ", head_dim_v ", c.head_dim_v());
  return absl::StrCat(
      Plural(c.layers(), "layer", "layers"), ", ", Plural(c.n_head(), "query head", "query heads"),
      ", ", Plural(c.n_head_kv(), "key/value head", "key/value heads"), " (", kind, "), ", dims);
}

void PrintSequence(Context& c, const v1::SequenceInfo& info, const std::string& headline) {
  const v1::SequenceConfig& config = info.config();
  Fields f;
  f.Add("shape", ShapeSummary(config));
  f.Add("storage", absl::StrCat(DTypeName(config.kv_dtype()), " keys and values, ",
                                Count(info.tokens_per_block()), " tokens of a layer per block"));
  std::string attention =
      config.window_tokens() > 0
          ? absl::StrCat("causal, sliding window of ", Count(config.window_tokens()), " tokens")
          : "causal over the whole sequence";
  absl::StrAppend(&attention, config.has_scale() ? absl::StrFormat("; scale %g", config.scale())
                                                 : "; scale 1/sqrt(head_dim)");
  f.Add("attention", attention);
  f.Add("tokens", absl::StrCat(Count(info.tokens()), " in every layer"));
  f.Add("blocks", absl::StrCat(Count(info.blocks()), ", ", Count(info.shared_blocks()),
                               " shared copy-on-write"));
  f.Add("bytes", BytesWithCount(info.bytes()));
  if (info.reserved_tokens() > 0) {
    f.Add("reserved", absl::StrCat(Count(info.reserved_tokens()), " tokens per layer"));
  }
  if (!info.forked_from().empty()) f.Add("forked from", Quoted(info.forked_from()));
  if (info.created_unix_ms() > 0) {
    f.Add("created", UtcTime(info.created_unix_ms()));
    f.Add("last used", absl::StrCat(Ago(info.last_used_unix_ms()), " ago"));
  }
  *c.out << headline << "\n"
         << f.Render("  ") << "tokens per layer:\n"
         << LayerTokensTable(info).Render();
}

// --- subcommands ---------------------------------------------------------------------------------

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

struct AppendOptions {
  std::string id;
  int64_t layer = 0;
  Given<int64_t> n{1};
  Given<int64_t> seed{1};
  std::optional<std::string> q;
  std::optional<std::string> k;
  std::optional<std::string> v;
  bool no_q = false;
  bool weights = false;
  std::optional<std::string> out;
  std::string wire = "f32";
  std::string precision;

  void Declare(Flags& f) {
    DeclareSequenceId(f, &id);
    f.Add("layer", &layer, "layer to append to").Range(0, 1 << 16);
    f.Add("n", &n, "random tokens").Range(1, 1 << 20);
    DeclareRandomTokensSeed(f, &seed);
    f.Add("q", &q, ".npy file of the queries [n, n_head, head_dim]");
    f.Add("k", &k, ".npy file of the keys [n, n_head_kv, head_dim]");
    f.Add("v", &v, ".npy file of the values [n, n_head_kv, head_dim_v]");
    f.Add("no_q", &no_q, "send no queries: only cache the keys and values");
    f.Add("weights", &weights, "also print the attention weights per head");
    f.Add("out", &out, "write the output [n, n_head, head_dim_v] to this .npy file");
    DeclareWire(f, &wire);
    DeclarePrecision(f, &precision);
  }
};

// The append flags that choose the tokens, checked together: .npy files (--k and --v, --q
// optional) or random tokens (--n, --seed, --no_q), and --out or --weights only with queries.
absl::Status CheckAppendSource(const AppendOptions& o) {
  const bool no_q = o.no_q;
  const bool from_files = o.q || o.k || o.v;
  if (from_files) {
    if (!o.k || !o.v) {
      return absl::InvalidArgumentError("--k and --v go together (--q optional)");
    }
    if (o.n.given || o.seed.given) {
      return absl::InvalidArgumentError(
          "--n and --seed make random tokens; not with --q/--k/--v files");
    }
    if (no_q && o.q) {
      return absl::InvalidArgumentError("--no_q and --q contradict each other");
    }
  }
  const bool has_q = from_files ? o.q.has_value() : !no_q;
  if (!has_q && (o.weights || o.out)) {
    return absl::InvalidArgumentError(
        "without queries (--no_q, or --k/--v without --q) there is no output for --out or "
        "--weights");
  }
  return absl::OkStatus();
}

// Fills input->q/k/v from the .npy files the flags name, or with random tokens shaped like the
// sequence (which the server is asked for). Returns kExitOk, or prints the problem and returns
// its exit code.
int FillAppendTokens(Context& c, const AppendOptions& o, const client::KvCacheClient& kv,
                     client::AppendInput* input) {
  if (o.q || o.k || o.v) {
    if (o.q) {
      absl::StatusOr<FloatTensor> q = ReadNpyFlag(c, "q", *o.q);
      if (!q.ok()) return LocalError(c, q.status());
      input->q = *std::move(q);
    }
    for (auto [flag, path, target] :
         {std::tuple{"k", &o.k, &input->k}, std::tuple{"v", &o.v, &input->v}}) {
      if (!*path) continue;
      absl::StatusOr<FloatTensor> t = ReadNpyFlag(c, flag, **path);
      if (!t.ok()) return LocalError(c, t.status());
      *target = *std::move(t);
    }
    return kExitOk;
  }
  const int64_t n = o.n.value;
  absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(input->sequence_id);
  if (!info.ok()) return ReportError(c, info.status());
  const v1::SequenceConfig& config = info->config();
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed.value));
  // The queries are drawn even with --no_q: the keys and values a seed gives do not depend on it.
  FloatTensor q = RandomTensor(rng, {n, config.n_head(), config.head_dim()});
  input->k = RandomTensor(rng, {n, config.n_head_kv(), config.head_dim()});
  input->v = RandomTensor(rng, {n, config.n_head_kv(), config.head_dim_v()});
  if (!o.no_q) input->q = std::move(q);
  return kExitOk;
}

// What an append of `n` tokens did, and with queries their attention output.
void PrintAppended(Context& c, const client::AppendInput& input, int64_t n,
                   const client::AppendOutput& r) {
  const std::string& id = input.sequence_id;
  if (c.json) {
    *c.out << "{\"sequence_id\": " << JsonString(id) << ", \"layer\": " << input.layer
           << ", \"appended\": " << n << ", \"first_position\": " << r.first_position
           << ", \"layer_tokens\": " << r.layer_tokens;
    if (input.q) *c.out << ", \"output\": " << JsonTensor(r.output);
    if (r.weights) *c.out << ", \"weights\": " << JsonTensor(*r.weights);
    if (input.q) *c.out << ", \"stats\": " << ToJson(r.stats);
    *c.out << "}\n";
    return;
  }
  *c.out << "appended " << Plural(n, "token", "tokens")
         << (input.q ? "" : " (keys and values only)") << " to layer " << input.layer << " of "
         << Quoted(id) << " at position"
         << (n == 1 ? absl::StrCat(" ", r.first_position)
                    : absl::StrCat("s ", r.first_position, "-", r.first_position + n - 1))
         << "; the layer holds " << Plural(r.layer_tokens, "token", "tokens") << "\n";
  if (!input.q) return;
  *c.out << "output " << ShapeString(r.output.shape) << " = [n_new, n_head, head_dim_v]:\n";
  PrintHeadRows(*c.out, r.output, "position", r.first_position);
  if (r.weights) {
    PrintWeights(*c.out, *r.weights, "new query position", "cached key", r.first_position);
  }
  PrintStats(*c.out, r.stats);
}

int RunAppend(Context& c, const AppendOptions& o) {
  c.wire = o.wire;
  absl::StatusOr<std::string> id = RequiredId(o.id, "append");
  if (!id.ok()) return UsageError(c, id.status());
  absl::StatusOr<v1::Precision> precision = ParsePrecision(o.precision);
  if (!precision.ok()) return UsageError(c, precision.status());
  absl::StatusOr<client::Wire> wire = client::ParseWire(o.wire);
  if (!wire.ok()) return UsageError(c, wire.status());
  if (absl::Status s = CheckAppendSource(o); !s.ok()) return UsageError(c, s);

  client::KvCacheClient kv(c.Channel(), c.connection);
  client::AppendInput input;
  input.sequence_id = *id;
  input.layer = static_cast<int32_t>(o.layer);
  input.precision = *precision;
  input.wire = *wire;
  input.return_weights = o.weights;
  if (int code = FillAppendTokens(c, o, kv, &input); code != kExitOk) return code;
  const int64_t n = input.k.shape.empty() ? 0 : input.k.shape[0];
  absl::StatusOr<client::AppendOutput> r;
  {
    const WorkingNote note(
        c.err, c.err_is_terminal, c.working_note_after,
        WorkingText(absl::StrCat("Append of ", Plural(n, "token", "tokens")), c.connection.target));
    r = kv.Append(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (o.out) {
    if (absl::Status s = client::WriteNpyFile(*o.out, r->output); !s.ok()) {
      return LocalError(c,
                        absl::Status(s.code(), absl::StrCat(s.message(),
                                                            " (the tokens were "
                                                            "appended: the sequence holds them)")));
    }
  }
  PrintAppended(c, input, n, *r);
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

// --- save, load, export, import, hand-off --------------------------------------------------------

struct SaveOptions {
  std::string id;
  std::string name;

  void Declare(Flags& f) {
    DeclareSequenceId(f, &id);
    f.Add("name", &name, "the file's name (rules of a sequence id)").Shown("the sequence id");
  }
};

int RunSave(Context& c, const SaveOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "save");
  if (!id.ok()) return UsageError(c, id.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SaveSequenceResponse> saved = kv.SaveSequence(*id, o.name);
  if (!saved.ok()) return ReportError(c, saved.status());
  if (c.json) {
    *c.out << ToJson(*saved);
    return kExitOk;
  }
  *c.out << "saved " << Quoted(*id) << " as " << Quoted(saved->name())
         << " in the server's snapshot directory: " << BytesWithCount(saved->bytes()) << " in "
         << Duration(saved->seconds()) << "\nload it with: attend seq load --name " << saved->name()
         << "\n";
  return kExitOk;
}

struct LoadOptions {
  std::string name;
  std::string id;

  void Declare(Flags& f) {
    f.Add("name", &name, "the name it was saved under");
    f.Add("id", &id, "id the loaded sequence gets").Shown("the id it was saved from");
  }
};

int RunLoad(Context& c, const LoadOptions& o) {
  absl::StatusOr<std::string> name = RequiredFlag(o.name, "load", "name", "saved name");
  if (!name.ok()) return UsageError(c, name.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.LoadSequence(*name, o.id);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(c, *info,
                absl::StrCat("loaded ", Quoted(*name), " as ", Quoted(info->sequence_id())));
  return kExitOk;
}

// "cannot write '<path>': <the system's reason>".
absl::Status WriteError(const std::string& path, int error) {
  return absl::DataLossError(absl::StrCat(
      "cannot write '", path, "': ", error != 0 ? std::strerror(error) : "write failed"));
}

struct ExportOptions {
  std::string id;
  std::string out;

  void Declare(Flags& f) {
    DeclareSequenceId(f, &id);
    f.Add("out", &out, "the file to write, or - for stdout");
  }
};

int RunExport(Context& c, const ExportOptions& o) {
  absl::StatusOr<std::string> id = RequiredId(o.id, "export");
  if (!id.ok()) return UsageError(c, id.status());
  absl::StatusOr<std::string> out = RequiredFlag(o.out, "export", "out", "file, or - for stdout");
  if (!out.ok()) return UsageError(c, out.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  if (*out == "-") {
    // The bytes alone on stdout, for a pipe; a failure mid-stream is on stderr and in the exit
    // code.
    absl::StatusOr<client::ExportResult> r = kv.ExportSequence(*id, [&](absl::string_view b) {
      c.out->write(b.data(), static_cast<std::streamsize>(b.size()));
      return *c.out ? absl::OkStatus() : absl::DataLossError("cannot write to stdout");
    });
    if (!r.ok()) {
      return absl::IsDataLoss(r.status()) && !*c.out ? LocalError(c, r.status())
                                                     : ReportError(c, r.status());
    }
    c.out->flush();
    return kExitOk;
  }
  // Into <out>.tmp, renamed to <out> once the stream ended well: a failed export leaves no
  // partial <out> (and an older <out> as it was). A symlink's target is written, the link left a
  // link; a device, FIFO or socket is written through, since nothing can be renamed onto it
  // without replacing it.
  std::string path = *out;
  std::error_code ec;
  // Followed hop by hop: canonical paths need the final target to exist already.
  for (int hops = 0;
       hops < 40 && std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec));
       ++hops) {
    std::filesystem::path next = std::filesystem::read_symlink(path, ec);
    if (ec) break;
    if (next.is_relative()) next = std::filesystem::path(path).parent_path() / next;
    path = next.string();
  }
  const std::filesystem::file_status kind = std::filesystem::status(path, ec);
  const bool through = std::filesystem::exists(kind) && !std::filesystem::is_regular_file(kind) &&
                       !std::filesystem::is_directory(kind);
  const std::string tmp = through ? path : absl::StrCat(path, ".tmp");
  errno = 0;
  std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
  if (!file) return LocalError(c, WriteError(tmp, errno));
  absl::Status local;  // the file's failure, as opposed to the call's
  absl::StatusOr<client::ExportResult> r;
  {
    const WorkingNote note(
        c.err, c.err_is_terminal, c.working_note_after,
        WorkingText(absl::StrCat("Export of ", Quoted(*id)), c.connection.target));
    r = kv.ExportSequence(*id, [&](absl::string_view b) {
      errno = 0;
      file.write(b.data(), static_cast<std::streamsize>(b.size()));
      if (!file) local = WriteError(tmp, errno);
      return local;
    });
  }
  if (r.ok()) {
    errno = 0;
    file.close();
    if (!file) local = WriteError(tmp, errno);
  }
  if (r.ok() && local.ok() && !through) {
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      local = absl::DataLossError(
          absl::StrCat("cannot rename '", tmp, "' to '", *out, "': ", ec.message()));
    }
  }
  if (!r.ok() || !local.ok()) {
    file.close();
    if (!through) std::filesystem::remove(tmp, ec);
    return local.ok() ? ReportError(c, r.status()) : LocalError(c, local);
  }
  if (c.json) {
    *c.out << "{\"sequence_id\": " << JsonString(*id) << ", \"out\": " << JsonString(*out)
           << ", \"bytes\": " << r->bytes << ", \"chunks\": " << r->chunks << "}\n";
    return kExitOk;
  }
  *c.out << "exported " << Quoted(*id) << " to " << *out << ": " << BytesWithCount(r->bytes)
         << " in " << Plural(r->chunks, "chunk", "chunks")
         << "\nimport it with: attend seq import --in " << *out << " [--id NEW_ID]\n";
  return kExitOk;
}

struct ImportOptions {
  std::string in;
  std::string id;
  bool no_share = false;

  void Declare(Flags& f) {
    f.Add("in", &in, "the file 'attend seq export' wrote");
    f.Add("id", &id, "id the imported sequence gets").Shown("the id it was exported from");
    f.Add("no_share", &no_share,
          "copy the leading tokens a fork shared with its source, even when that source is here "
          "with the same rows");
  }
};

int RunImport(Context& c, const ImportOptions& o) {
  absl::StatusOr<std::string> path = RequiredFlag(o.in, "import", "in", "snapshot file");
  if (!path.ok()) return UsageError(c, path.status());
  const std::string& id = o.id;
  absl::StatusOr<std::ifstream> opened = OpenForReading(*path);
  if (!opened.ok()) return LocalError(c, opened.status());
  std::ifstream& in = *opened;
  absl::Status local;  // the file's failure, as opposed to the call's
  const auto read = [&](char* dst, size_t n) -> absl::StatusOr<size_t> {
    in.read(dst, static_cast<std::streamsize>(n));
    if (in.bad()) {
      local = absl::DataLossError(absl::StrCat("cannot read '", *path, "'"));
      return local;
    }
    return static_cast<size_t>(in.gcount());
  };
  // Without --id the sequence keeps the id in the file's header, which is also the call's
  // routing key: read it here, so that a file that is no snapshot is a local error.
  std::string head;
  if (id.empty()) {
    head.resize(20 + 128);
    absl::StatusOr<size_t> n = read(head.data(), head.size());
    if (!n.ok()) return LocalError(c, n.status());
    head.resize(*n);
    absl::StatusOr<std::string> header_id = client::SnapshotSequenceId(head);
    if (!header_id.ok()) {
      return LocalError(c, absl::InvalidArgumentError(
                               absl::StrCat("--in ", *path, ": ", header_id.status().message(),
                                            "; give the bytes 'attend seq export' wrote")));
    }
  }
  size_t head_at = 0;
  const client::ByteSource source = [&](char* dst, size_t n) -> absl::StatusOr<size_t> {
    const size_t from_head = std::min(n, head.size() - head_at);
    std::copy_n(head.data() + head_at, from_head, dst);
    head_at += from_head;
    if (from_head == n) return n;
    absl::StatusOr<size_t> rest = read(dst + from_head, n - from_head);
    if (!rest.ok()) return rest.status();
    return from_head + *rest;
  };
  std::optional<bool> share;
  if (o.no_share) share = false;
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText(absl::StrCat("Import of ", *path), c.connection.target));
    info = kv.ImportSequence(source, id, share);
  }
  if (!info.ok()) return local.ok() ? ReportError(c, info.status()) : LocalError(c, local);
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(c, *info, absl::StrCat("imported ", *path, " as ", Quoted(info->sequence_id())));
  return kExitOk;
}

int RunHandOff(Context& c) {
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::HandOffResponse> r;
  {
    const WorkingNote note(c.err, c.err_is_terminal, c.working_note_after,
                           WorkingText("HandOff", c.connection.target));
    r = kv.HandOff();
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (c.json) {
    *c.out << ToJson(*r);
  } else {
    Fields f;
    f.Add("moved", absl::StrCat(Plural(r->moved(), "sequence", "sequences"),
                                ", now held by other replicas and released here"));
    f.Add("kept",
          absl::StrCat(Plural(r->kept(), "sequence", "sequences"), " whose key still maps here"));
    f.Add("failed", absl::StrCat(Plural(r->failed_size(), "sequence", "sequences"),
                                 r->failed_size() == 0 ? "" : ", still here and serving (below)"));
    f.Add("sent", absl::StrCat(BytesWithCount(r->bytes()), " in ", Duration(r->seconds())));
    *c.out << "hand-off of " << c.connection.target << " (to its --handoff_target)\n"
           << f.Render("  ", TableStyleFromFlags(c.no_headers, c.wide).max_width);
    for (const v1::HandOffFailure& failed : r->failed()) {
      *c.out << "  " << Quoted(failed.sequence_id()) << ": " << failed.error() << "\n";
    }
  }
  if (r->failed_size() == 0) return kExitOk;
  // The server answered, but not everything moved: scripts must be able to tell.
  *c.err << "error: " << Plural(r->failed_size(), "sequence", "sequences")
         << " could not move and stayed on " << c.connection.target
         << "; run 'attend seq hand-off' again once the cause is fixed\n";
  return kExitServerError;
}

Command CreateSubcommand() {
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

Command AppendSubcommand() {
  return {
      "append", "append one layer's new tokens and print the attention of their queries",
      "attend seq append --id ID [--layer L] [--n N [--seed S] | --k k.npy --v v.npy [--q q.npy]] "
      "[--no_q] [--weights] [--out o.npy]",
      "Random tokens (standard normal, shaped like the sequence) unless --k/--v name .npy files\n"
      "([n, n_head_kv, head_dim] and [n, n_head_kv, head_dim_v]; --q is [n, n_head, head_dim]).\n"
      "The output is causal attention of the new queries over every token the layer holds.\n"
      "With --no_q (or --k/--v without --q) the tokens are only cached.\n"
      "Examples:\n  attend seq append --id chat-1 --layer 0 --n 16\n"
      "  attend seq append --id chat-1 --layer 1 --n 16 --no_q\n"
      "  attend seq append --id chat-1 --layer 0 --n 2 --weights\n"
      "  attend seq append --id chat-1 --q q.npy --k k.npy --v v.npy --out o.npy\n",
      Define(RunAppend)};
}

std::vector<Command> Subcommands() {
  std::vector<Command> subs;
  subs.push_back(CreateSubcommand());
  subs.push_back(AppendSubcommand());
  subs.push_back(SeqDecodeSubcommand());
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
  subs.push_back(
      {"save", "write a sequence to the server's snapshot directory",
       "attend seq save --id ID [--name NAME]",
       "The server writes the sequence, whole and checksummed, as a file of its --snapshot_dir\n"
       "(replacing one of the same name); the sequence keeps serving meanwhile. 'attend seq\n"
       "load' adds it again, here or on a server that shares the directory.\n"
       "Examples:\n  attend seq save --id chat-1\n  attend seq save --id chat-1 --name chat-1-v2\n",
       Define(RunSave)});
  subs.push_back(
      {"load", "add a sequence 'attend seq save' wrote", "attend seq load --name NAME [--id ID]",
       "The sequence comes back as it was saved (tokens, rows byte for byte, shape,\n"
       "reservation). All or nothing: NOT_FOUND without such a file, DATA_LOSS for a damaged\n"
       "one, ALREADY_EXISTS when the id is taken. Through a fleet's proxy give --id (the call\n"
       "routes by it; the saved id is only known once the server reads the file).\n"
       "Examples:\n"
       "  attend seq load --name chat-1\n"
       "  attend seq load --name chat-1-v2 --id chat-1/v2\n",
       Define(RunLoad)});
  subs.push_back(
      {"export", "stream a sequence's snapshot bytes into a file (or stdout)",
       "attend seq export --id ID --out FILE|-",
       "The bytes are SaveSequence's file format, checksummed, of one moment; the sequence keeps\n"
       "serving meanwhile. They go to FILE.tmp, renamed to FILE when the stream ended well, so a\n"
       "failed export leaves no FILE; --out - writes them to stdout and nothing else.\n"
       "Examples:\n  attend seq export --id chat-1 --out chat-1.attnsnap\n"
       "  attend seq export --id chat-1 --out - |\n"
       "      attend --target other:50051 seq import --in /dev/stdin\n",
       Define(RunExport)});
  subs.push_back(
      {"import", "add the sequence of an exported file",
       "attend seq import --in FILE [--id ID] [--no_share]",
       "Sends the file in pieces of at most 512 KiB. All or nothing, checked end to end:\n"
       "DATA_LOSS for damaged or truncated bytes, INVALID_ARGUMENT for bytes that are no\n"
       "snapshot, ALREADY_EXISTS, RESOURCE_EXHAUSTED when it does not fit. The call routes by\n"
       "the new id's key: --id's, else the id in the file's header.\n"
       "Examples:\n  attend seq import --in chat-1.attnsnap\n"
       "  attend --target other:50051 seq import --in chat-1.attnsnap --id chat-1/copy\n",
       Define(RunImport)});
  subs.push_back(
      {"hand-off", "move this server's sequences to the replicas its --handoff_target maps them to",
       "attend seq hand-off",
       "HandOff on the server of --target (a replica, not the fleet's proxy): each sequence\n"
       "goes through the server's --handoff_target (the proxy) with its routing key to the\n"
       "replica that key maps to now, and is released here once that one has it; one whose key\n"
       "still maps here stays. A sequence that cannot move stays and serves, and is listed;\n"
       "then the exit code is 4. Run it on every replica after the fleet's ring changes.\n"
       "The pass ends by --deadline: give many or large sequences more than the default 30 s.\n"
       "FAILED_PRECONDITION when the server has no --handoff_target.\n"
       "Examples:\n  attend --target replica-2:50051 seq hand-off\n"
       "  attend --target replica-2:50051 -o json seq hand-off\n",
       Define(RunHandOff)});
  return subs;
}

// The group's flags for its help: every subcommand's (RunCli refuses the ones of other
// subcommands), each once, in the order they first appear. The help says which subcommands take
// a flag, and what it means to each when that differs.
std::vector<FlagSpec> GroupFlags(const std::vector<Command>& subs) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<std::string, FlagSpec>>> users;
  for (const Command& s : subs) {
    for (const FlagSpec& f : s.flags) {
      if (users[f.name].empty()) order.push_back(f.name);
      users[f.name].emplace_back(absl::StripPrefix(s.name, "seq "), f);
    }
  }
  std::vector<FlagSpec> flags;
  for (const std::string& name : order) {
    const auto& uses = users[name];
    std::vector<std::string> subs_using;
    bool same = true;
    for (const auto& [sub, f] : uses) {
      subs_using.push_back(sub);
      same =
          same && f.help == uses[0].second.help && f.default_value == uses[0].second.default_value;
    }
    FlagSpec flag = uses[0].second;
    if (same) {
      flag.help = absl::StrCat("[", absl::StrJoin(subs_using, ", "), "] ", flag.help);
    } else {
      // Subcommands that mean the same by the flag are listed together.
      std::vector<std::pair<std::string, std::vector<std::string>>> meanings;
      for (const auto& [sub, f] : uses) {
        const std::string meaning = f.default_value.empty()
                                        ? f.help
                                        : absl::StrCat(f.help, " (default: ", f.default_value, ")");
        auto it = std::find_if(meanings.begin(), meanings.end(),
                               [&](const auto& m) { return m.first == meaning; });
        if (it == meanings.end()) {
          meanings.push_back({meaning, {sub}});
        } else {
          it->second.push_back(sub);
        }
      }
      std::vector<std::string> parts;
      for (const auto& [meaning, names] : meanings) {
        parts.push_back(absl::StrCat(absl::StrJoin(names, ", "), ": ", meaning));
      }
      flag.help = absl::StrJoin(parts, "; ");
      flag.default_value.clear();
    }
    flags.push_back(flag);
  }
  return flags;
}

}  // namespace

void DeclareRandomTokensSeed(Flags& f, Given<int64_t>* seed) {
  f.Add("seed", seed, "seed of the random tokens").Range(0, INT64_MAX);
}

std::vector<Command> SeqSubcommands() {
  std::vector<Command> subs = Subcommands();
  for (Command& s : subs) s.name = "seq " + s.name;
  return subs;
}

std::vector<Command> SeqCommands() {
  const std::vector<Command> subs = Subcommands();
  std::string list;
  for (const Command& s : subs) {
    absl::StrAppend(&list, PadRight("  " + s.name, 11), " ", s.summary, "\n");
  }
  Command seq{
      "seq", "sequences in the server's KV cache: create, append, decode, fork, get, stats, ...",
      "attend seq <subcommand> [flags]",
      absl::StrCat(
          "Per-sequence paged KV caches held by the server: each layer's new tokens are cached\n"
          "and attended over everything that layer holds.\n\nsubcommands (attend seq <subcommand> "
          "--help for each one's flags and examples):\n",
          list,
          "\nA session:\n"
          "  attend seq create --id chat-1 --layers 2 --n_head 8 --n_head_kv 2 --head_dim 64\n"
          "  attend seq append --id chat-1 --layer 0 --n 16\n"
          "  attend seq append --id chat-1 --layer 1 --n 16\n"
          "  attend seq decode --id chat-1 --steps 4 --stream\n"
          "  attend seq fork --id chat-1 --new_id chat-1/b --tokens 8\n"
          "  attend seq truncate --id chat-1 --tokens 12\n"
          "  attend seq get --id chat-1\n"
          "  attend seq list\n"
          "  attend seq stats\n"
          "  attend seq save --id chat-1\n"
          "  attend seq export --id chat-1 --out chat-1.attnsnap\n"
          "  attend seq release --id chat-1\n"
          "  attend seq load --name chat-1\n")};
  seq.subcommands = SeqSubcommands();
  seq.group_flags = GroupFlags;
  return {seq};
}

}  // namespace attend::cli
