// KV-cache persistence through the server: a warm restart (save after the drain, restore before
// serving) brings every sequence back, forks sharing their blocks again, and each one's next
// decode is bit-identical to the same decode without the restart; SaveSequence / LoadSequence
// round trips, with their errors (no directory, unknown or damaged files, bad names, routing).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "attend/v1/kv_cache.grpc.pb.h"
#include "core/kernels/simd.h"
#include "gmock/gmock.h"
#include "server/snapshot_store.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::F32Data;
using ::attend::testing::RandomFloats;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 16;

std::string TempDir() {
  char pattern[] = "/tmp/attend-snapshot-test-XXXXXX";
  const char* dir = mkdtemp(pattern);
  EXPECT_NE(dir, nullptr);
  return dir;
}

// The names in `dir`, but . and ..
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

server::ServerOptions Options(const std::string& dir) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  options.snapshot_dir = dir;
  options.kv_cache.capacity_bytes = int64_t{64} << 20;
  options.kv_cache.block_bytes = int64_t{8} << 10;  // a few dozen tokens a block
  options.compute_threads = 1;
  return options;
}

class Client {
 public:
  explicit Client(const server::AttendServer& s)
      : stub_(v1::KvCache::NewStub(::attend::testing::ChannelTo(s))) {}

  grpc::Status Create(const std::string& id, v1::DType dtype, int64_t window) {
    v1::CreateSequenceRequest request;
    request.set_sequence_id(id);
    v1::SequenceConfig* c = request.mutable_config();
    c->set_layers(2);
    c->set_n_head(kHeads);
    c->set_n_head_kv(kKvHeads);
    c->set_head_dim(kDim);
    c->set_kv_dtype(dtype);
    c->set_window_tokens(window);
    v1::SequenceInfo info;
    grpc::ClientContext context;
    return stub_->CreateSequence(&context, request, &info);
  }
  // Appends n seeded tokens to every layer; returns the outputs' raw bytes.
  // Appends n seeded tokens to both layers; with_q false caches keys and values only (no
  // attention computed: fast for big fills).
  std::string Append(const std::string& id, int64_t n, uint64_t seed, bool with_q = true) {
    std::string out;
    for (int layer = 0; layer < 2; ++layer) {
      std::mt19937_64 rng(seed * 7 + static_cast<uint64_t>(layer));
      v1::AppendRequest request;
      request.set_sequence_id(id);
      request.set_layer(layer);
      const std::vector<float> q = RandomFloats(rng, n * kHeads * kDim);
      if (with_q) *request.mutable_q() = F32Data({n, kHeads, kDim}, q);
      *request.mutable_k() = F32Data({n, kKvHeads, kDim}, RandomFloats(rng, n * kKvHeads * kDim));
      *request.mutable_v() = F32Data({n, kKvHeads, kDim}, RandomFloats(rng, n * kKvHeads * kDim));
      v1::AppendResponse response;
      grpc::ClientContext context;
      const grpc::Status status = stub_->Append(&context, request, &response);
      EXPECT_TRUE(status.ok()) << id << ": " << status.error_message();
      out += response.output().data();
    }
    return out;
  }
  grpc::Status Fork(const std::string& source, const std::string& id) {
    v1::ForkRequest request;
    request.set_source_id(source);
    request.set_new_id(id);
    v1::SequenceInfo info;
    grpc::ClientContext context;
    return stub_->Fork(&context, request, &info);
  }
  grpc::Status Release(const std::string& id) {
    v1::ReleaseRequest request;
    request.set_sequence_id(id);
    v1::ReleaseResponse response;
    grpc::ClientContext context;
    return stub_->Release(&context, request, &response);
  }
  // Every sequence, page by page (a page holds at most 1000; a busy forker makes more).
  std::map<std::string, v1::SequenceInfo> List() {
    std::map<std::string, v1::SequenceInfo> out;
    std::string token;
    do {
      v1::ListSequencesRequest request;
      request.set_page_size(1000);
      request.set_page_token(token);
      v1::ListSequencesResponse response;
      grpc::ClientContext context;
      const grpc::Status status = stub_->ListSequences(&context, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) break;
      for (const v1::SequenceInfo& info : response.sequences()) out[info.sequence_id()] = info;
      token = response.next_page_token();
    } while (!token.empty());
    return out;
  }
  grpc::Status Save(const std::string& id, const std::string& name,
                    v1::SaveSequenceResponse* response, const std::string& key = "") {
    v1::SaveSequenceRequest request;
    request.set_sequence_id(id);
    request.set_name(name);
    grpc::ClientContext context;
    if (!key.empty()) context.AddMetadata("x-attend-sequence-key", key);
    return stub_->SaveSequence(&context, request, response);
  }
  grpc::Status Load(const std::string& name, const std::string& id, v1::SequenceInfo* info,
                    const std::string& key = "") {
    v1::LoadSequenceRequest request;
    request.set_name(name);
    request.set_sequence_id(id);
    grpc::ClientContext context;
    if (!key.empty()) context.AddMetadata("x-attend-sequence-key", key);
    return stub_->LoadSequence(&context, request, info);
  }

