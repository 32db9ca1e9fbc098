#include "server/snapshot_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/version/version.h"
#include "core/base/status_macros.h"
#include "core/kernels/simd.h"
#include "core/kv_cache/sequence_registry.h"
#include "core/kv_cache/snapshot_format.h"
#include "server/snapshot_files.h"

namespace attend::server {
namespace {

using snapshot_files::Fd;
using snapshot_files::FileKind;
using snapshot_files::FileSource;
using snapshot_files::ListDir;
using snapshot_files::MakeDir;
using snapshot_files::OpenRegular;
using snapshot_files::RemoveAbandoned;
using snapshot_files::SyncDir;
using snapshot_files::WriteAtomically;

constexpr char kSuffix[] = ".attnsnap";
constexpr char kCurrent[] = "CURRENT";
constexpr char kLock[] = "LOCK";
constexpr char kKernels[] = "KERNELS";
constexpr size_t kMaxKernelName = 128;
// What RecordKernels writes is about 300 bytes, its comments included.
constexpr int64_t kMaxKernelsFile = 4096;
constexpr char kGenerationPrefix[] = "gen-";

using Clock = std::chrono::steady_clock;

// The generation number of "gen-000007", or -1.
int64_t GenerationNumber(absl::string_view name) {
  int64_t n = -1;
  if (!absl::ConsumePrefix(&name, kGenerationPrefix) || name.empty() ||
      !absl::SimpleAtoi(name, &n)) {
    return -1;
  }
  return n;
}

// The generation CURRENT names: "" when there is no CURRENT (nothing to restore), else the name,
// or an error saying why CURRENT names no generation that is there.
absl::StatusOr<std::string> ReadCurrent(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kCurrent);
  absl::StatusOr<Fd> opened = OpenRegular(path);
  if (absl::IsNotFound(opened.status())) return std::string();
  if (!opened.ok()) {
    return absl::DataLossError(absl::StrCat("cannot be read: ", opened.status().message()));
  }
  const Fd& fd = *opened;
  char text[64];
  const ssize_t n = read(fd.get(), text, sizeof(text));
  if (n < 0) return absl::DataLossError(absl::StrCat("cannot be read: ", strerror(errno)));
  std::string name(text, static_cast<size_t>(n));
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  if (GenerationNumber(name) < 0) {
    return absl::DataLossError(
        absl::StrCat("holds ", absl::CHexEscape(name.substr(0, 32)), n == sizeof(text) ? "..." : "",
                     ", which names no generation (damaged or written by hand)"));
  }
  struct stat st;
  if (stat(absl::StrCat(dir, "/", name).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::DataLossError(
        absl::StrCat("names generation ", name, ", which is not a directory there"));
  }
  return name;
}

void RemoveGeneration(const std::string& path) {
  for (const std::string& name : ListDir(path)) unlink(absl::StrCat(path, "/", name).c_str());
  rmdir(path.c_str());
}

struct Opened {
  explicit Opened(int file) : fd(file) {}
  Fd fd;
  int64_t bytes = 0;
  std::unique_ptr<kv::SnapshotReader> reader;
};

absl::StatusOr<std::unique_ptr<Opened>> OpenSnapshot(const std::string& path,
                                                     const Cancellation* cancel = nullptr) {
  ATTEND_ASSIGN_OR_RETURN(Fd fd, OpenRegular(path));
  auto opened = std::make_unique<Opened>(fd.release());
  opened->reader = std::make_unique<kv::SnapshotReader>(
      FileSource(opened->fd.get(), &opened->bytes, cancel), path);
  return opened;
}

// Loads the file at `path`, sharing with its source when it can; a source that changed since
// the save (FAILED_PRECONDITION) means loading it again on blocks of its own.
absl::StatusOr<kv::SequenceInfo> LoadFile(kv::KvCache& cache, const std::string& path,
                                          absl::string_view id, int64_t* bytes,
                                          const Cancellation* cancel = nullptr) {
  for (const bool share : {true, false}) {
    ATTEND_ASSIGN_OR_RETURN(std::unique_ptr<Opened> opened, OpenSnapshot(path, cancel));
    absl::StatusOr<kv::SequenceInfo> info = cache.Load(*opened->reader, id, share);
    *bytes += opened->bytes;
    if (share && info.status().code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(info.status().message(), "load it without sharing")) {
      continue;
    }
    return info;
  }
  return absl::InternalError("unreachable");
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

std::string SnapshotStore::FileNameOf(absl::string_view id) {
  return absl::StrCat(absl::StrReplaceAll(id, {{"/", "+"}}), kSuffix);
}

absl::StatusOr<SnapshotStore> SnapshotStore::Open(const std::string& dir, int threads) {
  if (dir.empty()) return absl::InvalidArgumentError("--snapshot_dir: empty");
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  // The parent first (one level), so that a fresh volume's subdirectory works.
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) (void)MakeDir(path.substr(0, slash));
  if (absl::Status made = MakeDir(path); !made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--snapshot_dir ", dir, ": ", made.message()));
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_dir ", dir, ": not writable: ", std::strerror(errno)));
  }
  // Leftovers of a save that was killed: never read, removed now (generations that were being
  // written are removed whole once a newer one is complete).
  RemoveAbandoned(path);
  RemoveAbandoned(absl::StrCat(path, "/saved"));
  // One server per directory: a second one's snapshot would remove the first one's generations
  // (and its failure the CURRENT the first had written).
  const std::string lock_path = absl::StrCat(path, "/", kLock);
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--snapshot_dir ", dir, ": cannot open ",
                                                   lock_path, ": ", std::strerror(errno)));
  }
  std::shared_ptr<const int> lock(new int(lock_fd), [](const int* fd) {
    close(*fd);
    delete fd;
  });
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--snapshot_dir ", dir, ": another attend-server uses it (it holds ", lock_path,
        "); each server needs a snapshot directory of its own (fleet.sh and the StatefulSet give "
        "each replica one); saved files move by copying them or with ExportSequence"));
  }
  return SnapshotStore(path, threads, std::move(lock));
}

