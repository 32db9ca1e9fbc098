// Where the KV cache's snapshots live on disk (--snapshot_dir), and the two moments they are
// used: a warm restart (every sequence saved after the drain, restored before the port opens)
// and SaveSequence / LoadSequence on request.
//
//   <dir>/CURRENT           names the complete generation to restore ("gen-000007")
//   <dir>/gen-000007/       one file per sequence, <id with '/' as '+'>.attnsnap
//   <dir>/saved/            SaveSequence's files, <name>.attnsnap
//   <dir>/KERNELS           the decode kernel sets the last start computed with (one line, in
//                           --simd_kernels' form; blank lines and '#' comments around it)
//
// Crash safety: every file is written as <name>.tmp, fsynced, renamed and its directory fsynced.
// A shutdown writes a new generation next to the current one and switches CURRENT (the same
// way) only once every file of it is on disk, then removes the older generations. A kill at any
// moment leaves CURRENT naming a generation whose files are all complete: the new one or the
// previous one. Files in a generation that CURRENT does not name are never read.
//
// Same arithmetic after a restart: kernel sets sum in different orders (simd.h), and a start
// measures which set is fastest again, so a restart could decode the restored sequences with
// another set, different in the last bits. KERNELS records the sets a server runs; the next start
// with this directory and no --simd_kernels runs them again (when this CPU can).
//
// Never stale: a restore removes CURRENT before it loads (a crash after it restores nothing
// rather than the state of the shutdown before, which the clients have moved past), and a save
// that skipped sequences (out of time, an error) still becomes CURRENT, without them.
//
// Thread-safety: SaveAll and RestoreAll are for start-up and shutdown (one thread, no calls in
// flight); SaveOne and LoadOne may run concurrently with each other and with calls (two saves to
// one name: the last rename wins, each file whole).
#ifndef ATTEND_SERVER_SNAPSHOT_STORE_H_
#define ATTEND_SERVER_SNAPSHOT_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/cancellation.h"
#include "core/kv_cache/kv_cache.h"

namespace attend::server {

struct SnapshotReport {
  int64_t sequences = 0;  // saved or restored
  int64_t bytes = 0;      // file bytes written or read
  double seconds = 0.0;
  // Sequences not saved (the grace ran out, an error) or files not restored, each "<what>:
  // <why>", in the order met.
  std::vector<std::string> skipped;
  int64_t damaged = 0;     // of the files skipped, those refused as damaged (DATA_LOSS)
  std::string generation;  // the generation written or read ("" when none)
};

class SnapshotStore {
 public:
  // Creates `dir` (and its parent) when missing, and locks `dir`/LOCK for as long as the store
  // (or a copy of it) lives: a directory is one running server's, since two servers' snapshots
  // would remove each other's generations. INVALID_ARGUMENT when it cannot be made, is not a
  // writable directory, or another process holds its lock. A restore loads on up to `threads`
  // threads.
  static absl::StatusOr<SnapshotStore> Open(const std::string& dir, int threads = 1);

  // Saves every sequence of `cache` as a new generation and makes it CURRENT, in the time left
  // until `deadline`: sequences it has no time for are skipped (and named), the ones written are
  // kept. Each sequence is saved whole or not at all. An error when the generation could not be
  // made CURRENT (then there is no CURRENT: nothing is restored).
  absl::StatusOr<SnapshotReport> SaveAll(kv::KvCache& cache,
                                         std::chrono::steady_clock::time_point deadline) const;

  // Loads CURRENT's generation into `cache` (empty when there is none) and removes CURRENT:
  // sources before their forks, so that forks share their blocks again. A file that cannot be
  // loaded (damaged, refused by the cache) is skipped with its reason; the others load.
  SnapshotReport RestoreAll(kv::KvCache& cache) const;

  // SaveSequence: `id` to saved/<name>.attnsnap (name empty: the id). Returns the file's bytes.
  // INVALID_ARGUMENT for a bad name; the cache's NOT_FOUND; CANCELLED, the file untouched, when
  // `cancel` is set before the file is renamed into place; RESOURCE_EXHAUSTED for a full disk,
  // FAILED_PRECONDITION for a directory in the file's place, INTERNAL for other I/O errors.
  absl::StatusOr<int64_t> SaveOne(kv::KvCache& cache, absl::string_view id, absl::string_view name,
                                  const Cancellation* cancel = nullptr) const;
  // LoadSequence: saved/<name>.attnsnap into `cache` as `id` (empty: the saved id). NOT_FOUND
  // when there is no such file; DATA_LOSS naming it when it is damaged or no regular file (never
  // waited on); CANCELLED, nothing added, when `cancel` is set while it is read; the load's
  // errors otherwise.
  absl::StatusOr<kv::SequenceInfo> LoadOne(kv::KvCache& cache, absl::string_view name,
                                           absl::string_view id,
                                           const Cancellation* cancel = nullptr) const;

  // The id a SaveSequence file `name` was saved from (its header's), or the errors of LoadOne.
  absl::StatusOr<std::string> SavedId(absl::string_view name) const;

  // Records `kernels` (simd::KernelName()) in KERNELS, atomically. INTERNAL for I/O errors.
  absl::Status RecordKernels(absl::string_view kernels) const;

  // The kernel sets KERNELS in `dir` names (its one line that is neither blank nor a '#'
  // comment, without the spaces or CR around it): "" when there is no such file (or no
  // directory). DATA_LOSS, naming the file and what is wrong, when it is not a regular file or a
  // link to one (a FIFO, a directory, a socket, a device, a link to nothing: refused unopened,
  // and never waited on), cannot be read, is empty or larger than 4 KiB, holds no line or more
  // than one, or a line that simd::ParseKernels refuses (in its words). Whether this CPU runs
  // the sets is the caller's check (simd::SetKernels).
  static absl::StatusOr<std::string> RecordedKernels(const std::string& dir);

  const std::string& dir() const { return dir_; }

  // The file name a sequence id or a save name gets ('/' -> '+', then ".attnsnap"), and back.
  static std::string FileNameOf(absl::string_view id);

 private:
  SnapshotStore(std::string dir, int threads, std::shared_ptr<const int> lock)
      : dir_(std::move(dir)), threads_(threads), lock_(std::move(lock)) {}
  std::string dir_;
  int threads_ = 1;
  std::shared_ptr<const int> lock_;  // the open DIR/LOCK, closed (and unlocked) with the last copy
};

}  // namespace attend::server

#endif  // ATTEND_SERVER_SNAPSHOT_STORE_H_