  grpc::Status Export(const std::string& id, std::string* bytes, int* chunks = nullptr,
                      int64_t chunk_bytes = 0) {
    v1::ExportSequenceRequest request;
    request.set_sequence_id(id);
    request.set_chunk_bytes(chunk_bytes);
    grpc::ClientContext context;
    auto reader = stub_->ExportSequence(&context, request);
    v1::SequenceChunk chunk;
    bytes->clear();
    int n = 0;
    while (reader->Read(&chunk)) {
      EXPECT_LE(chunk.data().size(), chunk_bytes == 0 ? size_t{1} << 20 : chunk_bytes);
      *bytes += chunk.data();
      ++n;
    }
    if (chunks != nullptr) *chunks = n;
    return reader->Finish();
  }
  // Sends `bytes` in pieces of `piece` bytes; the first message names `id` (may be empty).
  grpc::Status Import(const std::string& bytes, const std::string& id, v1::SequenceInfo* info,
                      size_t piece = 4096, const std::string& key = "",
                      std::optional<bool> share = std::nullopt) {
    grpc::ClientContext context;
    if (!key.empty()) context.AddMetadata("x-attend-sequence-key", key);
    auto writer = stub_->ImportSequence(&context, info);
    size_t at = 0;
    bool first = true;
    do {
      v1::ImportSequenceRequest request;
      if (first) {
        request.set_sequence_id(id);
        if (share) request.set_share_with_source(*share);
      }
      first = false;
      const size_t n = std::min(piece, bytes.size() - at);
      request.set_data(bytes.substr(at, n));
      at += n;
      if (!writer->Write(request)) break;
    } while (at < bytes.size());
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status HandOff(v1::HandOffResponse* response) {
    grpc::ClientContext context;
    return stub_->HandOff(&context, v1::HandOffRequest(), response);
  }

 private:
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

// The next step of `id` as it is now, computed on a throwaway fork (copy-on-write: `id`
// itself is not changed).
std::string NextStep(Client& c, const std::string& id, uint64_t seed) {
  const std::string probe = id + "/probe";
  EXPECT_TRUE(c.Fork(id, probe).ok());
  const std::string out = c.Append(probe, 1, seed);
  EXPECT_TRUE(c.Release(probe).ok());
  return out;
}

TEST(SnapshotService, WarmRestartRestoresEverySequenceBitIdentical) {
  const std::string dir = TempDir();
  std::map<std::string, std::string> want;  // id -> its next step's output bytes
  std::map<std::string, v1::SequenceInfo> before;
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
    Client c(**started);
    ASSERT_TRUE((*started)->restored().has_value());
    EXPECT_EQ((*started)->restored()->sequences, 0);
    std::mt19937_64 rng(5);
    for (const v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16, v1::INT8}) {
      for (const int64_t window : {int64_t{0}, int64_t{24}}) {
        const std::string id = absl::StrCat("s", dtype, "-w", window);
        ASSERT_TRUE(c.Create(id, dtype, window).ok());
        c.Append(id, 150 + static_cast<int64_t>(rng() % 100), rng());  // whole blocks
        if (window == 0) {  // a fork with a tail of its own
          ASSERT_TRUE(c.Fork(id, id + "/fork").ok());
          c.Append(id + "/fork", 5, rng());
        }
      }
    }
    before = c.List();
    for (const auto& [id, info] : before) want[id] = NextStep(c, id, 99);
    // The destructor drains (nothing in flight) and saves.
  }
  // Two restarts in a row: the second restores what the first one saved again.
  for (int restart = 0; restart < 2; ++restart) {
    SCOPED_TRACE(absl::StrCat("restart ", restart));
    server::ServerOptions options = Options(dir);
    options.metrics_address = "127.0.0.1:0";
    auto started = server::AttendServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    const server::SnapshotReport& restored = *(*started)->restored();
    EXPECT_EQ(restored.sequences, static_cast<int64_t>(before.size()));
    const std::string metrics = ::attend::testing::ScrapeMetrics((*started)->metrics_port());
    EXPECT_NE(metrics.find(absl::StrCat("attend_snapshot_restored_sequences ", before.size())),
              std::string::npos)
        << metrics.substr(0, 200);
    EXPECT_NE(metrics.find("attend_snapshot_restore_skipped_files 0"), std::string::npos);
    EXPECT_TRUE(restored.skipped.empty()) << restored.skipped.front();
    EXPECT_GT(restored.bytes, 0);
    Client c(**started);
    const std::map<std::string, v1::SequenceInfo> after = c.List();
    ASSERT_EQ(after.size(), before.size());
    for (const auto& [id, info] : before) {
      SCOPED_TRACE(id);
      ASSERT_EQ(after.count(id), 1u);
      const v1::SequenceInfo& got = after.at(id);
      EXPECT_EQ(std::vector<int64_t>(got.layer_tokens().begin(), got.layer_tokens().end()),
                std::vector<int64_t>(info.layer_tokens().begin(), info.layer_tokens().end()));
      EXPECT_EQ(got.forked_from(), info.forked_from());
      EXPECT_EQ(got.config().kv_dtype(), info.config().kv_dtype());
      EXPECT_EQ(got.config().window_tokens(), info.config().window_tokens());
      if (!info.forked_from().empty()) {
        EXPECT_GT(got.shared_blocks(), 0) << "the fork shares its source's blocks again";
      }
      EXPECT_EQ(NextStep(c, id, 99), want.at(id)) << "the next step differs after the restart";
    }
  }
  // A server started on the directory after one that restored and then stopped without a
  // save would find nothing to restore: shown here by removing what the last one saved.
  std::remove(absl::StrCat(dir, "/CURRENT").c_str());
  auto fresh = server::AttendServer::Start(Options(dir));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->restored()->sequences, 0);
  EXPECT_TRUE(Client(**fresh).List().empty());
}

// A CURRENT that names no generation there restores nothing, and says so by name (it used to
// look like an empty directory): garbage, a path, a generation that is missing or not a
// directory. No other generation is guessed at.
TEST(SnapshotService, ADamagedCurrentIsNamedAndRestoresNothing) {
  const std::string dir = TempDir();
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok());
    ASSERT_TRUE(Client(**started).Create("kept", v1::FLOAT32, 0).ok());
  }
  const auto write_current = [&](const std::string& text) {
    FILE* f = std::fopen(absl::StrCat(dir, "/CURRENT").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  const std::string file = absl::StrCat(dir, "/gen-000777");
  FILE* not_a_dir = std::fopen(file.c_str(), "w");
  ASSERT_NE(not_a_dir, nullptr);
  std::fclose(not_a_dir);
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"garbage\x01\n", "names no generation"},
           {"../../etc\n", "names no generation"},
           {"gen-999999\n", "gen-999999, which is not a directory"},
           {"gen-000777\n", "gen-000777, which is not a directory"}}) {
    SCOPED_TRACE(text);
    write_current(text);
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
    const server::SnapshotReport& restored = *(*started)->restored();
    EXPECT_EQ(restored.sequences, 0);
    EXPECT_EQ(restored.damaged, 1);
    ASSERT_EQ(restored.skipped.size(), 1u);
    EXPECT_EQ(restored.skipped[0].rfind("CURRENT ", 0), 0u) << restored.skipped[0];
    EXPECT_NE(restored.skipped[0].find(why), std::string::npos) << restored.skipped[0];
    EXPECT_TRUE(Client(**started).List().empty());
    (*started)->Shutdown(absl::Seconds(1));
  }
}

TEST(SnapshotService, SaveAndLoadSequenceOnRequest) {
  const std::string dir = TempDir();
  auto started = server::AttendServer::Start(Options(dir));
  ASSERT_TRUE(started.ok()) << started.status();
  Client c(**started);
  ASSERT_TRUE(c.Create("chat/1", v1::BFLOAT16, 0).ok());
  c.Append("chat/1", 70, 3);
  const std::string next = NextStep(c, "chat/1", 4);
  v1::SaveSequenceResponse saved;
  ASSERT_TRUE(c.Save("chat/1", "", &saved).ok());
  EXPECT_EQ(saved.name(), "chat/1");
  EXPECT_GT(saved.bytes(), 70 * 2 * kKvHeads * 2 * kDim * 2);
  ASSERT_TRUE(c.Save("chat/1", "backup", &saved).ok());
  ASSERT_TRUE(c.Release("chat/1").ok());

  v1::SequenceInfo info;
  ASSERT_TRUE(c.Load("chat/1", "", &info).ok());  // under the id it was saved from
  EXPECT_EQ(info.sequence_id(), "chat/1");
  EXPECT_EQ(info.layer_tokens(0), 70);
  EXPECT_EQ(NextStep(c, "chat/1", 4), next);
  ASSERT_TRUE(c.Load("backup", "chat/2", &info).ok());
  EXPECT_EQ(NextStep(c, "chat/2", 4), next);
  EXPECT_EQ(c.Load("backup", "chat/2", &info).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  const auto expect = [&](const grpc::Status& status, grpc::StatusCode code,
                          const std::string& fragment) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_NE(status.error_message().find(fragment), std::string::npos) << status.error_message();
  };
  expect(c.Load("nothing", "x", &info), grpc::StatusCode::NOT_FOUND, "no snapshot file");
  expect(c.Load("../etc/passwd", "x", &info), grpc::StatusCode::INVALID_ARGUMENT, "name");
  expect(c.Save("chat/1", "a/../b", &saved), grpc::StatusCode::INVALID_ARGUMENT, "name");
  expect(c.Save("nobody", "", &saved), grpc::StatusCode::NOT_FOUND, "nobody");
  expect(c.Save("chat/1", "", &saved, "other"), grpc::StatusCode::INVALID_ARGUMENT,
         "x-attend-sequence-key");
  expect(c.Load("", "x", &info), grpc::StatusCode::INVALID_ARGUMENT, "name");
  const grpc::Status bad_id = c.Load("backup", "bad id!", &info);
  EXPECT_EQ(bad_id.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad_id.error_message().rfind("sequence_id", 0), 0u) << bad_id.error_message();
  // The sequence a load makes must route where the call went: the id asked for, or the saved
  // one (chat/1's key is "chat").
  expect(c.Load("backup", "elsewhere/1", &info, "chat"), grpc::StatusCode::INVALID_ARGUMENT,
         "x-attend-sequence-key");
  expect(c.Load("backup", "", &info, "other"), grpc::StatusCode::INVALID_ARGUMENT,
         "the saved sequence's id");
  EXPECT_EQ(c.List().count("elsewhere/1"), 0u);
  ASSERT_TRUE(c.Load("backup", "chat/keyed", &info, "chat").ok());

  // A damaged file is refused by name and adds nothing.
  const std::string path = absl::StrCat(dir, "/saved/backup.attnsnap");
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, 200), 1);
  byte = static_cast<char>(byte ^ 0x10);
  ASSERT_EQ(pwrite(fd, &byte, 1, 200), 1);
  close(fd);
  expect(c.Load("backup", "chat/3", &info), grpc::StatusCode::DATA_LOSS, "backup.attnsnap");
  EXPECT_EQ(c.List().count("chat/3"), 0u);
  // What it keeps serving meanwhile.
  EXPECT_EQ(NextStep(c, "chat/1", 5), NextStep(c, "chat/2", 5));
}

