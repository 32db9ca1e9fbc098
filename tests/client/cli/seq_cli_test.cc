// `attend seq <subcommand>` against a real server with a small KV cache: each subcommand's
// tables, --json read back (into the API's messages, or google.protobuf.Struct for the CLI's
// own objects), .npy round trips checked against the reference attention, help, and the exit
// codes of usage, local-file, server and connection errors; save / load, export / import
// through files, and hand-off between two servers.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attend/v1/kv_cache.pb.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "client/cli/render/format.h"
#include "client/kv_cache_client.h"
#include "client/npy.h"
#include "core/attention/testing/reference_attention.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename Message>
Message ParseJson(const std::string& json) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status << "\n" << json;
  return message;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool Exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// A new empty directory under the test's temporary directory.
std::string NewTempDir(const std::string& prefix) {
  std::string pattern = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  const char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  return pattern;
}

const google::protobuf::Value& Field(const google::protobuf::Struct& s, const std::string& name) {
  static const google::protobuf::Value* const kMissing = new google::protobuf::Value();
  const auto it = s.fields().find(name);
  EXPECT_NE(it, s.fields().end()) << "no field " << name;
  return it == s.fields().end() ? *kMissing : it->second;
}

class SeqCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ServerOptions options = ::attend::testing::SmallServerOptions();
    options.kv_cache.capacity_bytes = 1 << 20;  // 256 blocks of 4 KiB
    options.kv_cache.block_bytes = 4 << 10;
    auto started = server::AttendServer::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = started->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void TearDown() override {
    // Every test leaves the cache empty, whichever tests share the server.
    client::ConnectionOptions options;
    options.target = Target();
    const client::KvCacheClient kv(client::Connect(options), options);
    auto all = kv.ListAllSequences();
    ASSERT_OK(all);
    for (const v1::SequenceInfo& s : *all) EXPECT_OK(kv.Release(s.sequence_id()));
  }

  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", Target()});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }
  static std::string Target() { return absl::StrCat("127.0.0.1:", server_->port()); }

  // A sequence of 2 layers, 4 query heads, 2 key/value heads, head size 8, float32 storage.
  void Create(const std::string& id, int layers = 2) {
    ASSERT_EQ(Run({"seq", "create", "--id", id, "--layers", absl::StrCat(layers), "--n_head", "4",
                   "--n_head_kv", "2", "--head_dim", "8", "--kv_dtype", "f32"}),
              cli::kExitOk)
        << err_.str();
  }

  inline static server::AttendServer* server_ = nullptr;
  std::ostringstream out_, err_;
};

