// `attend seq <subcommand>` against a real server with a small KV cache: each subcommand's
// tables, --json read back (into the API's messages, or google.protobuf.Struct for the CLI's
// own objects), .npy round trips checked against the reference attention, help, and the exit
// codes of usage, local-file, server and connection errors.
#include <cmath>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attend/v1/kv_cache.pb.h"
#include "client/cli/cli.h"
#include "client/cli/command.h"
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

}  // namespace
}  // namespace attend
