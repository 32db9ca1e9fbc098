// KV-cache snapshots (core/kv_cache/snapshot_format.h) against the disk they are written to, in
// one run: (a) the disk's own sequential write (write() in 8 MiB pieces, then fsync) and read
// (after posix_fadvise(POSIX_FADV_DONTNEED) dropped the file from the page cache) of as many
// bytes as the snapshots; (b) KvCache::Save of every sequence of a cache to its own file in the
// same directory, each fsynced; (c) KvCache::Load of those files, dropped from the page cache
// first, into a fresh cache (its memory faulted in as the rows land, as after a restart) and
// again into the same cache with its blocks reused; (d) the same Save and Load to and from
// memory (StringSink, StringSource), which is the format's own cost: the block-to-row copies and
// the XXH3 checksums (and, into a fresh cache, the page faults).
// Rates are snapshot bytes per second (GB = 1e9 bytes); the ratios put save against the disk's
// write and load against its read, and the in-memory rates against this machine's memory read
// bandwidth, measured in the same run (bench/machine_limits.h).
//
// The cache is bf16, 32 layers x 8 KV heads x head_dim 128 (Llama-3-8B's KV shape: 128 KiB a
// token over the layers), 1 MiB blocks (the server's default), filled with random rows.
//
//   build/bench/snapshot_bench [--dir=/tmp] [--bytes=1GiB] [--sequences=8] [--keep]
//
// --bytes is the cache's rows in total (K, M, G, KiB, MiB, GiB suffixes), split evenly over
// --sequences. The files (snapshot-bench-*) are removed at the end unless --keep.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bench/machine_limits.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/snapshot_format.h"

namespace attend::bench {
namespace {

constexpr int64_t kLayers = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kTokenBytes = kLayers * kKvHeads * 2 * kDim * 2;  // over the layers, bf16
constexpr size_t kPiece = size_t{8} << 20;

struct Flags {
  std::string dir = "/tmp";
  int64_t bytes = int64_t{1} << 30;
  int64_t sequences = 8;
  bool keep = false;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "snapshot_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

int64_t ParseBytes(absl::string_view text) {
  static const std::pair<const char*, int64_t> kSuffixes[] = {{"GiB", int64_t{1} << 30},
                                                              {"MiB", int64_t{1} << 20},
                                                              {"KiB", int64_t{1} << 10},
                                                              {"G", 1000000000},
                                                              {"M", 1000000},
                                                              {"K", 1000}};
  int64_t unit = 1;
  for (const auto& [suffix, scale] : kSuffixes) {
    if (absl::EndsWith(text, suffix)) {
      text.remove_suffix(std::strlen(suffix));
      unit = scale;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n <= 0) Die(absl::StrCat("bad byte count '", text, "'"));
  return n * unit;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (absl::StartsWith(a, "--dir=")) {
      f.dir = std::string(a.substr(6));
    } else if (absl::StartsWith(a, "--bytes=")) {
      f.bytes = ParseBytes(a.substr(8));
    } else if (absl::StartsWith(a, "--sequences=")) {
      if (!absl::SimpleAtoi(a.substr(12), &f.sequences) || f.sequences < 1) Die("bad --sequences");
    } else if (a == "--keep") {
      f.keep = true;
    } else {
      Die(absl::StrCat("unknown flag ", a,
                       " (--dir=DIR --bytes=N[KiB|MiB|GiB] --sequences=N --keep)"));
    }
  }
  return f;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) Die(absl::StrCat("write ", path, ": ", std::strerror(errno)));
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// Drops the file from the page cache (after it was fsynced); returns the fraction of its pages
// still resident afterwards (mincore), -1 when that cannot be told.
double DropFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  struct stat st {};
  double resident = -1;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> in((static_cast<size_t>(st.st_size) + page - 1) / page);
      if (::mincore(map, static_cast<size_t>(st.st_size), in.data()) == 0) {
        int64_t n = 0;
        for (unsigned char c : in) n += c & 1;
        resident = static_cast<double>(n) / static_cast<double>(in.size());
      }
      ::munmap(map, static_cast<size_t>(st.st_size));
    }
  }
  ::close(fd);
  return resident;
}

struct Row {
  std::string what;
  int64_t bytes = 0;
  double seconds = 0;
  std::string ratio;
  double rate() const { return static_cast<double>(bytes) / seconds / 1e9; }
};

kv::KvCacheOptions CacheOptions(int64_t capacity) {
  kv::KvCacheOptions o;
  o.capacity_bytes = capacity;
  o.block_bytes = int64_t{1} << 20;
  o.compute_threads = 1;
  o.max_bookkeeping_bytes = int64_t{64} << 20;
  return o;
}

kv::SequenceConfig Config() {
  kv::SequenceConfig c;
  c.layers = kLayers;
  c.n_head = 4 * kKvHeads;
  c.n_head_kv = kKvHeads;
  c.head_dim = kDim;
  c.head_dim_v = kDim;
  c.kv_dtype = DType::kBFloat16;
  return c;
}

