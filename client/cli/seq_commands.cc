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
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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
absl::StatusOr<std::string> RequiredId(const Args& args, const std::string& sub) {
  if (!args.Has("id") || args.GetString("id").empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'attend seq ", sub, "' needs --id <sequence id>"));
  }
  return args.GetString("id");
}

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

int RunCreate(Context& c) {
  v1::SequenceConfig config;
  absl::StatusOr<int64_t> layers = IntFlag(c.args, "layers", 2, 1, 1 << 16);
  absl::StatusOr<int64_t> n_head = IntFlag(c.args, "n_head", 4, 1, 1 << 16);
  if (!layers.ok()) return UsageError(c, layers.status());
  if (!n_head.ok()) return UsageError(c, n_head.status());
  absl::StatusOr<int64_t> n_head_kv = IntFlag(c.args, "n_head_kv", *n_head, 1, 1 << 16);
  absl::StatusOr<int64_t> head_dim = IntFlag(c.args, "head_dim", 16, 1, 1 << 16);
  if (!n_head_kv.ok()) return UsageError(c, n_head_kv.status());
  if (!head_dim.ok()) return UsageError(c, head_dim.status());
  absl::StatusOr<int64_t> head_dim_v = IntFlag(c.args, "head_dim_v", *head_dim, 1, 1 << 16);
  absl::StatusOr<int64_t> window = IntFlag(c.args, "window", 0, 0, int64_t{1} << 40);
  absl::StatusOr<int64_t> reserve = IntFlag(c.args, "reserve", 0, 0, int64_t{1} << 40);
  for (const auto* s : {&head_dim_v, &window, &reserve}) {
    if (!s->ok()) return UsageError(c, s->status());
  }
  const std::string dtype = c.args.GetString("kv_dtype", "bf16");
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
  config.set_layers(static_cast<int32_t>(*layers));
  config.set_n_head(static_cast<int32_t>(*n_head));
  config.set_n_head_kv(static_cast<int32_t>(*n_head_kv));
  config.set_head_dim(static_cast<int32_t>(*head_dim));
  config.set_head_dim_v(static_cast<int32_t>(*head_dim_v));
  config.set_window_tokens(*window);
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info =
      kv.CreateSequence(config, c.args.GetString("id", ""), *reserve);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(c, *info, absl::StrCat("created sequence ", Quoted(info->sequence_id())));
  return kExitOk;
}

// The append flags that choose the tokens, checked together: .npy files (--k and --v, --q
// optional) or random tokens (--n, --seed, --no_q), and --out or --weights only with queries.
absl::Status CheckAppendSource(const Args& args) {
  const bool no_q = args.GetBool("no_q");
  const bool from_files = args.Has("q") || args.Has("k") || args.Has("v");
  if (from_files) {
    if (!args.Has("k") || !args.Has("v")) {
      return absl::InvalidArgumentError("--k and --v go together (--q optional)");
    }
    if (args.Has("n") || args.Has("seed")) {
      return absl::InvalidArgumentError(
          "--n and --seed make random tokens; not with --q/--k/--v files");
    }
    if (no_q && args.Has("q")) {
      return absl::InvalidArgumentError("--no_q and --q contradict each other");
    }
  }
  const bool has_q = from_files ? args.Has("q") : !no_q;
  if (!has_q && (args.GetBool("weights") || args.Has("out"))) {
    return absl::InvalidArgumentError(
        "without queries (--no_q, or --k/--v without --q) there is no output for --out or "
        "--weights");
  }
  return absl::OkStatus();
}