// A save writes a temporary file of its own and renames it: whatever lies at another path (a
// FIFO left where a save's temporary file would go) never blocks it, and saves of one name at
// the same time each leave a whole file (the last rename wins), never a mix of both.
TEST(SnapshotService, SavesNeverBlockAndConcurrentSavesOfOneNameStayWhole) {
  const std::string dir = TempDir();
  server::ServerOptions options = Options(dir);
  options.compute_threads = 4;
  auto started = server::AttendServer::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Client c(**started);
  ASSERT_TRUE(c.Create("chat/1", v1::BFLOAT16, 0).ok());
  ASSERT_TRUE(c.Create("chat/2", v1::BFLOAT16, 0).ok());
  c.Append("chat/1", 300, 3);
  c.Append("chat/2", 300, 4);
  const std::string next1 = NextStep(c, "chat/1", 9), next2 = NextStep(c, "chat/2", 9);
  ASSERT_NE(next1, next2);

  ASSERT_EQ(mkdir((dir + "/saved").c_str(), 0755), 0);
  const std::string fifo = dir + "/saved/stuck.attnsnap.tmp";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::future<grpc::Status> save = std::async(std::launch::async, [&] {
    v1::SaveSequenceResponse saved;
    return c.Save("chat/1", "stuck", &saved);
  });
  if (save.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "SaveSequence blocked on the FIFO at " << fifo;
    // A reader lets the open return; reading lets the writes through.
    const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    std::vector<char> sink(1 << 16);
    while (save.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      if (reader >= 0 && read(reader, sink.data(), sink.size()) < 0) continue;
    }
    if (reader >= 0) close(reader);
  }
  EXPECT_TRUE(save.get().ok());
  v1::SequenceInfo info;
  const grpc::Status stuck = c.Load("stuck", "chat/stuck", &info);
  EXPECT_TRUE(stuck.ok()) << stuck.error_message();
  if (stuck.ok()) {
    EXPECT_EQ(NextStep(c, "chat/stuck", 9), next1);
  }

  std::vector<std::thread> savers;
  std::atomic<int> failed{0};
  for (int i = 0; i < 8; ++i) {
    savers.emplace_back([&, i] {
      for (int round = 0; round < 4; ++round) {
        v1::SaveSequenceResponse saved;
        if (!c.Save(i % 2 == 0 ? "chat/1" : "chat/2", "same", &saved).ok()) failed++;
      }
    });
  }
  for (std::thread& t : savers) t.join();
  EXPECT_EQ(failed.load(), 0);
  const grpc::Status loaded = c.Load("same", "chat/same", &info);
  ASSERT_TRUE(loaded.ok()) << loaded.error_message();
  const std::string next = NextStep(c, "chat/same", 9);
  EXPECT_TRUE(next == next1 || next == next2);
  // Nothing is left behind but the saved files (and the FIFO the test made).
  for (const std::string& name : Names(dir + "/saved")) {
    EXPECT_TRUE(name == "stuck.attnsnap" || name == "same.attnsnap" || name == "stuck.attnsnap.tmp")
        << name;
  }
  // A start removes what killed saves left in saved/ (and the FIFO, named as one of them).
  {
    const int fd =
        open((dir + "/saved/killed.attnsnap.123-4.tmp").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "partial", 7), 7);
    close(fd);
  }
  started->reset();
  auto restarted = server::AttendServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  std::vector<std::string> names = Names(dir + "/saved");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"same.attnsnap", "stuck.attnsnap"}));
}