absl::Status SnapshotStore::RecordKernels(absl::string_view kernels) const {
  const std::string text = absl::StrCat(
      kernels,
      "\n# The decode kernel sets attend-server computed with. A start with this --snapshot_dir"
      "\n# and no --simd_kernels runs them again, so that restored sequences decode bit for bit"
      "\n# as before. Remove this file to let the next start measure them again.\n");
  return WriteAtomically(dir_, kKernels, [&text](const kv::ByteSink& sink) { return sink(text); })
      .status();
}

absl::StatusOr<std::string> SnapshotStore::RecordedKernels(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kKernels);
  const auto damaged = [&path](auto&&... what) {
    return absl::DataLossError(absl::StrCat(path, " ", what...));
  };
  // Read before the server serves, while SIGTERM waits for it: a FIFO would block open() until
  // a writer came, and opening a device may do anything. So only a regular file is opened: stat
  // (through a link) refuses the rest unopened, and the open cannot block (O_NONBLOCK) on what
  // may have replaced the file since; fstat then checks what was opened.
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int error = errno;
    struct stat link;
    if (error == ENOENT && lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      char target[256];
      const ssize_t n = readlink(path.c_str(), target, sizeof(target));
      return damaged(
          "is a symbolic link to '",
          absl::CHexEscape(absl::string_view(target, n > 0 ? static_cast<size_t>(n) : 0)),
          "', which does not exist");
    }
    if (error == ENOENT || error == ENOTDIR) return std::string();
    return damaged("cannot be read: ", std::strerror(error));
  }
  const auto not_regular = [&](mode_t mode) {
    struct stat link;
    const bool linked = lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode);
    return damaged(linked ? "is a symbolic link to " : "is ", FileKind(mode),
                   ", not a regular file");
  };
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  Fd fd(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::string();  // removed since the stat
    return damaged("cannot be read: ", std::strerror(errno));
  }
  if (fstat(fd.get(), &st) != 0) return damaged("cannot be read: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  if (st.st_size > kMaxKernelsFile) {
    return damaged("is ", st.st_size, " bytes; a record is at most ", kMaxKernelsFile);
  }
  std::string text(static_cast<size_t>(kMaxKernelsFile) + 1, '\0');
  size_t size = 0;
  while (size < text.size()) {
    const ssize_t n = read(fd.get(), text.data() + size, text.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return damaged("cannot be read: ", std::strerror(errno));
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  if (size > static_cast<size_t>(kMaxKernelsFile)) {  // grew since the fstat
    return damaged("is more than ", kMaxKernelsFile, " bytes, the most a record is");
  }
  text.resize(size);
  if (text.empty()) return damaged("is empty");
  // One line of sets; blank lines and '#' comments around it are not read. Spaces and a CR
  // around the line are no part of a name: a hand edit or a Windows editor leaves them.
  std::vector<std::pair<int, absl::string_view>> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line.front() != '#') lines.emplace_back(number, line);
  }
  if (lines.empty()) return damaged("holds no kernel sets (only blank and comment lines)");
  if (lines.size() > 1) {
    // Which line was meant is the operator's call: refused whole, naming each.
    std::string named;
    for (size_t i = 0; i < lines.size() && i < 4; ++i) {
      absl::StrAppend(&named, i > 0 ? ", " : "", "'",
                      absl::CHexEscape(lines[i].second.substr(0, 64)), "' (line ", lines[i].first,
                      ")");
    }
    return damaged("holds ", lines.size(), " lines of kernel sets, not one: ", named,
                   lines.size() > 4 ? ", ..." : "");
  }
  const auto [line_number, line] = lines.front();
  if (line.size() > kMaxKernelName) {
    return damaged("line ", line_number, " is ", line.size(),
                   " characters long; kernel sets are at most ", kMaxKernelName);
  }
  // The form --simd_kernels takes, read by the same parser so that both say the same.
  if (absl::StatusOr<simd::KernelSets> sets =
          simd::ParseKernels(std::string_view(line.data(), line.size()));
      !sets.ok()) {
    return damaged("holds '", absl::CHexEscape(line), "': ", sets.status().message());
  }
  return std::string(line);
}

