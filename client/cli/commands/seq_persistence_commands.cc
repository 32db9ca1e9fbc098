// `attend seq` subcommands that move sequences in and out of the server's memory: save and load
// (the server's snapshot directory), export and import (the snapshot bytes through this client)
// and hand-off (to the replicas of a fleet).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/commands/input_files.h"
#include "client/cli/commands/seq_commands.h"
#include "client/cli/connect/report_error.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/cli/render/terminal_notes.h"
#include "client/kv_cache_client.h"
#include "client/output_file.h"
#include "common/sequence_key.h"

namespace attend::cli {
namespace {

// A --name checked before it is sent, by the rule the server applies (a saved sequence's file
// takes the rules of an id); the server's own message speaks of ids and routing keys.
absl::Status CheckSavedName(const std::string& name) {
  if (CheckSequenceIdSyntax(name) == SequenceIdProblem::kNone) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--name '", absl::CHexEscape(name.substr(0, 64)), name.size() > 64 ? "...'" : "'",
      ": a saved sequence's file name has 1 to ", kMaxSequenceIdBytes,
      " characters of A-Z a-z 0-9 . _ : - and /, and no part between '/'s that is empty, '.' or "
      "'..'"));
}

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
  if (!o.name.empty()) {
    if (absl::Status s = CheckSavedName(o.name); !s.ok()) return UsageError(c, s);
  }
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
  if (absl::Status s = CheckSavedName(*name); !s.ok()) return UsageError(c, s);
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
  // Into a temporary file beside <out>, renamed to <out> once the stream ended well: a failed
  // export leaves no partial <out> (and an older <out> as it was). A symlink's target is written,
  // the link left a link; a device, FIFO or socket is written through, since nothing can be renamed
  // onto it without replacing it.
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
  // The temporary file is a new one with a name of its own (a random part, made with O_EXCL and
  // no link followed): whatever lies at a name somebody could guess, a link or a FIFO at
  // <out>.tmp, is neither written through nor waited on.
  std::string tmp = path;
  absl::StatusOr<client::OutputFile> file = absl::UnknownError("not opened");
  if (through) {
    file = client::OutputFile::Open(tmp);
  } else {
    for (int attempt = 0; attempt < 8; ++attempt) {
      tmp = absl::StrCat(
          path, ".", absl::Hex(absl::Uniform<uint64_t>(absl::BitGen()), absl::kZeroPad16), ".tmp");
      file = client::OutputFile::CreateNew(tmp);
      if (file.ok() || !absl::StrContains(file.status().message(), std::strerror(EEXIST))) break;
    }
  }
  if (!file.ok()) return LocalError(c, file.status());
  absl::Status local;  // the file's failure, as opposed to the call's
  absl::StatusOr<client::ExportResult> r;
  {
    const WorkingNote note(
        c.err, c.err_is_terminal, c.working_note_after,
        WorkingText(absl::StrCat("Export of ", Quoted(*id)), c.connection.target));
    r = kv.ExportSequence(*id, [&](absl::string_view b) {
      local = file->Write(b);
      return local;
    });
  }
  if (r.ok()) local = file->Close();
  if (r.ok() && local.ok() && !through) {
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      local = absl::DataLossError(
          absl::StrCat("cannot rename '", tmp, "' to '", *out, "': ", ec.message()));
    }
  }
  if (!r.ok() || !local.ok()) {
    (void)file->Close();  // the error that matters is reported below
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

}  // namespace

std::vector<Command> SeqPersistenceSubcommands() {
  std::vector<Command> subs;
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
       "serving meanwhile. They go to a new file FILE.<random>.tmp, renamed to FILE when the "
       "stream\n"
       "ended well, so a failed export leaves no FILE; --out - writes them to stdout and nothing\n"
       "else.\n"
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

}  // namespace attend::cli