// What is not a regular file where a snapshot file belongs is refused by name and never
// waited on: a FIFO (or a link to one) at a saved name would block the load's open() until a
// writer came, holding a worker thread for good. A save whose file name is taken by a directory
// says so with FAILED_PRECONDITION, and the directory stays.
TEST(SnapshotService, LoadsRefuseWhatIsNoRegularFileWithoutBlocking) {
  const std::string dir = TempDir();
  auto started = server::AttendServer::Start(Options(dir));
  ASSERT_TRUE(started.ok()) << started.status();
  Client c(**started);
  ASSERT_TRUE(c.Create("chat/1", v1::FLOAT32, 0).ok());
  c.Append("chat/1", 40, 3);
  ASSERT_EQ(mkdir((dir + "/saved").c_str(), 0755), 0);
  ASSERT_EQ(mkfifo((dir + "/saved/fifo.attnsnap").c_str(), 0644), 0);
  ASSERT_EQ(symlink((dir + "/saved/fifo.attnsnap").c_str(), (dir + "/saved/link.attnsnap").c_str()),
            0);
  ASSERT_EQ(mkdir((dir + "/saved/folder.attnsnap").c_str(), 0755), 0);
  ASSERT_EQ(symlink("loop.attnsnap", (dir + "/saved/loop.attnsnap").c_str()), 0);
  for (const auto& [name, kind] : std::vector<std::pair<std::string, std::string>>{
           {"fifo", "is a FIFO, not a regular file"},
           {"link", "is a FIFO, not a regular file"},
           {"folder", "is a directory, not a regular file"},
           {"loop", "is a loop of symbolic links"}}) {
    SCOPED_TRACE(name);
    std::future<grpc::Status> load = std::async(std::launch::async, [&c, name = name] {
      v1::SequenceInfo info;
      return c.Load(name, "chat/" + name, &info);
    });
    if (load.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "LoadSequence blocked on " << name;
      const int writer = open((dir + "/saved/fifo.attnsnap").c_str(), O_WRONLY | O_NONBLOCK);
      load.wait();
      if (writer >= 0) close(writer);
    }
    const grpc::Status status = load.get();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr(absl::StrCat(dir, "/saved/", name, ".attnsnap ", kind)));
  }
  v1::SaveSequenceResponse saved;
  const grpc::Status taken = c.Save("chat/1", "folder", &saved);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << taken.error_message();
  EXPECT_THAT(taken.error_message(), ::testing::HasSubstr("folder.attnsnap"));
  struct stat st;
  EXPECT_TRUE(stat((dir + "/saved/folder.attnsnap").c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  // It serves on, and a save under a free name works.
  ASSERT_TRUE(c.Save("chat/1", "fine", &saved).ok());
  v1::SequenceInfo info;
  EXPECT_TRUE(c.Load("fine", "chat/2", &info).ok());
}

// A start never waits on a FIFO in the snapshot directory (at CURRENT, or at a sequence's file in
// the generation CURRENT names: that one is skipped by name, the others restored), and removes
// only the temporary files no save holds: one that another server sharing the directory is
// writing (its lock held) stays.
TEST(SnapshotService, StartsNeverBlockAndKeepTemporaryFilesInUse) {
  const std::string dir = TempDir();
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
    Client c(**started);
    for (const char* id : {"a", "b", "c"}) {
      ASSERT_TRUE(c.Create(id, v1::FLOAT32, 0).ok());
      c.Append(id, 20, 5);
    }
  }  // drained and saved
  const auto start = [&](absl::string_view fifo) {
    std::future<absl::StatusOr<std::unique_ptr<server::AttendServer>>> starting =
        std::async(std::launch::async, [&] { return server::AttendServer::Start(Options(dir)); });
    if (starting.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "the start blocked on " << fifo;
      const int writer = open(std::string(fifo).c_str(), O_WRONLY | O_NONBLOCK);
      starting.wait();
      if (writer >= 0) close(writer);
    }
    return starting.get();
  };
  std::ifstream current_file(dir + "/CURRENT");
  std::string current;
  std::getline(current_file, current);
  const std::string generation =
      absl::StrCat(dir, "/", absl::StripTrailingAsciiWhitespace(current));
  // A FIFO in place of b's file: a and c come back, b is named.
  ASSERT_EQ(unlink((generation + "/b.attnsnap").c_str()), 0);
  ASSERT_EQ(mkfifo((generation + "/b.attnsnap").c_str(), 0644), 0);
  // Temporary files: one abandoned, one another server holds.
  ASSERT_EQ(mkdir((dir + "/saved").c_str(), 0755), 0);
  const std::string abandoned = dir + "/saved/x.attnsnap.7-1.tmp";
  const std::string held = dir + "/saved/y.attnsnap.7-2.tmp";
  const std::string fifo_tmp = dir + "/KERNELS.7-3.tmp";
  for (const std::string& path : {abandoned, held}) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  ASSERT_EQ(mkfifo(fifo_tmp.c_str(), 0644), 0);
  const int holder = open(held.c_str(), O_RDONLY);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(flock(holder, LOCK_EX), 0);
  {
    auto started = start(generation + "/b.attnsnap");
    ASSERT_TRUE(started.ok()) << started.status();
    const server::SnapshotReport& restored = *(*started)->restored();
    EXPECT_EQ(restored.sequences, 2);
    ASSERT_EQ(restored.skipped.size(), 1u);
    EXPECT_THAT(restored.skipped[0], ::testing::HasSubstr("b.attnsnap is a FIFO"));
    Client c(**started);
    EXPECT_EQ(c.List().size(), 2u);
  }
  struct stat st;
  EXPECT_NE(stat(abandoned.c_str(), &st), 0) << "an abandoned temporary file stayed";
  EXPECT_NE(lstat(fifo_tmp.c_str(), &st), 0) << "a FIFO named as a temporary file stayed";
  EXPECT_EQ(stat(held.c_str(), &st), 0) << "a temporary file in use was removed";
  close(holder);
  // A FIFO at CURRENT: the start restores nothing, says why, and serves.
  ASSERT_EQ(unlink((dir + "/CURRENT").c_str()), 0);
  ASSERT_EQ(mkfifo((dir + "/CURRENT").c_str(), 0644), 0);
  auto started = start(dir + "/CURRENT");
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ((*started)->restored()->sequences, 0);
  Client c(**started);
  EXPECT_TRUE(c.Create("d", v1::FLOAT32, 0).ok());
}

// A generation that no CURRENT names (a snapshot killed while it was written) is removed before
// the next snapshot is written, not after: on a disk with room for one snapshot its bytes would
// otherwise cost that snapshot its sequences. On a 3 MiB tmpfs (as root; skipped elsewhere).
TEST(SnapshotService, AnAbandonedGenerationMakesRoomForTheNextSnapshot) {
  const std::string dir = TempDir();
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=3m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
    Client c(**started);
    ASSERT_TRUE(c.Create("big", v1::FLOAT32, 0).ok());
    // 3000 tokens x 2 (k, v) x 2 heads x 16 x 4 bytes: 0.77 MB a layer, two layers.
    for (uint64_t seed = 0; seed < 3; ++seed) c.Append("big", 1000, seed, /*with_q=*/false);
    // What a killed snapshot left: 1.8 MB in a generation CURRENT does not name.
    ASSERT_EQ(mkdir((dir + "/gen-000007").c_str(), 0755), 0);
    const int fd =
        open((dir + "/gen-000007/big.attnsnap.1-2-3.tmp").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    const std::string junk(1800 << 10, 'x');
    ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    close(fd);
  }  // drained and saved
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
    EXPECT_EQ((*started)->restored()->sequences, 1);
    EXPECT_THAT((*started)->restored()->skipped, ::testing::IsEmpty());
  }
  EXPECT_EQ(umount2(dir.c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

// A SaveSequence whose call is cancelled (by the client, its deadline, the shutdown) while the
// file is written stops there: CANCELLED, and the file saved before under that name keeps its
// bytes, with nothing left beside it.
TEST(SnapshotService, ACancelledSaveLeavesTheOldFile) {
  const std::string dir = TempDir();
  auto store = server::SnapshotStore::Open(dir, 1);
  ASSERT_TRUE(store.ok()) << store.status();
  kv::KvCacheOptions options;
  options.capacity_bytes = int64_t{16} << 20;
  options.block_bytes = int64_t{8} << 10;
  kv::KvCache cache(options);
  kv::SequenceConfig config;
  config.layers = 1;
  config.n_head = kHeads;
  config.n_head_kv = kKvHeads;
  config.head_dim = kDim;
  config.kv_dtype = DType::kFloat32;
  std::mt19937_64 rng(3);
  const std::vector<float> kv = RandomFloats(rng, 100 * kKvHeads * kDim);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(cache.Create(config, id, 0).ok());
    kv::AppendInput in;
    in.id = id;
    in.k = {DType::kFloat32, {id[0] == 'a' ? 50 : 100, kKvHeads, kDim}, kv.data()};
    in.v = in.k;
    ASSERT_TRUE(cache.Append(0, in, Precision::kAuto, false, nullptr).ok());
  }
  ASSERT_TRUE(store->SaveOne(cache, "a", "x").ok());
  const std::string path = dir + "/saved/x.attnsnap";
  std::ifstream before_file(path, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(before_file)), {});
  Cancellation cancel;
  cancel.Cancel();
  const absl::StatusOr<int64_t> cancelled = store->SaveOne(cache, "b", "x", &cancel);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  std::ifstream after_file(path, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(after_file)), {}), before);
  EXPECT_EQ(Names(dir + "/saved"), std::vector<std::string>{"x.attnsnap"});
  // Not cancelled, it replaces the file.
  Cancellation live;
  ASSERT_TRUE(store->SaveOne(cache, "b", "x", &live).ok());
  ASSERT_TRUE(cache.Release("a").ok());
  const absl::StatusOr<kv::SequenceInfo> loaded = store->LoadOne(cache, "x", "c");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->layer_tokens[0], 100);
  // A load whose call is cancelled while it reads adds nothing.
  const absl::StatusOr<kv::SequenceInfo> stopped = store->LoadOne(cache, "x", "d", &cancel);
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_EQ(cache.Get("d").status().code(), absl::StatusCode::kNotFound);
}

