// Writes the seed corpus of snapshot_fuzz into a directory (tests/fuzz/corpus/snapshot): KV-cache
// snapshots made by KvCache::Save and SnapshotWriter, which make_corpus.py cannot make (their
// XXH3 checksums). Seeds are seed-*, rewritten on each run; other files are kept.
//
//   build/tests/fuzz/snapshot_corpus tests/fuzz/corpus/snapshot
//
// Valid snapshots of several shapes (f32, bf16 and int8 storage; GQA; a sliding window that
// released blocks, saved with smaller blocks than the fuzz target's cache; a reservation; layers
// of different lengths; an explicit scale; an empty sequence; a fork with shared tokens, and one
// sharing another count in each layer; several chunks a layer, written with SnapshotWriter), and
// a few damaged ones (cut, a flipped row byte, a newer format version, bytes after the trailer).
// Values are deterministic, so that the files only change when the format does. The seeds of
// format version 1 are kept as v1-seed-* (not rewritten), so that the reader of the older
// format stays covered.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/snapshot_format.h"

namespace attend::kv {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "snapshot_corpus: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

KvCacheOptions Options(int64_t block_bytes) {
  KvCacheOptions options;
  options.capacity_bytes = int64_t{4} << 20;
  options.block_bytes = block_bytes;
  options.huge_pages = false;
  options.compute_threads = 1;
  int64_t now = 1700000000000;
  options.clock = [now]() mutable { return now += 1000; };
  return options;
}

SequenceConfig Config(int64_t layers, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                      DType dtype, int64_t window = 0) {
  SequenceConfig c;
  c.layers = layers;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.head_dim = head_dim;
  c.head_dim_v = head_dim;
  c.kv_dtype = dtype;
  c.window = window;
  return c;
}

std::vector<float> Values(int64_t n, uint32_t* seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    *seed = *seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(*seed >> 8) % 4096 - 2048) / 512.0f;
  }
  return v;
}

void Append(KvCache& cache, const std::string& id, const SequenceConfig& c, int64_t layer,
            int64_t n, uint32_t seed) {
  const std::vector<float> k = Values(n * c.n_head_kv * c.head_dim, &seed);
  const std::vector<float> v = Values(n * c.n_head_kv * c.head_dim_v, &seed);
  AppendInput in;
  in.id = id;
  in.k = TensorView{DType::kFloat32, {n, c.n_head_kv, c.head_dim}, k.data()};
  in.v = TensorView{DType::kFloat32, {n, c.n_head_kv, c.head_dim_v}, v.data()};
  AttentionStats stats;
  Check(cache.Append(layer, in, Precision::kFloat32, false, &stats).status(),
        absl::StrCat("append to ", id));
}

std::string Save(KvCache& cache, const std::string& id) {
  std::string bytes;
  Check(cache.Save(id, StringSink(&bytes), "corpus"), absl::StrCat("save ", id));
  return bytes;
}

// A sequence of `tokens[l]` tokens in each layer, saved.
std::string Make(const SequenceConfig& c, const std::string& id, const std::vector<int64_t>& tokens,
                 int64_t block_bytes = 1024, int64_t reserve = 0) {
  KvCache cache(Options(block_bytes));
  Check(cache.Create(c, id, reserve).status(), absl::StrCat("create ", id));
  for (int64_t l = 0; l < c.layers; ++l) {
    const int64_t n = tokens[static_cast<size_t>(l)];
    if (n > 0) Append(cache, id, c, l, n, static_cast<uint32_t>(17 * l + n));
  }
  return Save(cache, id);
}

// A fork of a 40-token sequence at 32 tokens with 5 more, saved with its shared tokens.
std::string Fork() {
  const SequenceConfig c = Config(2, 2, 1, 8, DType::kBFloat16);
  KvCache cache(Options(512));  // 16 tokens a block: 2 whole blocks shared
  Check(cache.Create(c, "doc", 0).status(), "create doc");
  for (int64_t l = 0; l < 2; ++l) Append(cache, "doc", c, l, 40, static_cast<uint32_t>(3 + l));
  Check(cache.Fork("doc", "doc/alt", 32).status(), "fork");
  for (int64_t l = 0; l < 2; ++l) Append(cache, "doc/alt", c, l, 5, static_cast<uint32_t>(9 + l));
  return Save(cache, "doc/alt");
}