absl::StatusOr<SnapshotReport> SnapshotStore::SaveAll(kv::KvCache& cache,
                                                      Clock::time_point deadline) const {
  const auto start = Clock::now();
  SnapshotReport report;
  int64_t next = 0;
  // Generations that CURRENT does not name are never restored (saves that did not complete, or
  // the one the start restored): removed before this one is written, so that their bytes do not
  // take the room it needs. The one CURRENT names stays until this one replaces it.
  const absl::StatusOr<std::string> current = ReadCurrent(dir_);
  for (const std::string& name : ListDir(dir_)) {
    const int64_t number = GenerationNumber(name);
    next = std::max(next, number + 1);
    if (number >= 0 && (!current.ok() || name != *current)) {
      RemoveGeneration(absl::StrCat(dir_, "/", name));
    }
  }
  report.generation = absl::StrFormat("%s%06d", kGenerationPrefix, next);
  const std::string gen_dir = absl::StrCat(dir_, "/", report.generation);
  ATTEND_RETURN_IF_ERROR(MakeDir(gen_dir));
  std::vector<std::string> ids;
  for (std::string token;;) {
    absl::StatusOr<kv::ListPage> page = cache.List(1000, token);
    if (!page.ok()) break;
    for (const kv::SequenceInfo& info : page->sequences) ids.push_back(info.id);
    if (page->next_page_token.empty()) break;
    token = page->next_page_token;
  }
  const std::string version = VersionLine("attend-server");
  // Each sequence's file on its own thread (up to threads_): the writes' fsyncs wait on the
  // disk while other sequences are read out and hashed.
  std::vector<absl::StatusOr<int64_t>> results(ids.size(), int64_t{0});
  const auto save = [&](size_t i) {
    const std::string& id = ids[i];
    if (Clock::now() >= deadline) {
      results[i] = absl::DeadlineExceededError("not saved, the shutdown grace ran out");
      return;
    }
    results[i] = WriteAtomically(gen_dir, FileNameOf(id), [&](const kv::ByteSink& sink) {
      // Past the deadline the save stops mid-file: the sequence is skipped, not torn.
      const kv::ByteSink bounded = [&](absl::string_view piece) {
        if (Clock::now() >= deadline) {
          return absl::DeadlineExceededError("the shutdown grace ran out while it was saved");
        }
        return sink(piece);
      };
      return cache.Save(id, bounded, version);
    });
  };
  std::atomic<size_t> next_id{0};
  std::vector<std::thread> threads;
  for (size_t w = 1; w < std::min<size_t>(ids.size(), std::max(1, threads_)); ++w) {
    threads.emplace_back([&] {
      for (size_t k; (k = next_id.fetch_add(1)) < ids.size();) save(k);
    });
  }
  for (size_t k; (k = next_id.fetch_add(1)) < ids.size();) save(k);
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!results[i].ok()) {
      // Released meanwhile is no loss; anything else is named.
      if (!absl::IsNotFound(results[i].status())) {
        report.skipped.push_back(absl::StrCat(ids[i], ": ", results[i].status().message()));
      }
      continue;
    }
    report.sequences++;
    report.bytes += *results[i];
  }
  // The new generation becomes CURRENT even when sequences were skipped: an older generation
  // holds older states of the sequences, and restoring one would hand clients a cache behind
  // what they sent, without a word. When CURRENT cannot be written, nothing is restored.
  absl::Status committed = SyncDir(gen_dir);
  if (committed.ok()) {
    committed = WriteAtomically(dir_, kCurrent, [&](const kv::ByteSink& sink) {
                  return sink(absl::StrCat(report.generation, "\n"));
                }).status();
  }
  if (!committed.ok()) {
    unlink(absl::StrCat(dir_, "/", kCurrent).c_str());
    (void)SyncDir(dir_);
    RemoveGeneration(gen_dir);
    return committed;
  }
  for (const std::string& name : ListDir(dir_)) {
    if (GenerationNumber(name) >= 0 && name != report.generation) {
      RemoveGeneration(absl::StrCat(dir_, "/", name));
    }
  }
  report.seconds = SecondsSince(start);
  return report;
}