// A snapshot directory is one running server's (DIR/LOCK): a second server's snapshot would
// remove the first one's generations. The second is refused at start, saying why; once the
// first is gone, the directory opens again.
TEST(SnapshotService, ADirectoryIsOneServersAtATime) {
  const std::string dir = TempDir();
  auto first = server::SnapshotStore::Open(dir, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  {
    const server::SnapshotStore copy = *first;  // copies share the lock
    auto second = server::AttendServer::Start(Options(dir));
    EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument) << second.status();
    EXPECT_THAT(std::string(second.status().message()),
                ::testing::HasSubstr("another attend-server uses it (it holds " + dir + "/LOCK)"));
  }
  first = absl::UnknownError("closed");
  auto again = server::AttendServer::Start(Options(dir));
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST(SnapshotService, WithoutADirectorySaveAndLoadAreRefused) {
  server::ServerOptions options = ::attend::testing::SmallServerOptions();
  auto started = server::AttendServer::Start(options);
  ASSERT_TRUE(started.ok());
  EXPECT_FALSE((*started)->restored().has_value());
  Client c(**started);
  ASSERT_TRUE(c.Create("a", v1::FLOAT32, 0).ok());
  v1::SaveSequenceResponse saved;
  EXPECT_EQ(c.Save("a", "", &saved).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::SequenceInfo info;
  EXPECT_EQ(c.Load("a", "", &info).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(SnapshotService, AnUnusableDirectoryIsRefusedAtStart) {
  server::ServerOptions options = Options("/proc/attend-cannot-be-here");
  auto started = server::AttendServer::Start(options);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << started.status();
}

// A start records the kernel sets it runs in KERNELS, which the next start reads back (main.cc
// runs them, so restored sequences keep their arithmetic); what is not one line of kernel names
// is refused by name, never taken as one.
TEST(SnapshotService, TheKernelRecordRoundTripsAndDamageIsNamed) {
  const std::string dir = TempDir();
  EXPECT_EQ(*server::SnapshotStore::RecordedKernels(dir), "");
  EXPECT_EQ(*server::SnapshotStore::RecordedKernels(dir + "/missing"), "");
  {
    auto started = server::AttendServer::Start(Options(dir));
    ASSERT_TRUE(started.ok()) << started.status();
  }
  absl::StatusOr<std::string> recorded = server::SnapshotStore::RecordedKernels(dir);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, simd::KernelName());
  auto store = server::SnapshotStore::Open(dir);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(store->RecordKernels("f32:avx2,bf16:scalar,int8:avx2").ok());
  EXPECT_EQ(*server::SnapshotStore::RecordedKernels(dir), "f32:avx2,bf16:scalar,int8:avx2");
  const std::string path = dir + "/KERNELS";
  {
    FILE* f = std::fopen(path.c_str(), "wb");  // written by hand, without a newline
    ASSERT_NE(f, nullptr);
    std::fputs("avx2", f);
    std::fclose(f);
    EXPECT_EQ(*server::SnapshotStore::RecordedKernels(dir), "avx2");
  }
  for (const std::string& text :
       {std::string(""), std::string("\n"), std::string("avx2; rm -rf /\n"),
        std::string(300, 'a') + "\n", std::string("avx\0002\n", 6)}) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    absl::StatusOr<std::string> damaged = server::SnapshotStore::RecordedKernels(dir);
    EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss)
        << absl::CHexEscape(text) << " read as " << damaged.value_or("?");
    EXPECT_THAT(std::string(damaged.status().message()), ::testing::HasSubstr(path));
  }
}

void WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

// What a hand-edited KERNELS may hold: trailing spaces and CRLF are no part of the sets, '#'
// lines are comments (RecordKernels writes some); an empty file, a record of the wrong form or
// more than one line of sets is refused, saying which, in the words of --simd_kernels' errors.
TEST(SnapshotService, TheKernelRecordIsOneLineReadAsTheFlagIs) {
  const std::string dir = TempDir();
  const std::string path = dir + "/KERNELS";
  for (const std::string& text :
       {std::string("scalar\r\n"), std::string("scalar  \n"), std::string("\t scalar"),
        std::string("# hand-written\n\nscalar\r\n\n# more\n")}) {
    WriteFile(path, text);
    absl::StatusOr<std::string> recorded = server::SnapshotStore::RecordedKernels(dir);
    ASSERT_TRUE(recorded.ok()) << absl::CHexEscape(text) << ": " << recorded.status();
    EXPECT_EQ(*recorded, "scalar") << absl::CHexEscape(text);
  }
  const struct {
    std::string text;
    std::string words;
  } damaged[] = {
      {"", path + " is empty"},
      {"\n  \n# only a comment\n", path + " holds no kernel sets (only blank and comment lines)"},
      {"avx2\navx2\nscalar",
       path + " holds 3 lines of kernel sets, not one: 'avx2' (line 1), 'avx2' (line 2), "
              "'scalar' (line 3)"},
      {"f32:avx2\n", path + " holds 'f32:avx2': names no set for bf16, int8"},
      {"AVX2\n", path + " holds 'AVX2': 'AVX2' is no kernel set: names are lowercase"},
      {"avx2,\n", "item 2 of 2 is empty"},
      {"f32:avx2,bf16:avx2,int4:avx2\n", "'int4' is no storage type"},
      {std::string(300, 'a'), path + " line 1 is 300 characters long"},
      {std::string(5000, '#'), path + " is 5000 bytes"},
  };
  for (const auto& c : damaged) {
    WriteFile(path, c.text);
    absl::StatusOr<std::string> recorded = server::SnapshotStore::RecordedKernels(dir);
    EXPECT_EQ(recorded.status().code(), absl::StatusCode::kDataLoss)
        << absl::CHexEscape(c.text) << " read as " << recorded.value_or("?");
    EXPECT_THAT(std::string(recorded.status().message()), ::testing::HasSubstr(c.words))
        << absl::CHexEscape(c.text);
  }
}

// KERNELS is read before the server serves and while SIGTERM waits for it: only a regular file
// (or a link to one) is read, and reading never blocks. A FIFO, a directory, a socket, a device,
// a link to any of them, or a link to nothing is refused by name.
TEST(SnapshotService, AKernelRecordThatIsNoRegularFileIsRefusedWithoutBlocking) {
  const std::string dir = TempDir();
  const std::string path = dir + "/KERNELS";
  const auto refused = [&](absl::string_view words) {
    // On its own thread: an open that blocks on a FIFO fails the test instead of hanging it.
    std::promise<absl::StatusOr<std::string>> promise;
    std::future<absl::StatusOr<std::string>> result = promise.get_future();
    std::thread reader(
        [&promise, &dir] { promise.set_value(server::SnapshotStore::RecordedKernels(dir)); });
    if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "reading " << path << " blocked (" << words << ")";
      // A writer lets a blocked open of a FIFO return, so that the thread can be joined.
      const int writer = open(path.c_str(), O_WRONLY | O_NONBLOCK);
      if (writer >= 0) close(writer);
    }
    reader.join();
    absl::StatusOr<std::string> recorded = result.get();
    EXPECT_EQ(recorded.status().code(), absl::StatusCode::kDataLoss)
        << words << " read as " << recorded.value_or("?");
    EXPECT_THAT(std::string(recorded.status().message()),
                ::testing::HasSubstr(absl::StrCat(path, " ", words)));
  };
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  refused("is a FIFO, not a regular file");
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  refused("is a directory, not a regular file");
  ASSERT_EQ(rmdir(path.c_str()), 0);
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    ASSERT_LT(path.size(), sizeof(address.sun_path));
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0)
        << std::strerror(errno);
    refused("is a socket, not a regular file");
    close(fd);
    ASSERT_EQ(unlink(path.c_str()), 0);
  }
  ASSERT_EQ(symlink("/dev/null", path.c_str()), 0);
  refused("is a symbolic link to a character device, not a regular file");
  ASSERT_EQ(unlink(path.c_str()), 0);
  const std::string fifo = dir + "/a-fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_EQ(symlink(fifo.c_str(), path.c_str()), 0);
  refused("is a symbolic link to a FIFO, not a regular file");
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(symlink("gone", path.c_str()), 0);
  refused("is a symbolic link to 'gone', which does not exist");
  // A link to a regular file is read.
  ASSERT_EQ(unlink(path.c_str()), 0);
  WriteFile(dir + "/elsewhere", "scalar\n");
  ASSERT_EQ(symlink("elsewhere", path.c_str()), 0);
  EXPECT_EQ(server::SnapshotStore::RecordedKernels(dir).value_or("?"), "scalar");
}