// A fork of a 3-layer sequence made mid-block (at 20 tokens), then its source appended to in
// layer 0 and the fork in layer 2: each layer shares another count of tokens (16, 20 and 16).
std::string ForkPerLayer() {
  const SequenceConfig c = Config(3, 2, 1, 8, DType::kBFloat16);
  KvCache cache(Options(512));  // 16 tokens a block
  Check(cache.Create(c, "doc", 0).status(), "create doc");
  for (int64_t l = 0; l < 3; ++l) Append(cache, "doc", c, l, 30, static_cast<uint32_t>(3 + l));
  Check(cache.Fork("doc", "doc/mid", 20).status(), "fork");
  Append(cache, "doc", c, 0, 1, 11);
  Append(cache, "doc/mid", c, 2, 2, 12);
  return Save(cache, "doc/mid");
}

// Rows written with SnapshotWriter in chunks of 3 tokens: several chunks a layer.
std::string SmallChunks() {
  SnapshotHeader h;
  h.id = "chunked";
  h.attend_version = "corpus";
  h.config = Config(3, 2, 2, 4, DType::kFloat32);
  h.created_ms = 1700000000000;
  h.layer_tokens = {10, 7, 0};
  h.first_stored = {0, 0, 0};
  std::string out;
  SnapshotWriter writer(StringSink(&out));
  Check(writer.WriteHeader(h), "header");
  uint32_t seed = 5;
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t first = 0; first < h.layer_tokens[static_cast<size_t>(l)]; first += 3) {
      const int64_t count = std::min<int64_t>(3, h.layer_tokens[static_cast<size_t>(l)] - first);
      const std::vector<float> rows = Values(count * h.row_bytes() / 4, &seed);
      Check(writer.WriteChunk(
                l, first, count,
                absl::string_view(reinterpret_cast<const char*>(rows.data()), rows.size() * 4)),
            "chunk");
    }
  }
  Check(writer.Finish(), "finish");
  return out;
}

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(dir, "/seed-", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) Die("cannot write " + path);
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
}

}  // namespace
}  // namespace attend::kv

int main(int argc, char** argv) {
  using namespace attend::kv;  // NOLINT
  using attend::DType;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string f32 = Make(Config(2, 4, 2, 4, DType::kFloat32), "f32", {9, 9});
  Write(dir, "f32", f32);
  Write(dir, "bf16-uneven-layers", Make(Config(3, 2, 2, 8, DType::kBFloat16), "bf16", {40, 3, 0}));
  Write(dir, "int8-gqa", Make(Config(2, 4, 1, 8, DType::kInt8), "int8", {20, 20}));
  // 16 rows of 16 bytes a 256-byte block: the window released 2 blocks, from token 32, which
  // the fuzz target's 1 KiB blocks do not start at.
  Write(dir, "int8-window-small-blocks",
        Make(Config(1, 1, 1, 4, DType::kInt8, 12), "win", {45}, 256));
  Write(dir, "f32-window", Make(Config(2, 2, 1, 4, DType::kFloat32, 8), "fwin", {70, 70}, 1024));
  Write(dir, "bf16-reserved",
        Make(Config(2, 2, 2, 4, DType::kBFloat16), "reserved", {5, 5}, 1024, 100));
  SequenceConfig scaled = Config(1, 2, 2, 4, DType::kBFloat16);
  scaled.scale = 0.125f;
  Write(dir, "bf16-scale", Make(scaled, "scaled", {4}));
  Write(dir, "empty", Make(Config(2, 1, 1, 4, DType::kFloat32), "empty", {0, 0}));
  Write(dir, "bf16-fork-shared", Fork());
  Write(dir, "bf16-fork-shared-per-layer", ForkPerLayer());
  Write(dir, "f32-small-chunks", SmallChunks());

  // Damaged (the fuzz target repairs their checksums too, so they load or fail further in).
  Write(dir, "damaged-cut", f32.substr(0, f32.size() / 2));
  std::string flipped = f32;
  flipped[flipped.find("CHNK") + 30] ^= 0x40;
  Write(dir, "damaged-row-flipped", flipped);
  std::string future = f32;
  future[8] = static_cast<char>(kSnapshotFormatVersion + 1);
  Write(dir, "damaged-future-version", future);
  Write(dir, "damaged-extra-bytes", f32 + "DONE");
  return 0;
}