// Fills input->q/k/v from the .npy files the flags name, or with random tokens shaped like the
// sequence (which the server is asked for). Returns kExitOk, or prints the problem and returns
// its exit code.
int FillAppendTokens(Context& c, const client::KvCacheClient& kv, client::AppendInput* input) {
  if (c.args.Has("q") || c.args.Has("k") || c.args.Has("v")) {
    for (const char* flag : {"q", "k", "v"}) {
      if (!c.args.Has(flag)) continue;
      absl::StatusOr<FloatTensor> t = ReadNpyFlag(c, flag);
      if (!t.ok()) return LocalError(c, t.status());
      if (flag[0] == 'q') input->q = *std::move(t);
      if (flag[0] == 'k') input->k = *std::move(t);
      if (flag[0] == 'v') input->v = *std::move(t);
    }
    return kExitOk;
  }
  absl::StatusOr<int64_t> n = IntFlag(c.args, "n", 1, 1, 1 << 20);
  absl::StatusOr<int64_t> seed = IntFlag(c.args, "seed", 1, 0, INT64_MAX);
  if (!n.ok()) return UsageError(c, n.status());
  if (!seed.ok()) return UsageError(c, seed.status());
  absl::StatusOr<v1::SequenceInfo> info = kv.GetSequence(input->sequence_id);
  if (!info.ok()) return ReportError(c, info.status());
  const v1::SequenceConfig& config = info->config();
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  // The queries are drawn even with --no_q: the keys and values a seed gives do not depend on it.
  FloatTensor q = RandomTensor(rng, {*n, config.n_head(), config.head_dim()});
  input->k = RandomTensor(rng, {*n, config.n_head_kv(), config.head_dim()});
  input->v = RandomTensor(rng, {*n, config.n_head_kv(), config.head_dim_v()});
  if (!c.args.GetBool("no_q")) input->q = std::move(q);
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

int RunAppend(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "append");
  if (!id.ok()) return UsageError(c, id.status());
  absl::StatusOr<int64_t> layer = IntFlag(c.args, "layer", 0, 0, 1 << 16);
  if (!layer.ok()) return UsageError(c, layer.status());
  absl::StatusOr<v1::Precision> precision = ParsePrecision(c.args);
  if (!precision.ok()) return UsageError(c, precision.status());
  absl::StatusOr<client::Wire> wire = client::ParseWire(c.args.GetString("wire", "f32"));
  if (!wire.ok()) return UsageError(c, wire.status());
  if (absl::Status s = CheckAppendSource(c.args); !s.ok()) return UsageError(c, s);

  client::KvCacheClient kv(c.Channel(), c.connection);
  client::AppendInput input;
  input.sequence_id = *id;
  input.layer = static_cast<int32_t>(*layer);
  input.precision = *precision;
  input.wire = *wire;
  input.return_weights = c.args.GetBool("weights");
  if (int code = FillAppendTokens(c, kv, &input); code != kExitOk) return code;
  const int64_t n = input.k.shape.empty() ? 0 : input.k.shape[0];
  absl::StatusOr<client::AppendOutput> r;
  {
    const WorkingNote note(
        c.err, c.err_is_terminal, c.working_note_after,
        WorkingText(absl::StrCat("Append of ", Plural(n, "token", "tokens")), c.connection.target));
    r = kv.Append(input);
  }
  if (!r.ok()) return ReportError(c, r.status());
  if (c.args.Has("out")) {
    if (absl::Status s = client::WriteNpyFile(c.args.GetString("out"), r->output); !s.ok()) {
      return LocalError(c,
                        absl::Status(s.code(), absl::StrCat(s.message(),
                                                            " (the tokens were "
                                                            "appended: the sequence holds them)")));
    }
  }
  PrintAppended(c, input, n, *r);
  return kExitOk;
}

int RunFork(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "fork");
  if (!id.ok()) return UsageError(c, id.status());
  std::optional<int64_t> tokens;
  if (c.args.Has("tokens")) {
    absl::StatusOr<int64_t> t = IntFlag(c.args, "tokens", 0, 0, int64_t{1} << 40);
    if (!t.ok()) return UsageError(c, t.status());
    tokens = *t;
  }
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.Fork(*id, c.args.GetString("new_id", ""), tokens);
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

int RunTruncate(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "truncate");
  if (!id.ok()) return UsageError(c, id.status());
  if (!c.args.Has("tokens")) {
    return UsageError(c, absl::InvalidArgumentError("'attend seq truncate' needs --tokens <n>"));
  }
  absl::StatusOr<int64_t> tokens = IntFlag(c.args, "tokens", 0, 0, int64_t{1} << 40);
  if (!tokens.ok()) return UsageError(c, tokens.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.Truncate(*id, *tokens);
  if (!info.ok()) return ReportError(c, info.status());
  if (c.json) {
    *c.out << ToJson(*info);
    return kExitOk;
  }
  PrintSequence(
      c, *info,
      absl::StrCat("truncated ", Quoted(*id), " to ", Plural(*tokens, "token", "tokens")));
  return kExitOk;
}

int RunRelease(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "release");
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

int RunGet(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "get");
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