// ExportSequence streams a snapshot that ImportSequence on another server turns back into the
// same sequence: its next decode is bit-identical, under the exported id or a new one, and a
// fork shares its source's blocks again. Damaged, truncated, empty or oversized streams are
// refused by name and add nothing; the damaged ones are counted.
TEST(TransferService, ExportThenImportElsewhereIsBitIdentical) {
  server::ServerOptions small = Options(TempDir());
  auto a = server::AttendServer::Start(Options(TempDir()));
  small.metrics_address = "127.0.0.1:0";
  auto b = server::AttendServer::Start(small);
  ASSERT_TRUE(a.ok() && b.ok());
  Client ca(**a), cb(**b);
  std::mt19937_64 rng(8);
  std::map<std::string, std::string> next;
  for (const v1::DType dtype : {v1::FLOAT32, v1::BFLOAT16, v1::INT8}) {
    const std::string id = absl::StrCat("t", dtype);
    ASSERT_TRUE(ca.Create(id, dtype, dtype == v1::INT8 ? 24 : 0).ok());
    ca.Append(id, 120 + static_cast<int64_t>(rng() % 90), rng());
    next[id] = NextStep(ca, id, 7);
  }
  ASSERT_TRUE(ca.Fork("t1", "t1/f").ok());
  ca.Append("t1/f", 3, 1);
  next["t1/f"] = NextStep(ca, "t1/f", 7);
  for (const auto& [id, want] : next) {  // sources sort before their forks
    SCOPED_TRACE(id);
    std::string bytes;
    int chunks = 0;
    ASSERT_TRUE(ca.Export(id, &bytes, &chunks).ok());
    EXPECT_GE(chunks, 1);
    std::string small_chunks;
    ASSERT_TRUE(ca.Export(id, &small_chunks, &chunks, 4096).ok());
    EXPECT_EQ(small_chunks, bytes) << "chunk_bytes changes the pieces, not the snapshot";
    EXPECT_EQ(chunks, (bytes.size() + 4095) / 4096);
    v1::SequenceInfo info;
    const grpc::Status imported = cb.Import(bytes, "", &info, 1000 + rng() % 5000);
    ASSERT_TRUE(imported.ok()) << imported.error_message();
    EXPECT_EQ(info.sequence_id(), id);
    if (id == "t1/f") {
      EXPECT_GT(info.shared_blocks(), 0) << "the fork shares its source again";
    }
    EXPECT_EQ(NextStep(cb, id, 7), want);
    ASSERT_TRUE(cb.Import(bytes, id + "-copy", &info, 1 << 20).ok());
    EXPECT_EQ(NextStep(cb, id + "-copy", 7), want);
    EXPECT_EQ(cb.Import(bytes, "", &info).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  }

  // A fork whose source here holds other rows than it shared gets blocks of its own.
  std::string fork_bytes;
  ASSERT_TRUE(ca.Export("t1/f", &fork_bytes).ok());
  ASSERT_TRUE(cb.Release("t1").ok());
  ASSERT_TRUE(cb.Release("t1/f").ok());
  ASSERT_TRUE(cb.Create("t1", v1::FLOAT32, 0).ok());
  cb.Append("t1", 150, 12345);
  {
    v1::SequenceInfo info;
    const grpc::Status imported = cb.Import(fork_bytes, "", &info);
    ASSERT_TRUE(imported.ok()) << imported.error_message();
    EXPECT_EQ(info.shared_blocks(), 0);
    EXPECT_EQ(NextStep(cb, "t1/f", 7), next.at("t1/f"));
  }

  std::string bytes;
  ASSERT_TRUE(ca.Export("t2", &bytes).ok());
  v1::SequenceInfo info;
  const auto expect = [&](const grpc::Status& status, grpc::StatusCode code,
                          const std::string& fragment) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_NE(status.error_message().find(fragment), std::string::npos) << status.error_message();
  };
  std::string flipped = bytes;
  flipped[bytes.size() / 2] = static_cast<char>(flipped[bytes.size() / 2] ^ 1);
  // The reader names its source: "snapshot (import stream): ..." (it read "snapshot the import
  // stream: ...").
  expect(cb.Import(flipped, "x1", &info), grpc::StatusCode::DATA_LOSS,
         "snapshot (import stream): ");
  expect(cb.Import(bytes.substr(0, bytes.size() - 7), "x2", &info), grpc::StatusCode::DATA_LOSS,
         "snapshot (import stream): truncated");
  expect(cb.Import("", "x3", &info), grpc::StatusCode::INVALID_ARGUMENT, "no snapshot bytes");
  expect(cb.Import(std::string(100, 'z'), "x4", &info), grpc::StatusCode::INVALID_ARGUMENT,
         "not an attend snapshot");
  expect(cb.Import(bytes, "x/5", &info, 4096, "other"), grpc::StatusCode::INVALID_ARGUMENT,
         "x-attend-sequence-key");
  expect(cb.Import(bytes, "bad id!", &info), grpc::StatusCode::INVALID_ARGUMENT, "sequence_id");
  {  // share_with_source in a later message is refused like a later sequence_id
    grpc::ClientContext context;
    auto writer =
        v1::KvCache::NewStub(::attend::testing::ChannelTo(**b))->ImportSequence(&context, &info);
    v1::ImportSequenceRequest first, later;
    first.set_sequence_id("x7");
    first.set_data(bytes.substr(0, 100));
    later.set_share_with_source(false);
    later.set_data(bytes.substr(100));
    writer->Write(first);
    writer->Write(later);
    writer->WritesDone();
    expect(writer->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
           "share_with_source: give it in the first message only");
  }
  // More than the whole cache could hold is refused while it arrives.
  const std::string head = bytes.substr(0, bytes.size() / 2);  // a snapshot's start
  expect(cb.Import(head + std::string((size_t{66} << 20), 'a'), "x6", &info, 512 << 10),
         grpc::StatusCode::RESOURCE_EXHAUSTED, "longer than");
  for (const std::string id : {"x1", "x2", "x3", "x4", "x/5", "x6", "x7"}) {
    EXPECT_EQ(cb.List().count(id), 0u) << id;
  }
  const std::string metrics = ::attend::testing::ScrapeMetrics((*b)->metrics_port());
  EXPECT_NE(metrics.find("attend_snapshot_checksum_failures_total 2"), std::string::npos)
      << metrics;
  expect(ca.Export("nobody", &bytes), grpc::StatusCode::NOT_FOUND, "nobody");
  expect(ca.Export("", &bytes), grpc::StatusCode::INVALID_ARGUMENT, "sequence_id");
  for (const int64_t chunk_bytes : {int64_t{-1}, int64_t{4095}, (int64_t{1} << 20) + 1}) {
    expect(ca.Export("t2", &bytes, nullptr, chunk_bytes), grpc::StatusCode::INVALID_ARGUMENT,
           "chunk_bytes");
  }
}