// Fills `tokens` tokens of every layer of `id` with random rows, 256 tokens an append.
void Fill(kv::KvCache& cache, const std::string& id, int64_t tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  constexpr int64_t kStep = 256;
  std::vector<float> k(static_cast<size_t>(kStep * kKvHeads * kDim));
  std::vector<float> v(k.size());
  for (int64_t first = 0; first < tokens; first += kStep) {
    const int64_t n = std::min(kStep, tokens - first);
    for (int64_t l = 0; l < kLayers; ++l) {
      for (size_t i = 0; i < static_cast<size_t>(n * kKvHeads * kDim); ++i) {
        k[i] = normal(rng);
        v[i] = normal(rng);
      }
      kv::AppendInput in;
      in.id = id;
      in.k = TensorView{DType::kFloat32, {n, kKvHeads, kDim}, k.data()};
      in.v = TensorView{DType::kFloat32, {n, kKvHeads, kDim}, v.data()};
      AttentionStats stats;
      Check(cache.Append(l, in, Precision::kAuto, false, &stats).status(), "append");
    }
  }
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  const int64_t tokens = std::max<int64_t>(1, flags.bytes / flags.sequences / kTokenBytes);
  const int64_t rows_bytes = tokens * kTokenBytes * flags.sequences;
  // Room for the rows, the last partial block of each layer, and a second copy's worth of
  // nothing else: loads go into a fresh cache of the same size.
  const int64_t blocks_per_layer = (tokens + 255) / 256;
  const int64_t capacity = flags.sequences * kLayers * blocks_per_layer * (int64_t{1} << 20);
  std::printf(
      "snapshot_bench: %lld sequences of %lld tokens, %.0f MiB of bf16 rows (%lld "
      "layers x %lld KV heads x head_dim %lld, 1 MiB blocks), dir %s\n",
      static_cast<long long>(flags.sequences), static_cast<long long>(tokens),
      static_cast<double>(rows_bytes) / (1 << 20), static_cast<long long>(kLayers),
      static_cast<long long>(kKvHeads), static_cast<long long>(kDim), flags.dir.c_str());
  std::fflush(stdout);

  const MachineLimits limits = MeasureLimitsNow();
  std::vector<Row> table;

  // (a) The disk alone: as many bytes as the snapshots, in 8 MiB writes, fsynced.
  const std::string disk_path = flags.dir + "/snapshot-bench-disk";
  const int64_t disk_bytes = (rows_bytes + kPiece - 1) / kPiece * kPiece;
  std::string piece(kPiece, '\0');
  {
    std::mt19937_64 rng(7);
    for (size_t i = 0; i + 8 <= piece.size(); i += 8) {
      const uint64_t x = rng();
      std::memcpy(&piece[i], &x, 8);
    }
  }
  double disk_write = 0, disk_read = 0, disk_resident = 0;
  {
    const double start = Now();
    const int fd = ::open(disk_path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) Die(absl::StrCat("open ", disk_path, ": ", std::strerror(errno)));
    for (int64_t done = 0; done < disk_bytes; done += kPiece) {
      piece[0] = static_cast<char>(done >> 23);  // no two pieces alike
      WriteAll(fd, piece.data(), piece.size(), disk_path);
    }
    if (::fsync(fd) != 0) Die(absl::StrCat("fsync ", disk_path, ": ", std::strerror(errno)));
    ::close(fd);
    disk_write = Now() - start;
    disk_resident = DropFromPageCache(disk_path);
    const double read_start = Now();
    const int in = ::open(disk_path.c_str(), O_RDONLY);
    int64_t got = 0;
    while (true) {
      const ssize_t r = ::read(in, piece.data(), piece.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) Die(absl::StrCat("read ", disk_path, ": ", std::strerror(errno)));
      if (r == 0) break;
      got += r;
    }
    ::close(in);
    disk_read = Now() - read_start;
    if (got != disk_bytes) Die("the disk file read back short");
    ::unlink(disk_path.c_str());
  }
  table.push_back({"disk write (8 MiB writes + fsync)", disk_bytes, disk_write, ""});
  table.push_back({"disk read (after DONTNEED)", disk_bytes, disk_read, ""});

  // The cache to save.
  std::vector<std::string> ids;
  kv::KvCache cache(CacheOptions(capacity));
  const double fill_start = Now();
  for (int64_t s = 0; s < flags.sequences; ++s) {
    ids.push_back(absl::StrCat("bench/", s));
    Check(cache.Create(Config(), ids.back(), 0).status(), "create");
    Fill(cache, ids.back(), tokens, static_cast<uint32_t>(s + 1));
  }
  std::printf(
      "filled in %.1f s; memory read bandwidth %.1f GB/s; pages resident after "
      "DONTNEED: %.0f%%\n",
      Now() - fill_start, limits.read_bytes_per_second / 1e9, disk_resident * 100);

  // (d) first, to memory: the format's own cost (the strings sized up front, so that growing
  // them is not measured).
  std::vector<std::string> images(ids.size());
  int64_t snapshot_bytes = 0;
  {
    for (size_t s = 0; s < ids.size(); ++s) {  // sizes, to reserve
      int64_t n = 0;
      Check(cache.Save(
                ids[s], [&n](absl::string_view b) { return n += b.size(), absl::OkStatus(); },
                "bench"),
            "size");
      images[s].reserve(static_cast<size_t>(n));
      snapshot_bytes += n;
    }
    const double start = Now();
    for (size_t s = 0; s < ids.size(); ++s) {
      Check(cache.Save(ids[s], kv::StringSink(&images[s]), "bench"), "save to memory");
    }
    table.push_back({"save to memory (StringSink)", snapshot_bytes, Now() - start, ""});
  }
  {
    // Into a fresh cache (its memory faulted in as the rows land: what a restart pays), then,
    // everything released, again into the same one (its blocks reused): the format's own cost.
    kv::KvCache loaded(CacheOptions(capacity));
    for (const char* pool : {"fresh", "warm"}) {
      const double start = Now();
      for (size_t s = 0; s < ids.size(); ++s) {
        kv::SnapshotReader reader(kv::StringSource(images[s]), "memory");
        Check(loaded.Load(reader).status(), "load from memory");
      }
      table.push_back(
          {absl::StrCat("load from memory, ", pool, " cache"), snapshot_bytes, Now() - start, ""});
      for (const std::string& id : ids) Check(loaded.Release(id).status(), "release");
    }
  }
  const double memory_rate = limits.read_bytes_per_second / 1e9;
  for (size_t i = table.size() - 3; i < table.size(); ++i) {
    table[i].ratio = absl::StrFormat("%.2f of memory read", table[i].rate() / memory_rate);
  }
  images.clear();
  images.shrink_to_fit();

  // (b) To files, one a sequence, each fsynced before it is closed.
  std::vector<std::string> paths;
  {
    const double start = Now();
    for (size_t s = 0; s < ids.size(); ++s) {
      paths.push_back(absl::StrCat(flags.dir, "/snapshot-bench-", s, ".attnsnap"));
      const std::string& path = paths.back();
      const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
      if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
      Check(cache.Save(
                ids[s],
                [fd, &path](absl::string_view b) {
                  WriteAll(fd, b.data(), b.size(), path);
                  return absl::OkStatus();
                },
                "bench"),
            "save to file");
      if (::fsync(fd) != 0) Die(absl::StrCat("fsync ", path, ": ", std::strerror(errno)));
      ::close(fd);
    }
    const double seconds = Now() - start;
    table.push_back({"save to files (+ fsync)", snapshot_bytes, seconds,
                     absl::StrFormat("%.2f of disk write", static_cast<double>(snapshot_bytes) /
                                                               seconds / 1e9 / table[0].rate())});
  }
  // (c) From the files, dropped from the page cache, into a fresh cache; then again into the
  // same cache with its blocks reused (the files dropped again).
  {
    kv::KvCache loaded(CacheOptions(capacity));
    for (const char* pool : {"fresh", "warm"}) {
      double resident = 0;
      for (const std::string& path : paths) resident += DropFromPageCache(path);
      const double start = Now();
      for (const std::string& path : paths) {
        const int fd = ::open(path.c_str(), O_RDONLY);
        if (fd < 0) Die(absl::StrCat("open ", path, ": ", std::strerror(errno)));
        kv::SnapshotReader reader(
            [fd](char* dst, size_t n) -> absl::StatusOr<size_t> {
              while (true) {
                const ssize_t r = ::read(fd, dst, n);
                if (r >= 0) return static_cast<size_t>(r);
                if (errno != EINTR) return absl::ErrnoToStatus(errno, "read");
              }
            },
            path);
        Check(loaded.Load(reader).status(), "load from file");
        ::close(fd);
      }
      const double seconds = Now() - start;
      table.push_back(
          {absl::StrCat("load from files, ", pool, " cache"), snapshot_bytes, seconds,
           absl::StrFormat("%.2f of disk read (%.0f%% resident)",
                           static_cast<double>(snapshot_bytes) / seconds / 1e9 / table[1].rate(),
                           resident / static_cast<double>(paths.size()) * 100)});
      for (const std::string& id : ids) Check(loaded.Release(id).status(), "release");
    }
  }
  if (!flags.keep) {
    for (const std::string& path : paths) ::unlink(path.c_str());
  }

  std::printf("%-34s %10s %9s %8s  %s\n", "", "MiB", "seconds", "GB/s", "ratio");
  for (const Row& r : table) {
    std::printf("%-34s %10.0f %9.3f %8.2f  %s\n", r.what.c_str(),
                static_cast<double>(r.bytes) / (1 << 20), r.seconds, r.rate(), r.ratio.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace attend::bench

int main(int argc, char** argv) { return attend::bench::Main(argc, argv); }