int RunList(Context& c) {
  absl::StatusOr<int64_t> page_size = IntFlag(c.args, "page_size", 0, 0, 1000);
  if (!page_size.ok()) return UsageError(c, page_size.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  v1::ListSequencesResponse listed;
  if (c.args.Has("page_token")) {
    // The page asked for, and where the next one starts.
    absl::StatusOr<v1::ListSequencesResponse> page =
        kv.ListSequences(static_cast<int32_t>(*page_size), c.args.GetString("page_token"));
    if (!page.ok()) return ReportError(c, page.status());
    listed = *std::move(page);
  } else {
    absl::StatusOr<std::vector<v1::SequenceInfo>> all =
        kv.ListAllSequences(static_cast<int32_t>(*page_size));
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

// A required string flag: "'attend seq <sub>' needs --<flag> <what>" when absent or empty.
absl::StatusOr<std::string> RequiredFlag(const Args& args, const std::string& sub,
                                         const std::string& flag, const std::string& what) {
  if (!args.Has(flag) || args.GetString(flag).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'attend seq ", sub, "' needs --", flag, " <", what, ">"));
  }
  return args.GetString(flag);
}

int RunSave(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "save");
  if (!id.ok()) return UsageError(c, id.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SaveSequenceResponse> saved =
      kv.SaveSequence(*id, c.args.GetString("name", ""));
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

int RunLoad(Context& c) {
  absl::StatusOr<std::string> name = RequiredFlag(c.args, "load", "name", "saved name");
  if (!name.ok()) return UsageError(c, name.status());
  client::KvCacheClient kv(c.Channel(), c.connection);
  absl::StatusOr<v1::SequenceInfo> info = kv.LoadSequence(*name, c.args.GetString("id", ""));
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

int RunExport(Context& c) {
  absl::StatusOr<std::string> id = RequiredId(c.args, "export");
  if (!id.ok()) return UsageError(c, id.status());
  absl::StatusOr<std::string> out = RequiredFlag(c.args, "export", "out", "file, or - for stdout");
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

int RunImport(Context& c) {
  absl::StatusOr<std::string> path = RequiredFlag(c.args, "import", "in", "snapshot file");
  if (!path.ok()) return UsageError(c, path.status());
  const std::string id = c.args.GetString("id", "");
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
  if (c.args.GetBool("no_share")) share = false;
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

// --id of the subcommands about one existing sequence.
FlagSpec SequenceIdFlag() { return {"id", "the sequence"}; }

Command CreateSubcommand() {
  return {
      "create",
      "create a sequence of a given shape",
      "attend seq create [--id ID] [--layers L --n_head H --n_head_kv G --head_dim D] "
      "[--kv_dtype f32|bf16|int8] [--window W] [--reserve N]",
      "The shape is fixed for the sequence's life. --reserve takes the blocks of N tokens in\n"
      "every layer now, so that appends up to that length cannot fail for lack of room.\n"
      "Examples:\n  attend seq create --id chat-1\n"
      "  attend seq create --id llama-like --layers 32 --n_head 32 --n_head_kv 8 --head_dim 128\n"
      "  attend seq create --id local --kv_dtype f32 --window 4096 --reserve 1024\n",
      {{"id", "sequence id, 1-128 of [A-Za-z0-9._:/-]", false, "seq-<16 random hex digits>"},
       {"layers", "layers", false, "2"},
       {"n_head", "query heads", false, "4"},
       {"n_head_kv", "key/value heads (divides n_head)", false, "n_head"},
       {"head_dim", "query/key head size", false, "16"},
       {"head_dim_v", "value head size", false, "head_dim"},
       {"kv_dtype", "storage of keys and values: f32, bf16 or int8", false, "bf16"},
       {"window", "sliding window in tokens (0 = unlimited)", false, "0"},
       {"reserve", "tokens to reserve in every layer", false, "0"}},
      RunCreate};
}

Command AppendSubcommand() {
  return {
      "append",
      "append one layer's new tokens and print the attention of their queries",
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
      {SequenceIdFlag(),
       {"layer", "layer to append to", false, "0"},
       {"n", "random tokens", false, "1"},
       RandomTokensSeedFlag(),
       {"q", ".npy file of the queries [n, n_head, head_dim]"},
       {"k", ".npy file of the keys [n, n_head_kv, head_dim]"},
       {"v", ".npy file of the values [n, n_head_kv, head_dim_v]"},
       {"no_q", "send no queries: only cache the keys and values", true},
       {"weights", "also print the attention weights per head", true},
       {"out", "write the output [n, n_head, head_dim_v] to this .npy file"},
       WireFlag(),
       PrecisionFlag()},
      RunAppend};
}

std::vector<Command> Subcommands() {
  const FlagSpec id = SequenceIdFlag();
  std::vector<Command> subs;
  subs.push_back(CreateSubcommand());
  subs.push_back(AppendSubcommand());
  subs.push_back(SeqDecodeSubcommand());
  subs.push_back(
      {"fork",
       "fork a sequence copy-on-write (e.g. to branch a conversation)",
       "attend seq fork --id SOURCE [--new_id ID] [--tokens N]",
       "The fork shares the source's first N tokens (default: every token all layers hold);\n"
       "blocks are copied only when one side writes into a shared one.\n"
       "Behind a fleet's proxy a fork lives on its source's replica, so its id must route by\n"
       "the source's key (the id up to its first '/'): fork chat-1 as chat-1/<name>.\n"
       "Examples:\n  attend seq fork --id chat-1 --new_id chat-1/b\n"
       "  attend seq fork --id chat-1 --new_id chat-1/retry --tokens 12\n",
       {{"id", "the source sequence"},
        {"new_id", "id of the fork", false, "<source key>/<16 hex digits>, by the server"},
        {"tokens", "tokens to share", false, "all"}},
       RunFork});
  subs.push_back({"truncate",
                  "drop every token at or after a position in every layer",
                  "attend seq truncate --id ID --tokens N",
                  "Examples:\n  attend seq truncate --id chat-1 --tokens 12\n",
                  {id, {"tokens", "the new length"}},
                  RunTruncate});
  subs.push_back({"release",
                  "remove a sequence and return its memory",
                  "attend seq release --id ID",
                  "Examples:\n  attend seq release --id chat-1\n",
                  {id},
                  RunRelease});
  subs.push_back({"get",
                  "show a sequence: shape, tokens per layer, blocks, bytes",
                  "attend seq get --id ID",
                  "Examples:\n  attend seq get --id chat-1\n  attend --json seq get --id chat-1\n",
                  {id},
                  RunGet});
  subs.push_back(
      {"list",
       "list the sequences",
       "attend seq list [--page_size N] [--page_token T]",
       "Follows every page unless --page_token asks for one page (whose next token is printed).\n"
       "Examples:\n  attend seq list\n  attend seq list --page_size 10 --page_token chat-1\n",
       {{"page_size", "sequences per call (at most 1000)", false, "100"},
        {"page_token", "print only the page after this token"}},
       RunList});
  subs.push_back({"stats",
                  "the cache: capacity, usage, blocks, sequences, evictions",
                  "attend seq stats",
                  "Examples:\n  attend seq stats\n  attend --json seq stats\n",
                  {},
                  RunStats});
  subs.push_back(
      {"save",
       "write a sequence to the server's snapshot directory",
       "attend seq save --id ID [--name NAME]",
       "The server writes the sequence, whole and checksummed, as a file of its --snapshot_dir\n"
       "(replacing one of the same name); the sequence keeps serving meanwhile. 'attend seq\n"
       "load' adds it again, here or on a server that shares the directory.\n"
       "Examples:\n  attend seq save --id chat-1\n  attend seq save --id chat-1 --name chat-1-v2\n",
       {id, {"name", "the file's name (rules of a sequence id)", false, "the sequence id"}},
       RunSave});
  subs.push_back(
      {"load",
       "add a sequence 'attend seq save' wrote",
       "attend seq load --name NAME [--id ID]",
       "The sequence comes back as it was saved (tokens, rows byte for byte, shape,\n"
       "reservation). All or nothing: NOT_FOUND without such a file, DATA_LOSS for a damaged\n"
       "one, ALREADY_EXISTS when the id is taken. Through a fleet's proxy give --id (the call\n"
       "routes by it; the saved id is only known once the server reads the file).\n"
       "Examples:\n"
       "  attend seq load --name chat-1\n"
       "  attend seq load --name chat-1-v2 --id chat-1/v2\n",
       {{"name", "the name it was saved under"},
        {"id", "id the loaded sequence gets", false, "the id it was saved from"}},
       RunLoad});
  subs.push_back(
      {"export",
       "stream a sequence's snapshot bytes into a file (or stdout)",
       "attend seq export --id ID --out FILE|-",
       "The bytes are SaveSequence's file format, checksummed, of one moment; the sequence keeps\n"
       "serving meanwhile. They go to FILE.tmp, renamed to FILE when the stream ended well, so a\n"
       "failed export leaves no FILE; --out - writes them to stdout and nothing else.\n"
       "Examples:\n  attend seq export --id chat-1 --out chat-1.attnsnap\n"
       "  attend seq export --id chat-1 --out - |\n"
       "      attend --target other:50051 seq import --in /dev/stdin\n",
       {id, {"out", "the file to write, or - for stdout"}},
       RunExport});
  subs.push_back(
      {"import",
       "add the sequence of an exported file",
       "attend seq import --in FILE [--id ID] [--no_share]",
       "Sends the file in pieces of at most 512 KiB. All or nothing, checked end to end:\n"
       "DATA_LOSS for damaged or truncated bytes, INVALID_ARGUMENT for bytes that are no\n"
       "snapshot, ALREADY_EXISTS, RESOURCE_EXHAUSTED when it does not fit. The call routes by\n"
       "the new id's key: --id's, else the id in the file's header.\n"
       "Examples:\n  attend seq import --in chat-1.attnsnap\n"
       "  attend --target other:50051 seq import --in chat-1.attnsnap --id chat-1/copy\n",
       {{"in", "the file 'attend seq export' wrote"},
        {"id", "id the imported sequence gets", false, "the id it was exported from"},
        {"no_share",
         "copy the leading tokens a fork shared with its source, even when that source is here "
         "with the same rows",
         true}},
       RunImport});
  subs.push_back(
      {"hand-off",
       "move this server's sequences to the replicas its --handoff_target maps them to",
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
       {},
       RunHandOff});
  return subs;
}

int RunSeq(Context& c) {
  const std::vector<Command> subs = Subcommands();
  std::vector<std::string> names;
  for (const Command& s : subs) names.push_back(s.name);
  const std::vector<std::string>& positional = c.args.positional();
  if (positional.empty()) {
    return UsageError(
        c, absl::InvalidArgumentError(absl::StrCat(
               "give a subcommand: ", absl::StrJoin(names, ", "), " (attend seq --help)")));
  }
  const auto sub = std::find_if(subs.begin(), subs.end(),
                                [&](const Command& s) { return s.name == positional[0]; });
  if (sub == subs.end()) {
    return UsageError(
        c, absl::InvalidArgumentError(absl::StrCat("unknown subcommand '", positional[0],
                                                   "'; use one of ", absl::StrJoin(names, ", "))));
  }
  if (positional.size() > 1) {
    return UsageError(c, absl::InvalidArgumentError(absl::StrCat(
                             "'attend seq ", sub->name, "' takes flags only; unexpected '",
                             positional[1], "' (ids go in --id)")));
  }
  std::set<std::string> own;
  for (const FlagSpec& f : sub->flags) own.insert(f.name);
  for (const Command& other : subs) {
    for (const FlagSpec& f : other.flags) {
      if (c.args.Has(f.name) && own.count(f.name) == 0) {
        return UsageError(c, absl::InvalidArgumentError(
                                 absl::StrCat("--", f.name, " is not a flag of 'attend seq ",
                                              sub->name, "' (attend seq ", sub->name, " --help)")));
      }
    }
  }
  return sub->run(c);
}

// The group's flags: every subcommand's (RunSeq refuses the ones of other subcommands), each
// once, in the order they first appear. The help says which subcommands take a flag, and what
// it means to each when that differs.
std::vector<FlagSpec> GroupFlags(const std::vector<Command>& subs) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<std::string, FlagSpec>>> users;
  for (const Command& s : subs) {
    for (const FlagSpec& f : s.flags) {
      if (users[f.name].empty()) order.push_back(f.name);
      users[f.name].emplace_back(s.name, f);
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

FlagSpec RandomTokensSeedFlag() { return {"seed", "seed of the random tokens", false, "1"}; }

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
  const std::vector<FlagSpec> flags = GroupFlags(subs);
  std::vector<Command> commands;
  commands.push_back(
      {"seq", "sequences in the server's KV cache: create, append, decode, fork, get, stats, ...",
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
           "  attend seq load --name chat-1\n"),
       flags, RunSeq, SeqSubcommands(), kAnyPositional});  // RunSeq checks them
  return commands;
}

}  // namespace attend::cli