SnapshotReport SnapshotStore::RestoreAll(kv::KvCache& cache) const {
  const auto start = Clock::now();
  SnapshotReport report;
  absl::StatusOr<std::string> current = ReadCurrent(dir_);
  if (!current.ok()) {
    // Said by name, and nothing else is guessed: another generation in the directory is a save
    // that never completed, or older than what clients were answered.
    report.damaged++;
    report.skipped.push_back(
        absl::StrCat(kCurrent, " ", current.status().message(), "; nothing was restored"));
    return report;
  }
  report.generation = *std::move(current);
  if (report.generation.empty()) return report;
  const std::string gen_dir = absl::StrCat(dir_, "/", report.generation);
  // Headers first: sources load before their forks, so that forks share their blocks again.
  struct File {
    std::string path, id, forked_from;
  };
  std::vector<File> files;
  for (const std::string& name : ListDir(gen_dir)) {
    if (!absl::EndsWith(name, kSuffix)) continue;
    const std::string path = absl::StrCat(gen_dir, "/", name);
    absl::StatusOr<std::unique_ptr<Opened>> opened = OpenSnapshot(path);
    absl::StatusOr<kv::SnapshotHeader> header =
        opened.ok() ? (*opened)->reader->ReadHeader() : opened.status();
    if (!header.ok()) {
      if (absl::IsDataLoss(header.status())) report.damaged++;
      report.skipped.push_back(absl::StrCat(name, ": ", header.status().message()));
      continue;
    }
    files.push_back({path, header->id, header->forked_from});
  }
  // The load order: a file after the file of its source when that is in this generation. A
  // cycle (only a corrupted set has one) is broken by taking the rest as they come.
  std::set<std::string> here, placed;
  for (const File& f : files) here.insert(f.id);
  std::vector<size_t> order;
  std::vector<bool> taken(files.size(), false);
  while (order.size() < files.size()) {
    bool progress = false;
    for (size_t i = 0; i < files.size(); ++i) {
      const File& f = files[i];
      if (taken[i] || (!f.forked_from.empty() && here.count(f.forked_from) > 0 &&
                       placed.count(f.forked_from) == 0)) {
        continue;
      }
      taken[i] = true;
      placed.insert(f.id);
      order.push_back(i);
      progress = true;
    }
    if (!progress) {
      for (size_t i = 0; i < files.size(); ++i) {
        if (!taken[i]) {
          taken[i] = true;
          order.push_back(i);
        }
      }
    }
  }
  // Restored once: the generation is what the sequences were at the last clean shutdown, and a
  // crash from here on must not bring that back behind what clients have sent since. Its files
  // stay until the next save, unread.
  if (unlink(absl::StrCat(dir_, "/", kCurrent).c_str()) == 0) (void)SyncDir(dir_);
  // Sequences whose source is not in the set load first, on several threads: a restart's
  // loads are mostly the kernel faulting the pool's fresh pages in, which runs in parallel
  // (one thread loaded 0.2-0.4 GB/s on a 2-vCPU VM). Forks follow, in order, sharing again.
  std::vector<size_t> roots, forks;
  for (const size_t i : order) {
    const File& f = files[i];
    (f.forked_from.empty() || here.count(f.forked_from) == 0 ? roots : forks).push_back(i);
  }
  std::vector<absl::Status> results(files.size());
  std::vector<int64_t> bytes(files.size(), 0);
  const auto load = [&](size_t i) {
    results[i] = LoadFile(cache, files[i].path, {}, &bytes[i]).status();
  };
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  const size_t workers = std::min<size_t>(roots.size(), std::max(1, threads_));
  for (size_t w = 1; w < workers; ++w) {
    threads.emplace_back([&] {
      for (size_t k; (k = next.fetch_add(1)) < roots.size();) load(roots[k]);
    });
  }
  for (size_t k; (k = next.fetch_add(1)) < roots.size();) load(roots[k]);
  for (std::thread& t : threads) t.join();
  for (const size_t i : forks) load(i);
  for (const size_t i : order) {
    report.bytes += bytes[i];
    if (!results[i].ok()) {
      if (absl::IsDataLoss(results[i])) report.damaged++;
      report.skipped.push_back(absl::StrCat(files[i].id, ": ", results[i].message()));
      continue;
    }
    report.sequences++;
  }
  report.seconds = SecondsSince(start);
  return report;
}