// HandOff moves every sequence to the server its target answers for (here another server
// directly, standing in for the proxy), oldest first, forks sharing again; each one's next
// decode there is bit-identical, and nothing is left behind. Without a target it is refused;
// the drain's hand-off moves what was created after.
TEST(TransferService, HandOffMovesEverySequenceToTheReceiver) {
  server::ServerOptions receiver_options = Options(TempDir());
  receiver_options.metrics_address = "127.0.0.1:0";
  auto b = server::AttendServer::Start(receiver_options);
  ASSERT_TRUE(b.ok());
  server::ServerOptions sender_options = Options(TempDir());
  sender_options.handoff_target = absl::StrCat("127.0.0.1:", (*b)->port());
  sender_options.metrics_address = "127.0.0.1:0";
  auto a = server::AttendServer::Start(sender_options);
  ASSERT_TRUE(a.ok());
  EXPECT_NE((*a)->instance(), (*b)->instance());
  Client ca(**a), cb(**b);
  std::mt19937_64 rng(9);
  std::map<std::string, std::string> next;
  for (int i = 0; i < 6; ++i) {
    const std::string id = absl::StrCat("k", i, "/s");
    ASSERT_TRUE(ca.Create(id, i % 2 ? v1::BFLOAT16 : v1::INT8, 0).ok());
    ca.Append(id, 130 + static_cast<int64_t>(rng() % 80), rng());  // whole blocks
  }
  // 1.5 MiB of f32 rows: more than one message the receiver (--max_message_bytes 1MiB) takes.
  ASSERT_TRUE(ca.Create("big/s", v1::FLOAT32, 0).ok());
  for (int i = 0; i < 4; ++i) ca.Append("big/s", 768, rng());
  ASSERT_TRUE(ca.Fork("k3/s", "k3/a-fork").ok());  // sorts before its source by id
  for (const auto& [id, info] : ca.List()) next[id] = NextStep(ca, id, 5);
  v1::HandOffResponse response;
  const grpc::Status handed = ca.HandOff(&response);
  ASSERT_TRUE(handed.ok()) << handed.error_message();
  EXPECT_EQ(response.moved(), 8);
  EXPECT_EQ(response.kept(), 0);
  EXPECT_EQ(response.failed_size(), 0) << response.failed(0).error();
  EXPECT_GT(response.bytes(), 0);
  EXPECT_TRUE(ca.List().empty());
  const std::map<std::string, v1::SequenceInfo> moved = cb.List();
  ASSERT_EQ(moved.size(), next.size());
  EXPECT_GT(moved.at("k3/a-fork").shared_blocks(), 0) << "the fork shares its source again";
  for (const auto& [id, want] : next) EXPECT_EQ(NextStep(cb, id, 5), want) << id;
  const std::string sent = ::attend::testing::ScrapeMetrics((*a)->metrics_port());
  EXPECT_NE(sent.find("attend_sequences_moved_total{direction=\"out\"} 8"), std::string::npos);
  const std::string got = ::attend::testing::ScrapeMetrics((*b)->metrics_port());
  EXPECT_NE(got.find("attend_sequences_moved_total{direction=\"in\"} 8"), std::string::npos);

  // A sequence whose id is taken on the receiver stays, named, and serves as before.
  ASSERT_TRUE(ca.Create("k0/s", v1::FLOAT32, 0).ok());
  ca.Append("k0/s", 10, 3);
  ASSERT_TRUE(ca.HandOff(&response).ok());
  EXPECT_EQ(response.moved(), 0);
  ASSERT_EQ(response.failed_size(), 1);
  EXPECT_EQ(response.failed(0).sequence_id(), "k0/s");
  EXPECT_NE(response.failed(0).error().find("already"), std::string::npos)
      << response.failed(0).error();
  ca.Append("k0/s", 1, 4);  // not sealed any more

  // The drain hands off what is left and can move.
  ASSERT_TRUE(ca.Create("late/s", v1::BFLOAT16, 0).ok());
  ca.Append("late/s", 9, 2);
  const std::string late = NextStep(ca, "late/s", 5);
  (*a)->Shutdown(absl::Seconds(5));
  ASSERT_TRUE((*a)->handed_off().has_value());
  ASSERT_TRUE((*a)->handed_off()->ok());
  EXPECT_EQ((**(*a)->handed_off()).moved, 1);
  EXPECT_EQ(NextStep(cb, "late/s", 5), late);

  // A server without a target refuses HandOff.
  EXPECT_EQ(cb.HandOff(&response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// Forks made while a hand-off runs (after it listed the sequences, before it sealed their
// source) move too, in a later round: none is left behind where its key no longer routes, and
// every sequence that existed is counted in the answer.
TEST(TransferService, ForksMadeDuringAHandOffMoveToo) {
  auto b = server::AttendServer::Start(Options(TempDir()));
  ASSERT_TRUE(b.ok());
  server::ServerOptions sender_options = Options(TempDir());
  sender_options.handoff_target = absl::StrCat("127.0.0.1:", (*b)->port());
  auto a = server::AttendServer::Start(sender_options);
  ASSERT_TRUE(a.ok());
  Client ca(**a), cb(**b);
  // Older and bigger sequences first, so that the pass takes a while before the source's turn.
  for (int i = 0; i < 6; ++i) {
    const std::string id = absl::StrCat("big", i, "/s");
    ASSERT_TRUE(ca.Create(id, v1::FLOAT32, 0).ok());
    for (int j = 0; j < 4; ++j) ca.Append(id, 768, i * 4 + j);
  }
  ASSERT_TRUE(ca.Create("src/s", v1::BFLOAT16, 0).ok());
  ca.Append("src/s", 50, 1);
  std::atomic<bool> stop{false};
  std::atomic<int> forks{0};
  std::thread forker([&] {
    Client c(**a);
    while (!stop.load()) {
      if (c.Fork("src/s", absl::StrCat("src/f", forks.load())).ok()) ++forks;
    }
  });
  while (forks.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  v1::HandOffResponse response;
  const grpc::Status handed = ca.HandOff(&response);
  stop = true;
  forker.join();
  ASSERT_TRUE(handed.ok()) << handed.error_message();
  EXPECT_EQ(response.failed_size(), 0) << response.failed(0).error();
  EXPECT_TRUE(ca.List().empty()) << ca.List().begin()->first << " was left behind";
  EXPECT_EQ(response.moved(), 7 + forks.load());
  EXPECT_EQ(cb.List().size(), static_cast<size_t>(7 + forks.load()));
}

// The drain's hand-off has --snapshot_grace whether or not the server keeps snapshots: a replica
// without a directory once handed nothing off on SIGTERM ("ran out of time") and dropped all.
TEST(TransferService, TheDrainHandsOffWithoutASnapshotDirectory) {
  auto b = server::AttendServer::Start(Options(TempDir()));
  ASSERT_TRUE(b.ok());
  server::ServerOptions sender_options = Options("");
  sender_options.handoff_target = absl::StrCat("127.0.0.1:", (*b)->port());
  auto a = server::AttendServer::Start(sender_options);
  ASSERT_TRUE(a.ok());
  Client ca(**a), cb(**b);
  std::map<std::string, std::string> next;
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("d", i, "/s");
    ASSERT_TRUE(ca.Create(id, v1::BFLOAT16, 0).ok());
    ca.Append(id, 40 + i, i);
    next[id] = NextStep(ca, id, 3);
  }
  (*a)->Shutdown(absl::Seconds(5));
  ASSERT_TRUE((*a)->handed_off().has_value());
  ASSERT_TRUE((*a)->handed_off()->ok()) << (*a)->handed_off()->status();
  EXPECT_EQ((**(*a)->handed_off()).moved, 3);
  for (const auto& [id, want] : next) EXPECT_EQ(NextStep(cb, id, 3), want) << id;
}

// Snapshot bytes held by imports in flight are bounded by the cache's capacity across calls, not
// per call only: two 40 MiB streams held open at once on a 64 MiB cache cannot both be taken in,
// and a refused one says why. What a call held is given back when it ends, so the next import of
// 60 MiB is read in full (and refused only for what it is). A stream that is no snapshot is
// refused at its start.
TEST(TransferService, ImportsInFlightShareOneMemoryBound) {
  auto b = server::AttendServer::Start(Options(TempDir()));
  ASSERT_TRUE(b.ok());
  Client cb(**b);
  // A real snapshot's start, so that the streams look like snapshots until they end; the rest
  // is filler, refused (DATA_LOSS) only once it has all arrived.
  ASSERT_TRUE(cb.Create("real", v1::FLOAT32, 0).ok());
  cb.Append("real", 5, 1);
  std::string snapshot;
  ASSERT_TRUE(cb.Export("real", &snapshot).ok());
  const std::string start = snapshot.substr(0, snapshot.size() / 2);
  auto stub = v1::KvCache::NewStub(::attend::testing::ChannelTo(**b));
  constexpr size_t kPiece = size_t{512} << 10;  // half the server's message limit
  std::atomic<int> written{0};
  const auto hold_open = [&](const std::string& id, const std::string& head, size_t bytes,
                             grpc::Status* status) {
    grpc::ClientContext context;
    v1::SequenceInfo info;
    auto writer = stub->ImportSequence(&context, &info);
    for (size_t at = 0; at < bytes; at += kPiece) {
      v1::ImportSequenceRequest request;
      if (at == 0) request.set_sequence_id(id);
      request.set_data(at == 0 ? head + std::string(kPiece - head.size(), 'z')
                               : std::string(kPiece, 'z'));
      if (!writer->Write(request)) break;
    }
    // Neither stream ends before both have sent everything (or been refused).
    ++written;
    while (written.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    writer->WritesDone();
    *status = writer->Finish();
  };
  grpc::Status first, second;
  std::thread a(hold_open, "one", start, size_t{40} << 20, &first);
  std::thread c(hold_open, "two", start, size_t{40} << 20, &second);
  a.join();
  c.join();
  int busy = 0;
  for (const grpc::Status& status : {first, second}) {
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++busy;
      EXPECT_NE(status.error_message().find("exports and imports in flight hold"),
                std::string::npos)
          << status.error_message();
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();
    }
  }
  EXPECT_GE(busy, 1) << "80 MiB were held at once against a 65 MiB bound";
  written = 1;  // the next call runs alone
  grpc::Status third;
  hold_open("three", start, size_t{60} << 20, &third);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::DATA_LOSS) << third.error_message();

  // Bytes that are no snapshot are refused once their first 16 bytes are in, however long the
  // sender keeps the stream open: they hold nothing meanwhile.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::SequenceInfo info;
  auto writer = stub->ImportSequence(&context, &info);
  v1::ImportSequenceRequest request;
  request.set_sequence_id("garbage");
  request.set_data(std::string(kPiece, 'z'));
  writer->Write(request);
  const auto sent = std::chrono::steady_clock::now();
  while (writer->Write(request) &&
         std::chrono::steady_clock::now() - sent < std::chrono::seconds(20)) {
  }
  const grpc::Status refused = writer->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(20))
      << "refused only when the stream ended";
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("not an attend snapshot"), std::string::npos)
      << refused.error_message();
  // A newer format is refused as early, by its version.
  std::string future = snapshot.substr(0, 16);
  future[8] = 9;
  v1::SequenceInfo ignored;
  const grpc::Status newer = cb.Import(future + std::string(100, 'z'), "future", &ignored);
  EXPECT_EQ(newer.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << newer.error_message();
  EXPECT_TRUE(cb.List().count("real") == 1 && cb.List().size() == 1u);
}

// Transfer streams that go quiet are let go after --transfer_idle_timeout, with a status that
// says why, and what they held is given back: an import whose sender stops sending (a real
// snapshot's start, then nothing, never closed), and an export whose reader stops reading.
TEST(TransferService, QuietStreamsAreEndedAndGiveTheirBytesBack) {
  server::ServerOptions options = Options(TempDir());
  options.transfer_idle_timeout = absl::Milliseconds(400);
  auto b = server::AttendServer::Start(options);
  ASSERT_TRUE(b.ok());
  Client cb(**b);
  ASSERT_TRUE(cb.Create("big", v1::FLOAT32, 0).ok());
  for (int i = 0; i < 4; ++i) cb.Append("big", 768, i, /*with_q=*/false);  // 1.5 MiB
  std::string snapshot;
  ASSERT_TRUE(cb.Export("big", &snapshot).ok());
  auto stub = v1::KvCache::NewStub(::attend::testing::ChannelTo(**b));

  // The import: 60 MiB of a 65 MiB budget, then silence.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SequenceInfo info;
    auto writer = stub->ImportSequence(&context, &info);
    v1::ImportSequenceRequest request;
    request.set_sequence_id("stalled");
    request.set_data(snapshot.substr(0, 1 << 10) + std::string((512 << 10) - (1 << 10), 'z'));
    ASSERT_TRUE(writer->Write(request));
    request.clear_sequence_id();
    request.set_data(std::string(512 << 10, 'z'));
    for (int i = 1; i < 120; ++i) ASSERT_TRUE(writer->Write(request));
    const auto quiet = std::chrono::steady_clock::now();
    const grpc::Status ended = writer->Finish();  // no WritesDone: the server ends it
    EXPECT_LT(std::chrono::steady_clock::now() - quiet, std::chrono::seconds(5));
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << ended.error_message();
    EXPECT_NE(ended.error_message().find("sent nothing for 400ms"), std::string::npos)
        << ended.error_message();
  }
  v1::SequenceInfo info;
  const grpc::Status imported = cb.Import(snapshot, "copy", &info, 512 << 10);
  ASSERT_TRUE(imported.ok()) << imported.error_message() << " (the stalled import's bytes?)";

  // The export: chunks of 4 KiB, one read, then none for a while; 24 MiB, more than the
  // connection's flow-control windows and socket buffers take in meanwhile.
  ASSERT_TRUE(cb.Create("huge", v1::FLOAT32, 0).ok());
  for (int i = 0; i < 64; ++i) cb.Append("huge", 768, 100 + i, /*with_q=*/false);
  {
    grpc::ClientContext context;
    v1::ExportSequenceRequest request;
    request.set_sequence_id("huge");
    request.set_chunk_bytes(4096);
    auto reader = stub->ExportSequence(&context, request);
    v1::SequenceChunk chunk;
    ASSERT_TRUE(reader->Read(&chunk));
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    size_t got = chunk.data().size();
    while (reader->Read(&chunk)) got += chunk.data().size();
    const grpc::Status ended = reader->Finish();
    EXPECT_LT(got, size_t{24} << 20);
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << ended.error_message();
    EXPECT_NE(ended.error_message().find("was not read for 400ms"), std::string::npos)
        << ended.error_message();
  }
  // A reader that keeps up is not let go, however long the whole takes.
  std::string again;
  ASSERT_TRUE(cb.Export("big", &again, nullptr, 4096).ok());
  EXPECT_EQ(again, snapshot);
  EXPECT_EQ(cb.List().count("stalled"), 0u);
}

}  // namespace
}  // namespace attend
