// The `attend seq` group: its table entry and help, the flags its subcommands share in the
// group's help, and the helpers of seq_commands.h. The subcommands are in
// seq_lifecycle_commands.cc (create, fork, truncate, release, get, list, stats),
// seq_append_command.cc, seq_decode_command.cc and seq_persistence_commands.cc (save, load,
// export, import, hand-off).
#include "client/cli/commands/seq_commands.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/commands/commands.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"

namespace attend::cli {
namespace {

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

// The subcommands in the order help lists them, named without the group ("create").
std::vector<Command> Subcommands() {
  std::vector<Command> subs;
  subs.push_back(SeqCreateSubcommand());
  subs.push_back(SeqAppendSubcommand());
  subs.push_back(SeqDecodeSubcommand());
  for (Command& s : SeqLifecycleSubcommands()) subs.push_back(std::move(s));
  for (Command& s : SeqPersistenceSubcommands()) subs.push_back(std::move(s));
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