absl::StatusOr<int64_t> SnapshotStore::SaveOne(kv::KvCache& cache, absl::string_view id,
                                               absl::string_view name,
                                               const Cancellation* cancel) const {
  const absl::string_view file = name.empty() ? id : name;
  ATTEND_RETURN_IF_ERROR(kv::CheckSequenceId(file, name.empty() ? "sequence_id" : "name"));
  const std::string saved = absl::StrCat(dir_, "/saved");
  if (absl::Status made = MakeDir(saved); !made.ok()) {
    // The directory's state, not the request's.
    return absl::FailedPreconditionError(made.message());
  }
  // The sequence is looked up first, so that an unknown id is NOT_FOUND and writes nothing.
  ATTEND_RETURN_IF_ERROR(cache.Get(id).status());
  const std::string version = VersionLine("attend-server");
  return WriteAtomically(
      saved, FileNameOf(file),
      [&](const kv::ByteSink& sink) {
        // A call cancelled (or past its deadline) while it writes stops there: the client was told
        // it failed, so the file it may have had keeps its old bytes.
        const kv::ByteSink checked = [&](absl::string_view piece) {
          ATTEND_RETURN_IF_ERROR(CheckCancelled(cancel, "SaveSequence"));
          return sink(piece);
        };
        // Saved alone: a file that a load elsewhere needs nothing else for (no shared prefix).
        ATTEND_RETURN_IF_ERROR(cache.Save(id, checked, version, /*share_with_source=*/false));
        return CheckCancelled(cancel, "SaveSequence");
      },
      cancel);
}

absl::StatusOr<kv::SequenceInfo> SnapshotStore::LoadOne(kv::KvCache& cache, absl::string_view name,
                                                        absl::string_view id,
                                                        const Cancellation* cancel) const {
  ATTEND_RETURN_IF_ERROR(kv::CheckSequenceId(name, "name"));
  int64_t bytes = 0;
  return LoadFile(cache, absl::StrCat(dir_, "/saved/", FileNameOf(name)), id, &bytes, cancel);
}

absl::StatusOr<std::string> SnapshotStore::SavedId(absl::string_view name) const {
  ATTEND_RETURN_IF_ERROR(kv::CheckSequenceId(name, "name"));
  ATTEND_ASSIGN_OR_RETURN(std::unique_ptr<Opened> opened,
                          OpenSnapshot(absl::StrCat(dir_, "/saved/", FileNameOf(name))));
  ATTEND_ASSIGN_OR_RETURN(const kv::SnapshotHeader header, opened->reader->ReadHeader());
  return header.id;
}

}  // namespace attend::server