TEST_F(SeqCliTest, CreatePrintsTheShapeAndJsonReadsBack) {
  Create("c-table", 3);
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("created sequence 'c-table'"));
  EXPECT_THAT(out, HasSubstr("3 layers, 4 query heads, 2 key/value heads (grouped-query), "
                             "head_dim 8"));
  EXPECT_THAT(out, HasSubstr("float32 keys and values, 32 tokens of a layer per block"));
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*0-2\s+0\n)"))) << out;

  ASSERT_EQ(Run({"--json", "seq", "create", "--id", "c-json", "--layers", "1", "--n_head", "8",
                 "--head_dim", "16", "--head_dim_v", "4", "--window", "64", "--reserve", "40"}),
            cli::kExitOk)
      << err_.str();
  const auto info = ParseJson<v1::SequenceInfo>(out_.str());
  EXPECT_EQ(info.sequence_id(), "c-json");
  EXPECT_EQ(info.config().n_head(), 8);
  EXPECT_EQ(info.config().n_head_kv(), 8);  // defaults to n_head
  EXPECT_EQ(info.config().head_dim_v(), 4);
  EXPECT_EQ(info.config().kv_dtype(), v1::BFLOAT16);  // the default storage
  EXPECT_EQ(info.config().window_tokens(), 64);
  EXPECT_EQ(info.reserved_tokens(), 40);
  EXPECT_GT(info.blocks(), 0);

  // int8 storage: shown in the table, sent as INT8.
  ASSERT_EQ(Run({"seq", "create", "--id", "c-int8", "--head_dim", "16", "--kv_dtype", "int8"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("int8 (per-token, per-head scales) keys and values"));
  ASSERT_EQ(Run({"--json", "seq", "get", "--id", "c-int8"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(ParseJson<v1::SequenceInfo>(out_.str()).config().kv_dtype(), v1::INT8);

  // A generated id, then errors: an id in use, a bad shape.
  ASSERT_EQ(Run({"--json", "seq", "create"}), cli::kExitOk) << err_.str();
  EXPECT_FALSE(ParseJson<v1::SequenceInfo>(out_.str()).sequence_id().empty());
  EXPECT_EQ(Run({"seq", "create", "--id", "c-table"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: ALREADY_EXISTS: sequence 'c-table' already exists"));
  EXPECT_EQ(Run({"seq", "create", "--id", "c-bad", "--n_head", "4", "--n_head_kv", "3"}),
            cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT"));
}

TEST_F(SeqCliTest, AppendRandomTokensTablesWeightsAndJson) {
  Create("a-rand");
  ASSERT_EQ(Run({"seq", "append", "--id", "a-rand", "--layer", "0", "--n", "3", "--weights"}),
            cli::kExitOk)
      << err_.str();
  std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("appended 3 tokens to layer 0 of 'a-rand' at positions 0-2; the "
                             "layer holds 3 tokens"));
  EXPECT_THAT(out, HasSubstr("output [3, 4, 8] = [n_new, n_head, head_dim_v]"));
  EXPECT_THAT(out, HasSubstr("weights, head 3"));
  // Causal: the first new token sees only itself.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*0\s+1\.000\s+0\.000\s+0\.000\n)"))) << out;
  EXPECT_THAT(out, HasSubstr("24 attended pairs"));  // 4 heads x (1 + 2 + 3) causal pairs

  ASSERT_EQ(Run({"seq", "append", "--id", "a-rand", "--layer", "1", "--n", "3", "--no_q"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("appended 3 tokens (keys and values only) to layer 1"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("output")));

  ASSERT_EQ(Run({"--json", "seq", "append", "--id", "a-rand", "--n", "1", "--seed", "7"}),
            cli::kExitOk)
      << err_.str();
  const auto json = ParseJson<google::protobuf::Struct>(out_.str());
  EXPECT_EQ(Field(json, "first_position").number_value(), 3);
  EXPECT_EQ(Field(json, "layer_tokens").number_value(), 4);
  const auto& output = Field(json, "output").struct_value();
  ASSERT_EQ(Field(output, "shape").list_value().values_size(), 3);
  EXPECT_EQ(Field(output, "values").list_value().values_size(), 4 * 8);
  EXPECT_EQ(Field(Field(json, "stats").struct_value(), "attended_pairs").number_value(), 16);

  // The first token of a fresh sequence attends only to itself: each query head's output is its
  // key/value head's value vector, so heads 0 and 1 (group 0) agree, as do 2 and 3 (group 1).
  Create("a-first");
  ASSERT_EQ(Run({"--json", "seq", "append", "--id", "a-first", "--n", "1"}), cli::kExitOk);
  const auto first = ParseJson<google::protobuf::Struct>(out_.str());
  EXPECT_EQ(Field(first, "first_position").number_value(), 0);
  const auto& values = Field(Field(first, "output").struct_value(), "values").list_value();
  ASSERT_EQ(values.values_size(), 4 * 8);
  const auto head = [&](int h, int j) { return values.values(h * 8 + j).number_value(); };
  bool groups_differ = false;
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(head(0, j), head(1, j)) << j;
    EXPECT_EQ(head(2, j), head(3, j)) << j;
    groups_differ = groups_differ || head(0, j) != head(2, j);
  }
  EXPECT_TRUE(groups_differ);
}

TEST_F(SeqCliTest, AppendNpyRoundTripMatchesTheReference) {
  Create("a-npy", 1);
  std::mt19937_64 rng(3);
  const int64_t n = 5;
  const client::FloatTensor q{{n, 4, 8}, ::attend::testing::RandomFloats(rng, n * 4 * 8)};
  const client::FloatTensor k{{n, 2, 8}, ::attend::testing::RandomFloats(rng, n * 2 * 8)};
  const client::FloatTensor v{{n, 2, 8}, ::attend::testing::RandomFloats(rng, n * 2 * 8)};
  const std::string dir = ::testing::TempDir();
  const std::string qf = dir + "/seq_q.npy", kf = dir + "/seq_k.npy", vf = dir + "/seq_v.npy",
                    of = dir + "/seq_o.npy";
  ASSERT_OK(client::WriteNpyFile(qf, q));
  ASSERT_OK(client::WriteNpyFile(kf, k));
  ASSERT_OK(client::WriteNpyFile(vf, v));
  ASSERT_EQ(Run({"seq", "append", "--id", "a-npy", "--q", qf, "--k", kf, "--v", vf, "--out", of}),
            cli::kExitOk)
      << err_.str();
  auto output = client::ReadNpyFile(of);
  ASSERT_OK(output);
  EXPECT_EQ(output->shape, (std::vector<int64_t>{n, 4, 8}));
  AttentionOptions options;
  options.mask.causal = true;
  auto want = ReferenceAttention({DType::kFloat32, {n, 4, 8}, q.values.data()},
                                 {DType::kFloat32, {n, 2, 8}, k.values.data()},
                                 {DType::kFloat32, {n, 2, 8}, v.values.data()}, options);
  ASSERT_OK(want);
  ASSERT_EQ(output->values.size(), want->output.size());
  for (size_t i = 0; i < want->output.size(); ++i) {
    ASSERT_NEAR(output->values[i], want->output[i], 2e-5) << i;
  }

  // Keys and values only (no --q): cached, nothing to write.
  ASSERT_EQ(Run({"seq", "append", "--id", "a-npy", "--k", kf, "--v", vf}), cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("(keys and values only)"));
  EXPECT_THAT(out_.str(), HasSubstr("the layer holds 10 tokens"));
  EXPECT_EQ(Run({"seq", "append", "--id", "a-npy", "--k", kf, "--v", vf, "--out", of}),
            cli::kExitUsage);

  // Local file errors exit 1; a shape the sequence does not have is the server's error.
  EXPECT_EQ(Run({"seq", "append", "--id", "a-npy", "--k", "/nonexistent/k.npy", "--v", vf}),
            cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("/nonexistent/k.npy"));
  EXPECT_EQ(Run({"seq", "append", "--id", "a-npy", "--q", qf, "--k", kf, "--v", vf, "--out",
                 "/nonexistent/dir/o.npy"}),
            cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("the tokens were appended"));
  EXPECT_EQ(Run({"seq", "append", "--id", "a-npy", "--q", qf, "--k", kf, "--v", vf, "--out",
                 "/dev/full"}),
            cli::kExitLocalError);
  EXPECT_EQ(err_.str(),
            "error: cannot write '/dev/full': No space left on device (the tokens were appended: "
            "the sequence holds them)\n");
  EXPECT_EQ(Run({"seq", "append", "--id", "a-npy", "--k", qf, "--v", vf}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT: k.shape"));
}

TEST_F(SeqCliTest, DecodeBatchAndStreamAgreeAndReportEachStep) {
  for (const char* id : {"d-batch", "d-stream"}) {
    Create(id);
    for (const char* layer : {"0", "1"}) {
      ASSERT_EQ(Run({"seq", "append", "--id", id, "--layer", layer, "--n", "4"}), cli::kExitOk)
          << err_.str();
    }
  }
  ASSERT_EQ(Run({"seq", "decode", "--id", "d-batch", "--steps", "3"}), cli::kExitOk) << err_.str();
  const std::string table = out_.str();
  EXPECT_THAT(table, HasSubstr("decoding 3 steps of 2 layers for 'd-batch' with DecodeBatch"));
  EXPECT_TRUE(
      std::regex_search(table, std::regex(R"(\nstep\s+sequence\s+tokens\s+latency\s+out\[0\])")))
      << table;
  for (const char* row : {R"(\n\s*0\s+d-batch\s+5\s)", R"(\n\s*2\s+d-batch\s+7\s)"}) {
    EXPECT_TRUE(std::regex_search(table, std::regex(row))) << row << " in\n" << table;
  }
  EXPECT_THAT(table, HasSubstr("3 steps, 6 calls"));

  // The same seed through DecodeBatch and DecodeStream on twin sequences: the same outputs.
  for (const char* id : {"d-twin-batch", "d-twin-stream"}) {
    Create(id);
    for (const char* layer : {"0", "1"}) {
      ASSERT_EQ(Run({"seq", "append", "--id", id, "--layer", layer, "--n", "4"}), cli::kExitOk);
    }
  }
  std::vector<google::protobuf::Struct> runs;
  for (auto [id, stream] : {std::pair{"d-twin-batch", false}, std::pair{"d-twin-stream", true}}) {
    std::vector<std::string> args = {"--json",  "seq", "decode", "--id", id,
                                     "--steps", "2",   "--seed", "9"};
    if (stream) args.push_back("--stream");
    ASSERT_EQ(Run(args), cli::kExitOk) << err_.str();
    runs.push_back(ParseJson<google::protobuf::Struct>(out_.str()));
  }
  EXPECT_EQ(Field(runs[0], "mode").string_value(), "batch");
  EXPECT_EQ(Field(runs[1], "mode").string_value(), "stream");
  for (const auto& run : runs) {
    EXPECT_EQ(Field(run, "calls").number_value(), 4);
    EXPECT_EQ(Field(run, "layers").list_value().values_size(), 2);
  }
  const auto& batch_steps = Field(runs[0], "steps").list_value();
  const auto& stream_steps = Field(runs[1], "steps").list_value();
  ASSERT_EQ(batch_steps.values_size(), 2);
  ASSERT_EQ(stream_steps.values_size(), 2);
  for (int s = 0; s < 2; ++s) {
    const auto& b = Field(batch_steps.values(s).struct_value(), "results").list_value().values(0);
    const auto& t = Field(stream_steps.values(s).struct_value(), "results").list_value().values(0);
    EXPECT_EQ(Field(b.struct_value(), "layer_tokens").number_value(), 5 + s);
    EXPECT_EQ(Field(t.struct_value(), "layer_tokens").number_value(), 5 + s);
    const auto& bv = Field(b.struct_value(), "output_first").list_value();
    const auto& tv = Field(t.struct_value(), "output_first").list_value();
    ASSERT_EQ(bv.values_size(), 4);
    ASSERT_EQ(tv.values_size(), 4);
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(bv.values(j).number_value(), tv.values(j).number_value(), 1e-6);
    }
    EXPECT_GT(Field(batch_steps.values(s).struct_value(), "latency_seconds").number_value(), 0);
  }

  // Several sequences in one batch, over a stream, as a table.
  ASSERT_EQ(Run({"seq", "decode", "--ids", "d-batch,d-stream", "--stream", "--steps", "2"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("over one DecodeStream"));
  EXPECT_THAT(out_.str(), HasSubstr("2 steps, 4 messages"));
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*1\s+d-stream\s+\d+\s)")));
}

TEST_F(SeqCliTest, DecodeErrors) {
  Create("d-err");
  EXPECT_EQ(Run({"seq", "decode", "--id", "nobody"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND: no sequence 'nobody'"));
  for (const char* mode : {"", "--stream"}) {
    std::vector<std::string> args = {"seq", "decode", "--id", "d-err", "--layer", "5"};
    if (*mode) args.push_back(mode);
    EXPECT_EQ(Run(args), cli::kExitServerError) << mode;
    EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT: step 0, layer 5: ")) << mode;
    EXPECT_THAT(err_.str(), HasSubstr("layer 5 is out of range")) << mode;
  }
  EXPECT_EQ(Run({"seq", "decode", "--id", "d-err", "--ids", "d-err"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "decode"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "decode", "--ids", "d-err,d-err"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("appears twice"));
  EXPECT_EQ(Run({"seq", "decode", "--id", "d-err", "--steps", "0"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "decode", "--id", "d-err", "--wire", "int4"}), cli::kExitUsage);
  // Nothing was appended by the failed runs.
  ASSERT_EQ(Run({"--json", "seq", "get", "--id", "d-err"}), cli::kExitOk);
  EXPECT_EQ(ParseJson<v1::SequenceInfo>(out_.str()).tokens(), 0);
}

TEST_F(SeqCliTest, ForkTruncateGetReleaseLifecycle) {
  Create("f-src");
  ASSERT_EQ(Run({"seq", "append", "--id", "f-src", "--layer", "0", "--n", "40"}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "append", "--id", "f-src", "--layer", "1", "--n", "36"}), cli::kExitOk);

  ASSERT_EQ(Run({"seq", "get", "--id", "f-src"}), cli::kExitOk) << err_.str();
  std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("sequence 'f-src'"));
  EXPECT_THAT(out, HasSubstr("36 in every layer"));
  EXPECT_THAT(out, HasSubstr("tokens per layer:"));
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*0\s+40\n\s*1\s+36\n)"))) << out;
  // 40 and 36 tokens at 32 per block: 2 blocks in each layer, 4 KiB each.
  EXPECT_THAT(out, HasSubstr("blocks     4, 0 shared copy-on-write"));
  EXPECT_THAT(out, HasSubstr("16.00 KiB (16,384 bytes)"));

  ASSERT_EQ(Run({"seq", "fork", "--id", "f-src", "--new_id", "f-child", "--tokens", "20"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("forked 'f-src' at 20 tokens into 'f-child': 2 of its 2 "
                                    "blocks are shared"));
  EXPECT_THAT(out_.str(), HasSubstr("forked from  'f-src'"));
  ASSERT_EQ(Run({"--json", "seq", "fork", "--id", "f-src"}), cli::kExitOk) << err_.str();
  const auto whole = ParseJson<v1::SequenceInfo>(out_.str());
  EXPECT_EQ(whole.forked_from(), "f-src");
  EXPECT_EQ(whole.tokens(), 36);
  EXPECT_EQ(Run({"seq", "fork", "--id", "f-src", "--tokens", "41"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("OUT_OF_RANGE"));

  ASSERT_EQ(Run({"--json", "seq", "get", "--id", "f-src"}), cli::kExitOk);
  EXPECT_EQ(ParseJson<v1::SequenceInfo>(out_.str()).shared_blocks(), 4);

  EXPECT_EQ(Run({"seq", "truncate", "--id", "f-src", "--tokens", "37"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("OUT_OF_RANGE: truncate to 37 tokens"));
  ASSERT_EQ(Run({"seq", "truncate", "--id", "f-src", "--tokens", "10"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("truncated 'f-src' to 10 tokens"));
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*0-1\s+10\n)"))) << out_.str();
  EXPECT_EQ(Run({"seq", "truncate", "--id", "f-src"}), cli::kExitUsage);

  // Releasing the child frees nothing (its blocks are shared); the rest frees everything.
  ASSERT_EQ(Run({"--json", "seq", "release", "--id", "f-child"}), cli::kExitOk);
  auto released = ParseJson<google::protobuf::Struct>(out_.str());
  EXPECT_EQ(Field(released, "sequence_id").string_value(), "f-child");
  EXPECT_EQ(Field(released, "freed_bytes").number_value(), 0);
  ASSERT_EQ(Run({"seq", "release", "--id", whole.sequence_id()}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "release", "--id", "f-src"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("released 'f-src': 8.00 KiB returned"));
  EXPECT_EQ(Run({"seq", "get", "--id", "f-src"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Run({"seq", "release", "--id", "f-src"}), cli::kExitServerError);
}

TEST_F(SeqCliTest, ListFollowsPagesUnlessOneIsAskedFor) {
  for (const char* id : {"l-1", "l-2", "l-3"}) Create(id, 1);
  ASSERT_EQ(Run({"seq", "append", "--id", "l-2", "--n", "33"}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "list", "--page_size", "1"}), cli::kExitOk) << err_.str();
  std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("id   layers  heads  dims  kv   tokens  blocks  shared"));
  for (const char* row :
       {R"(\nl-1\s+1\s+4/2\s+8\s+f32\s+0\s+0\s+0\s+0 bytes\s+-)",
        R"(\nl-2\s+1\s+4/2\s+8\s+f32\s+33\s+2\s+0\s+8\.00 KiB\s+-)", R"(\nl-3\s)"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(row))) << row << " in\n" << out;
  }
  EXPECT_THAT(out, HasSubstr("3 sequences, 8.00 KiB referenced"));
  EXPECT_THAT(out, Not(HasSubstr("next page")));

  ASSERT_EQ(Run({"seq", "list", "--page_size", "1", "--page_token", "l-1"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("l-2"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("l-3")));
  EXPECT_THAT(out_.str(), HasSubstr("next page: --page_token l-2"));

  ASSERT_EQ(Run({"--json", "seq", "list", "--page_size", "2"}), cli::kExitOk);
  const auto listed = ParseJson<v1::ListSequencesResponse>(out_.str());
  ASSERT_EQ(listed.sequences_size(), 3);
  EXPECT_EQ(listed.sequences(1).sequence_id(), "l-2");
  EXPECT_EQ(listed.sequences(1).tokens(), 33);
  EXPECT_TRUE(listed.next_page_token().empty());
  EXPECT_EQ(Run({"seq", "list", "--page_size", "1001"}), cli::kExitUsage);
  for (const char* id : {"l-1", "l-2", "l-3"}) ASSERT_EQ(Run({"seq", "release", "--id", id}), 0);
  ASSERT_EQ(Run({"seq", "list", "--page_token", "l-3"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), "no sequences\n");
}

TEST_F(SeqCliTest, StatsTableAndJsonAgreeWithTheClient) {
  Create("s-1", 1);
  ASSERT_EQ(Run({"seq", "append", "--id", "s-1", "--n", "70"}), cli::kExitOk);  // 3 blocks
  client::ConnectionOptions options;
  options.target = Target();
  const client::KvCacheClient kv(client::Connect(options), options);
  auto stats = kv.Stats();
  ASSERT_OK(stats);

  ASSERT_EQ(Run({"seq", "stats"}), cli::kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("KV cache of " + Target()));
  EXPECT_THAT(out, HasSubstr("capacity   1.00 MiB (1,048,576 bytes) in 256 blocks of 4.00 KiB"));
  const std::string used =
      absl::StrCat("used       ", stats->used_bytes() / 1024, ".00 KiB (",
                   absl::StrFormat("%.1f%%", 100.0 * stats->used_bytes() / (1 << 20)),
                   "): ", stats->blocks_used(), " blocks used, ", stats->blocks_free(), " free");
  EXPECT_THAT(out, HasSubstr(used));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("sequences  ", stats->sequences(), "\n")));
  EXPECT_THAT(out, HasSubstr("eviction   none; 0 evictions"));

  ASSERT_EQ(Run({"--json", "seq", "stats"}), cli::kExitOk);
  const auto json = ParseJson<v1::CacheStats>(out_.str());
  EXPECT_EQ(json.capacity_bytes(), 1 << 20);
  EXPECT_EQ(json.block_bytes(), 4 << 10);
  EXPECT_EQ(json.used_bytes(), stats->used_bytes());
  EXPECT_GE(json.blocks_used(), 3);
  EXPECT_EQ(json.eviction_policy(), "none");
  ASSERT_EQ(Run({"seq", "release", "--id", "s-1"}), cli::kExitOk);
}

TEST_F(SeqCliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run({"seq"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("give a subcommand: create, append, decode"));
  EXPECT_EQ(Run({"seq", "bogus"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unknown subcommand 'bogus'"));
  EXPECT_EQ(Run({"seq", "get"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend seq get' needs --id"));
  EXPECT_EQ(Run({"seq", "get", "chat-1"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("ids go in --id"));
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--layers", "3"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--layers is not a flag of 'attend seq append'"));
  EXPECT_EQ(Run({"seq", "stats", "--id", "x"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "create", "--kv_dtype", "f16"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("the cache stores f32, bf16 or int8"));
  EXPECT_EQ(Run({"seq", "create", "--layers", "0"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "create", "--n_head", "four"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--no_q", "--q", "q.npy", "--k", "k", "--v", "v"}),
            cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--no_q", "--weights"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--k", "k.npy"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--k", "k", "--v", "v", "--n", "2"}),
            cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "append", "--id", "x", "--precision", "f64"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "fork", "--id", "x", "--tokens", "-1"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "list", "--nonsense"}), cli::kExitUsage);
}

TEST_F(SeqCliTest, HelpForTheGroupAndEachSubcommand) {
  ASSERT_EQ(Run({"--help"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("  seq "));
  ASSERT_EQ(Run({"seq", "--help"}), cli::kExitOk);
  std::string out = out_.str();
  for (const char* sub :
       {"create", "append", "decode", "fork", "truncate", "release", "get", "list", "stats"}) {
    EXPECT_TRUE(std::regex_search(out, std::regex(absl::StrCat(R"(\n  )", sub, R"(\s+\w)"))))
        << sub;
    EXPECT_THAT(out, HasSubstr(absl::StrCat("attend seq ", sub)));  // in the session example
  }
  EXPECT_THAT(out, HasSubstr("--tokens=<value>         fork: tokens to share (default: all); "
                             "truncate: the new length"));
  ASSERT_EQ(Run({"seq", "decode", "--help"}), cli::kExitOk);
  out = out_.str();
  EXPECT_THAT(out, HasSubstr("usage: attend seq decode --id ID | --ids A,B,C"));
  EXPECT_THAT(out, HasSubstr("attend seq decode --ids chat-1,chat-2 --steps 8 --stream"));
  EXPECT_THAT(out, HasSubstr("--stream"));
  EXPECT_THAT(out, Not(HasSubstr("--layers")));  // create's flag is not decode's
  for (const char* sub :
       {"create", "append", "decode", "fork", "truncate", "release", "get", "list", "stats"}) {
    ASSERT_EQ(Run({"seq", sub, "--help"}), cli::kExitOk) << sub;
    EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("usage: attend seq ", sub))) << sub;
    EXPECT_THAT(out_.str(), HasSubstr("Examples:\n  attend ")) << sub;
  }
  // Help for a subcommand that does not exist is refused as running it is (it printed the
  // group's help and exited 0).
  EXPECT_EQ(Run({"seq", "bogus", "--help"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unknown subcommand 'bogus'"));
}

TEST_F(SeqCliTest, AnUnreachableServerExitsThree) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"--target", "127.0.0.1:1", "--deadline", "2", "seq", "stats"}, out, err),
            cli::kExitConnection);
  EXPECT_THAT(err.str(), HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(cli::RunCli({"--target", "127.0.0.1:1", "--deadline", "2", "seq", "get", "--id", "x"},
                        out, err),
            cli::kExitConnection);
}

// --- save, load, export, import, hand-off ------------------------------------------------------

// This server has no snapshot directory and no hand-off target: the calls that need them fail
// FAILED_PRECONDITION saying which flag is missing, as server errors (exit 4).
TEST_F(SeqCliTest, SaveLoadAndHandOffNeedTheServersDirectoryAndTarget) {
  Create("p-none");
  EXPECT_EQ(Run({"seq", "save", "--id", "p-none"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: FAILED_PRECONDITION: SaveSequence: this server has no "
                                    "snapshot directory (start it with --snapshot_dir)"));
  EXPECT_EQ(Run({"seq", "load", "--name", "p-none"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("FAILED_PRECONDITION: LoadSequence: this server has no "
                                    "snapshot directory"));
  EXPECT_EQ(Run({"seq", "hand-off"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: FAILED_PRECONDITION: HandOff: this server has no "
                                    "--handoff_target (the fleet's proxy address)"));
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(Run({"-o", "json", "seq", "hand-off"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("FAILED_PRECONDITION"));
}

TEST_F(SeqCliTest, ExportThenImportUnderANewIdKeepsTheTokens) {
  Create("x-src");
  ASSERT_EQ(Run({"seq", "append", "--id", "x-src", "--layer", "0", "--n", "40"}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "append", "--id", "x-src", "--layer", "1", "--n", "36"}), cli::kExitOk);
  const std::string dir = NewTempDir("seq-export");
  const std::string file = dir + "/x-src.attnsnap";
  // A small message limit makes several chunks (and several import messages).
  ASSERT_EQ(Run({"--max_message_bytes", "16384", "seq", "export", "--id", "x-src", "--out", file}),
            cli::kExitOk)
      << err_.str();
  const std::string bytes = ReadFile(file);
  ASSERT_GT(bytes.size(), 8192u);
  EXPECT_EQ(bytes.substr(0, 8), "ATTNSNAP");
  EXPECT_FALSE(Exists(file + ".tmp"));
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("exported 'x-src' to ", file, ": ")));
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat(cli::Count(static_cast<int64_t>(bytes.size())),
                                                 " bytes) in ")));
  EXPECT_THAT(out_.str(), HasSubstr(" chunks"));

  // JSON, and --out - (the bytes on stdout, nothing else).
  ASSERT_EQ(Run({"--json", "--max_message_bytes", "16384", "seq", "export", "--id", "x-src",
                 "--out", file}),
            cli::kExitOk)
      << err_.str();
  const auto json = ParseJson<google::protobuf::Struct>(out_.str());
  EXPECT_EQ(Field(json, "sequence_id").string_value(), "x-src");
  EXPECT_EQ(Field(json, "out").string_value(), file);
  EXPECT_EQ(Field(json, "bytes").number_value(), static_cast<double>(bytes.size()));
  EXPECT_GE(Field(json, "chunks").number_value(), 2);
  ASSERT_EQ(Run({"seq", "export", "--id", "x-src", "--out", "-"}), cli::kExitOk) << err_.str();
  // The same rows of the same moment; the header's times may differ, the size does not.
  EXPECT_EQ(out_.str().size(), bytes.size());
  EXPECT_EQ(out_.str().substr(0, 8), "ATTNSNAP");
  EXPECT_EQ(err_.str(), "");

  ASSERT_EQ(Run({"--max_message_bytes", "16384", "seq", "import", "--in", file, "--id", "x-copy"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("imported ", file, " as 'x-copy'")));
  EXPECT_THAT(out_.str(), HasSubstr("36 in every layer"));
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*0\s+40\n\s*1\s+36\n)")))
      << out_.str();
  ASSERT_EQ(Run({"--json", "seq", "get", "--id", "x-src"}), cli::kExitOk);
  const auto source = ParseJson<v1::SequenceInfo>(out_.str());
  ASSERT_EQ(Run({"--json", "seq", "get", "--id", "x-copy"}), cli::kExitOk);
  const auto copy = ParseJson<v1::SequenceInfo>(out_.str());
  EXPECT_EQ(copy.tokens(), source.tokens());
  EXPECT_EQ(std::vector<int64_t>(copy.layer_tokens().begin(), copy.layer_tokens().end()),
            (std::vector<int64_t>{40, 36}));
  EXPECT_EQ(copy.bytes(), source.bytes());
  EXPECT_EQ(copy.config().SerializeAsString(), source.config().SerializeAsString());

  // Without --id the sequence keeps the id in the file: taken while the source is here.
  EXPECT_EQ(Run({"seq", "import", "--in", file}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("ALREADY_EXISTS"));
  ASSERT_EQ(Run({"seq", "release", "--id", "x-src"}), cli::kExitOk);
  ASSERT_EQ(Run({"--json", "seq", "import", "--in", file, "--no_share"}), cli::kExitOk)
      << err_.str();
  const auto back = ParseJson<v1::SequenceInfo>(out_.str());
  EXPECT_EQ(back.sequence_id(), "x-src");
  EXPECT_EQ(back.tokens(), 36);
}

TEST_F(SeqCliTest, ImportOfATruncatedFileFailsWithDataLossAndCreatesNothing) {
  Create("t-src");
  ASSERT_EQ(Run({"seq", "append", "--id", "t-src", "--layer", "0", "--n", "20"}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "append", "--id", "t-src", "--layer", "1", "--n", "20"}), cli::kExitOk);
  const std::string dir = NewTempDir("seq-truncated");
  const std::string whole = dir + "/whole.attnsnap", cut = dir + "/cut.attnsnap";
  ASSERT_EQ(Run({"seq", "export", "--id", "t-src", "--out", whole}), cli::kExitOk) << err_.str();
  const std::string bytes = ReadFile(whole);
  ASSERT_GT(bytes.size(), 200u);
  {
    std::ofstream out(cut, std::ios::binary);
    out << bytes.substr(0, bytes.size() / 2);
  }
  // Under a new id, and (the source gone) under the id in the file: nothing is created.
  EXPECT_EQ(Run({"seq", "import", "--in", cut, "--id", "t-cut"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: DATA_LOSS: ")) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("truncated")) << err_.str();
  EXPECT_EQ(out_.str(), "");
  ASSERT_EQ(Run({"--json", "seq", "list"}), cli::kExitOk);
  const auto listed = ParseJson<v1::ListSequencesResponse>(out_.str());
  ASSERT_EQ(listed.sequences_size(), 1);
  EXPECT_EQ(listed.sequences(0).sequence_id(), "t-src");
  EXPECT_EQ(Run({"seq", "get", "--id", "t-cut"}), cli::kExitServerError);
  ASSERT_EQ(Run({"seq", "release", "--id", "t-src"}), cli::kExitOk);
  EXPECT_EQ(Run({"seq", "import", "--in", cut}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: DATA_LOSS: ")) << err_.str();
  ASSERT_EQ(Run({"seq", "list"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), "no sequences\n");

  // Bytes that are no snapshot: without --id the CLI cannot read an id from them (a local
  // error, no call); with one the server refuses them. A missing file is a local error.
  const std::string junk = dir + "/junk.bin";
  {
    std::ofstream out(junk, std::ios::binary);
    out << std::string(100, 'x');
  }
  EXPECT_EQ(Run({"seq", "import", "--in", junk}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("not an attend snapshot"));
  EXPECT_THAT(err_.str(), HasSubstr(junk));
  EXPECT_EQ(Run({"seq", "import", "--in", junk, "--id", "t-junk"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT"));
  EXPECT_EQ(Run({"seq", "import", "--in", dir + "/missing.attnsnap"}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("no such file"));
  ASSERT_EQ(Run({"seq", "list"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), "no sequences\n");
}

TEST_F(SeqCliTest, ExportOfAnUnknownIdFailsNotFoundAndLeavesNoFile) {
  const std::string dir = NewTempDir("seq-unknown");
  const std::string file = dir + "/nobody.attnsnap";
  EXPECT_EQ(Run({"seq", "export", "--id", "nobody", "--out", file}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: NOT_FOUND: "));
  EXPECT_THAT(err_.str(), HasSubstr("nobody"));
  EXPECT_EQ(out_.str(), "");
  EXPECT_FALSE(Exists(file));
  EXPECT_FALSE(Exists(file + ".tmp"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  // An existing file of that name is left as it was.
  {
    std::ofstream out(file, std::ios::binary);
    out << "keep";
  }
  EXPECT_EQ(Run({"seq", "export", "--id", "nobody", "--out", file}), cli::kExitServerError);
  EXPECT_EQ(ReadFile(file), "keep");
  EXPECT_FALSE(Exists(file + ".tmp"));
  // A directory that does not exist: a local error.
  Create("u-here");
  EXPECT_EQ(Run({"seq", "export", "--id", "u-here", "--out", dir + "/no/such/dir/f"}),
            cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr(dir + "/no/such/dir/f"));
}

// --out naming a symlink writes its target and leaves the link a link; a FIFO (or a device) is
// written through, never replaced by a regular file (the temporary file cannot be renamed onto
// it without replacing it).
TEST_F(SeqCliTest, ExportThroughSymlinksAndFifos) {
  const std::string dir = NewTempDir("seq-special");
  Create("sp");
  ASSERT_EQ(Run({"seq", "export", "--id", "sp", "--out", dir + "/plain"}), cli::kExitOk);
  const std::string want = ReadFile(dir + "/plain");
  ASSERT_FALSE(want.empty());

  std::filesystem::create_symlink(dir + "/target", dir + "/link");
  ASSERT_EQ(Run({"seq", "export", "--id", "sp", "--out", dir + "/link"}), cli::kExitOk)
      << err_.str();
  EXPECT_TRUE(std::filesystem::is_symlink(std::filesystem::symlink_status(dir + "/link")));
  EXPECT_EQ(ReadFile(dir + "/target"), want);
  EXPECT_FALSE(Exists(dir + "/link.tmp"));

  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo, std::ios::binary);
    got.assign(std::istreambuf_iterator<char>(in), {});
  });
  const int code = Run({"seq", "export", "--id", "sp", "--out", fifo});
  reader.join();
  EXPECT_EQ(code, cli::kExitOk) << err_.str();
  EXPECT_EQ(got, want);
  EXPECT_TRUE(std::filesystem::is_fifo(std::filesystem::status(fifo)));
  EXPECT_FALSE(Exists(fifo + ".tmp"));
}

// What somebody planted at <out>.tmp, the name a temporary file used to have, is neither written
// through (a link to another file) nor waited on (a FIFO): the export writes a new file of its
// own and leaves nothing behind but <out>.
TEST_F(SeqCliTest, PlantedTemporaryNamesAreNeitherWrittenThroughNorWaitedOn) {
  const std::string dir = NewTempDir("seq-planted");
  Create("pl");
  {
    std::ofstream victim(dir + "/victim");
    victim << "keep me";
  }
  std::filesystem::create_symlink(dir + "/victim", dir + "/a.attnsnap.tmp");
  ASSERT_EQ(mkfifo((dir + "/b.attnsnap.tmp").c_str(), 0600), 0);
  for (const char* name : {"a.attnsnap", "b.attnsnap"}) {
    SCOPED_TRACE(name);
    std::future<int> run = std::async(std::launch::async, [&] {
      return Run({"seq", "export", "--id", "pl", "--out", dir + "/" + name});
    });
    if (run.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "the export blocked";
      const int reader = open((dir + "/b.attnsnap.tmp").c_str(), O_RDONLY | O_NONBLOCK);
      char sink[1 << 16];
      while (run.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
        if (reader >= 0 && read(reader, sink, sizeof(sink)) < 0) continue;
      }
      if (reader >= 0) close(reader);
    }
    EXPECT_EQ(run.get(), cli::kExitOk) << err_.str();
    EXPECT_TRUE(
        std::filesystem::is_regular_file(std::filesystem::symlink_status(dir + "/" + name)));
  }
  EXPECT_EQ(ReadFile(dir + "/victim"), "keep me");
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.attnsnap", "a.attnsnap.tmp", "b.attnsnap",
                                             "b.attnsnap.tmp", "victim"}));
}

TEST_F(SeqCliTest, TransferUsageErrorsAndHelp) {
  EXPECT_EQ(Run({"seq", "save"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend seq save' needs --id"));
  EXPECT_EQ(Run({"seq", "load"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend seq load' needs --name"));
  EXPECT_EQ(Run({"seq", "export", "--id", "x"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend seq export' needs --out"));
  EXPECT_EQ(Run({"seq", "export", "--out", "f"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "import"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend seq import' needs --in"));
  EXPECT_EQ(Run({"seq", "import", "--in", "f", "--name", "n"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--name is not a flag of 'attend seq import'"));
  EXPECT_EQ(Run({"seq", "hand-off", "--id", "x"}), cli::kExitUsage);
  EXPECT_EQ(Run({"seq", "hand_off"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("hand-off"));

  ASSERT_EQ(Run({"seq", "--help"}), cli::kExitOk);
  for (const char* sub : {"save", "load", "export", "import", "hand-off"}) {
    EXPECT_TRUE(std::regex_search(out_.str(), std::regex(absl::StrCat(R"(\n  )", sub, R"(\s+\w)"))))
        << sub;
  }
  for (const char* sub : {"save", "load", "export", "import", "hand-off"}) {
    ASSERT_EQ(Run({"seq", sub, "--help"}), cli::kExitOk) << sub;
    EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat("usage: attend seq ", sub))) << sub;
    EXPECT_THAT(out_.str(), HasSubstr("Examples:\n  attend ")) << sub;
  }
  ASSERT_EQ(Run({"seq", "import", "--help"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("--no_share"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("--layers")));
  // Completion offers the new subcommands and their flags.
  ASSERT_EQ(Run({"completion", "bash"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("save load export import hand-off"));
  EXPECT_THAT(out_.str(), HasSubstr("hand-off) words="));
  EXPECT_THAT(out_.str(), HasSubstr("import) words=\"--in --id --no_share"));
}

// Two servers with snapshot directories: A hands off to B (standing in for the fleet's proxy,
// as in tests/server/snapshot_service_test.cc).
class SeqTransferCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ServerOptions b = Options();
    b.snapshot_dir = NewTempDir("seq-cli-b");
    auto started_b = server::AttendServer::Start(b);
    ASSERT_TRUE(started_b.ok()) << started_b.status();
    b_ = started_b->release();
    server::ServerOptions a = Options();
    a.snapshot_dir = NewTempDir("seq-cli-a");
    a.handoff_target = Target(b_);
    auto started_a = server::AttendServer::Start(a);
    ASSERT_TRUE(started_a.ok()) << started_a.status();
    a_ = started_a->release();
  }
  static void TearDownTestSuite() {
    delete a_;
    delete b_;
    a_ = b_ = nullptr;
  }
  static server::ServerOptions Options() {
    server::ServerOptions options = ::attend::testing::SmallServerOptions();
    options.kv_cache.capacity_bytes = 4 << 20;
    options.kv_cache.block_bytes = 4 << 10;
    return options;
  }
  static std::string Target(const server::AttendServer* s) {
    return absl::StrCat("127.0.0.1:", s->port());
  }

  void TearDown() override {
    for (const server::AttendServer* s : {a_, b_}) {
      client::ConnectionOptions options;
      options.target = Target(s);
      const client::KvCacheClient kv(client::Connect(options), options);
      auto all = kv.ListAllSequences();
      ASSERT_OK(all);
      for (const v1::SequenceInfo& info : *all) EXPECT_OK(kv.Release(info.sequence_id()));
    }
  }

  int RunAt(const server::AttendServer* s, std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", Target(s)});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }

  // A sequence of 2 layers with `n` tokens in each.
  void CreateAt(const server::AttendServer* s, const std::string& id, int n) {
    ASSERT_EQ(RunAt(s, {"seq", "create", "--id", id, "--n_head", "4", "--n_head_kv", "2",
                        "--head_dim", "8", "--kv_dtype", "f32"}),
              cli::kExitOk)
        << err_.str();
    for (const char* layer : {"0", "1"}) {
      ASSERT_EQ(RunAt(s, {"seq", "append", "--id", id, "--layer", layer, "--n", absl::StrCat(n)}),
                cli::kExitOk)
          << err_.str();
    }
  }

  v1::SequenceInfo GetAt(const server::AttendServer* s, const std::string& id) {
    EXPECT_EQ(RunAt(s, {"--json", "seq", "get", "--id", id}), cli::kExitOk) << err_.str();
    return ParseJson<v1::SequenceInfo>(out_.str());
  }

  inline static server::AttendServer* a_ = nullptr;
  inline static server::AttendServer* b_ = nullptr;
  std::ostringstream out_, err_;
};

TEST_F(SeqTransferCliTest, SaveThenLoadRoundTrip) {
  CreateAt(a_, "r-1", 37);
  const v1::SequenceInfo before = GetAt(a_, "r-1");
  ASSERT_EQ(RunAt(a_, {"seq", "save", "--id", "r-1", "--name", "r-1-v1"}), cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("saved 'r-1' as 'r-1-v1' in the server's snapshot directory"));
  EXPECT_THAT(out_.str(), HasSubstr("attend seq load --name r-1-v1"));
  ASSERT_EQ(RunAt(a_, {"--json", "seq", "save", "--id", "r-1"}), cli::kExitOk) << err_.str();
  const auto saved = ParseJson<v1::SaveSequenceResponse>(out_.str());
  EXPECT_EQ(saved.name(), "r-1");  // the id by default
  EXPECT_GT(saved.bytes(), 37 * 2 * 128);
  EXPECT_GE(saved.seconds(), 0);

  // Under a new id beside the original, then under the saved id once that one is gone.
  ASSERT_EQ(RunAt(a_, {"seq", "load", "--name", "r-1-v1", "--id", "r-2"}), cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("loaded 'r-1-v1' as 'r-2'"));
  EXPECT_THAT(out_.str(), HasSubstr("37 in every layer"));
  const v1::SequenceInfo loaded = GetAt(a_, "r-2");
  EXPECT_EQ(loaded.tokens(), before.tokens());
  EXPECT_EQ(std::vector<int64_t>(loaded.layer_tokens().begin(), loaded.layer_tokens().end()),
            std::vector<int64_t>(before.layer_tokens().begin(), before.layer_tokens().end()));
  EXPECT_EQ(loaded.bytes(), before.bytes());
  EXPECT_EQ(loaded.config().SerializeAsString(), before.config().SerializeAsString());
  EXPECT_EQ(RunAt(a_, {"seq", "load", "--name", "r-1-v1"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("ALREADY_EXISTS"));
  ASSERT_EQ(RunAt(a_, {"seq", "release", "--id", "r-1"}), cli::kExitOk);
  ASSERT_EQ(RunAt(a_, {"--json", "seq", "load", "--name", "r-1-v1"}), cli::kExitOk) << err_.str();
  const auto again = ParseJson<v1::SequenceInfo>(out_.str());
  EXPECT_EQ(again.sequence_id(), "r-1");
  EXPECT_EQ(again.tokens(), 37);

  EXPECT_EQ(RunAt(a_, {"seq", "load", "--name", "never-saved"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("error: NOT_FOUND: "));
  EXPECT_EQ(RunAt(a_, {"seq", "save", "--id", "nobody"}), cli::kExitServerError);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
}

TEST_F(SeqTransferCliTest, HandOffMovesEverySequenceToTheTarget) {
  std::map<std::string, v1::SequenceInfo> before;
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("k", i, "/s");
    CreateAt(a_, id, 20 + 7 * i);
    before[id] = GetAt(a_, id);
  }
  ASSERT_EQ(RunAt(a_, {"seq", "hand-off"}), cli::kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr(absl::StrCat("hand-off of ", Target(a_))));
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*moved\s+3 sequences)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*kept\s+0 sequences)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*failed\s+0 sequences)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\n\s*sent\s+\S+ \S+)"))) << out;
  EXPECT_EQ(err_.str(), "");
  ASSERT_EQ(RunAt(a_, {"seq", "list"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), "no sequences\n");
  for (const auto& [id, info] : before) {
    const v1::SequenceInfo moved = GetAt(b_, id);
    EXPECT_EQ(moved.tokens(), info.tokens()) << id;
    EXPECT_EQ(moved.bytes(), info.bytes()) << id;
  }

  // JSON: the response. A sequence whose id is taken on the receiver stays, named, and the exit
  // code says so.
  CreateAt(a_, "k0/s", 5);
  CreateAt(a_, "k9/s", 6);
  ASSERT_EQ(RunAt(a_, {"-o", "json", "seq", "hand-off"}), cli::kExitServerError);
  const auto response = ParseJson<v1::HandOffResponse>(out_.str());
  EXPECT_EQ(response.moved(), 1);
  EXPECT_EQ(response.kept(), 0);
  ASSERT_EQ(response.failed_size(), 1);
  EXPECT_EQ(response.failed(0).sequence_id(), "k0/s");
  EXPECT_GT(response.bytes(), 0);
  EXPECT_THAT(err_.str(), HasSubstr("1 sequence could not move"));
  EXPECT_EQ(GetAt(a_, "k0/s").tokens(), 5);  // still here, serving
  EXPECT_EQ(GetAt(b_, "k9/s").tokens(), 6);

  ASSERT_EQ(RunAt(a_, {"seq", "hand-off"}), cli::kExitServerError);
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*moved\s+0 sequences)")))
      << out_.str();
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*failed\s+1 sequence\b)")))
      << out_.str();
  EXPECT_TRUE(std::regex_search(out_.str(), std::regex(R"(\n\s*'k0/s': .*already)"))) << out_.str();
  EXPECT_THAT(err_.str(), HasSubstr("error: 1 sequence could not move"));
}

}  // namespace
}  // namespace attend
