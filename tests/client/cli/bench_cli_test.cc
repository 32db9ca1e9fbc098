// `attend bench`: DecodeStream steps, the empty unary (Health/Check) of the same run and each
// RPC's overhead as a ratio to it, the table at $COLUMNS, and the progress line only on a
// terminal.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "client/kv_cache_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ::attend::testing::ScopedColumns;

class BenchCliTest : public ::attend::testing::CliServerSuite {
 protected:
  google::protobuf::Struct Json() {
    google::protobuf::Struct s;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(out_.str(), &s).ok()) << out_.str();
    return s;
  }
  // The value at a dotted `path` of `s`; a failure and null when it is missing.
  static google::protobuf::Value At(const google::protobuf::Struct& s, const std::string& path) {
    const google::protobuf::Struct* at = &s;
    const std::vector<std::string> keys = absl::StrSplit(path, '.');
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto it = at->fields().find(keys[i]);
      if (it == at->fields().end()) {
        ADD_FAILURE() << "no " << path;
        return {};
      }
      if (i + 1 == keys.size()) return it->second;
      at = &it->second.struct_value();
    }
    return {};
  }
  static double Number(const google::protobuf::Struct& s, const std::string& path) {
    return At(s, path).number_value();
  }
  static bool IsNull(const google::protobuf::Struct& s, const std::string& path) {
    return At(s, path).kind_case() == google::protobuf::Value::kNullValue;
  }
  // Small decode shapes: 2 heads sharing 1 kv head of 8, 8 tokens prefilled.
  static std::vector<std::string> Decode(const std::string& rpc, std::vector<std::string> more) {
    std::vector<std::string> tokens = {"bench", "--rpc",       rpc, "--n_kv",     "8", "--n_head",
                                       "2",     "--n_head_kv", "1", "--head_dim", "8", "--warmup",
                                       "1"};
    tokens.insert(tokens.end(), more.begin(), more.end());
    return tokens;
  }
  int SequencesLeft() {
    client::ConnectionOptions options;
    options.target = absl::StrCat("127.0.0.1:", server_->port());
    auto all = client::KvCacheClient(client::Connect(options), options).ListAllSequences();
    EXPECT_TRUE(all.ok()) << all.status();
    return all.ok() ? static_cast<int>(all->size()) : -1;
  }
};

TEST_F(BenchCliTest, DecodeStreamTimesEachStepAndReleasesItsSequences) {
  ASSERT_EQ(Run(Decode("decode_stream",
                       {"--requests", "12", "--concurrency", "3", "--batch", "2", "--json"})),
            cli::kExitOk)
      << err_.str();
  const google::protobuf::Struct r = Json();
  EXPECT_EQ(At(r, "rpc").string_value(), "DecodeStream");
  EXPECT_EQ(Number(r, "requests"), 12);
  EXPECT_GT(Number(r, "server_compute_seconds.max"), 0);
  EXPECT_LE(Number(r, "latency_seconds.p50"), Number(r, "latency_seconds.p99"));
  // Each of the 12 timed steps decodes 2 sequences over at least the 8 + 1 (primer) + 1 tokens.
  EXPECT_GE(Number(r, "attention_flops"), 12.0 * 2 * 2 * 10 * 4 * 8);
  EXPECT_THAT(At(r, "shape").string_value(), HasSubstr("one stream per caller"));
  EXPECT_EQ(SequencesLeft(), 0);

  EXPECT_EQ(Run(Decode("decode_stream", {"--n_q", "2"})), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--rpc decode_stream sends one query per sequence"));
  EXPECT_EQ(Run({"bench", "--rpc", "stream"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("use attend, decode, decode_stream or softmax"));
}

TEST_F(BenchCliTest, OverheadIsARatioToTheEmptyUnaryOfTheSameRun) {
  ASSERT_EQ(Run(Decode("decode", {"--requests", "20", "--concurrency", "2", "--json"})),
            cli::kExitOk)
      << err_.str();
  const google::protobuf::Struct r = Json();
  EXPECT_EQ(At(r, "empty_unary.rpc").string_value(), "grpc.health.v1.Health/Check");
  EXPECT_EQ(Number(r, "empty_unary.requests"), 20);
  EXPECT_GT(Number(r, "empty_unary.latency_seconds.p50"), 0);
  // 20 calls from 2 callers: one round. Rounds alternate only when each gives every caller 20
  // calls or more, so that callers running out at a round's end barely change the concurrency.
  EXPECT_EQ(Number(r, "empty_unary.rounds"), 1);
  // With server times, the per-call overhead is the overhead.
  EXPECT_EQ(Number(r, "per_call_overhead_seconds.p50"), Number(r, "overhead_seconds.p50"));
  EXPECT_NEAR(Number(r, "overhead_ratio.p50"),
              Number(r, "overhead_seconds.p50") / Number(r, "empty_unary.latency_seconds.p50"),
              1e-6 * Number(r, "overhead_ratio.p50"));
  EXPECT_NEAR(Number(r, "overhead_ratio.mean"),
              Number(r, "overhead_seconds.mean") / Number(r, "empty_unary.latency_seconds.mean"),
              1e-6 * Number(r, "overhead_ratio.mean"));
  EXPECT_EQ(Number(r, "overhead_ratio_goal"), 1.5);

  ASSERT_EQ(Run(Decode("decode_stream", {"--requests", "5", "--json"})), cli::kExitOk);
  EXPECT_EQ(Number(Json(), "overhead_ratio_goal"), 1.0);
  EXPECT_EQ(Number(Json(), "empty_unary.rounds"), 1);
  EXPECT_EQ(Number(Json(), "empty_unary.requests"), 5);
  // Enough calls: up to 10 rounds, each of them calls from every caller of both RPCs.
  for (auto [requests, concurrency, rounds] :
       {std::tuple{"130", "1", 6}, {"400", "2", 10}, {"1000", "2", 10}, {"119", "3", 1}}) {
    ASSERT_EQ(Run({"bench", "--rpc", "softmax", "--n_kv", "4", "--requests", requests,
                   "--concurrency", concurrency, "--json"}),
              cli::kExitOk);
    const google::protobuf::Struct many = Json();
    EXPECT_EQ(Number(many, "empty_unary.rounds"), rounds) << requests << " x " << concurrency;
    EXPECT_EQ(Number(many, "empty_unary.requests"), std::stoi(requests));
    EXPECT_EQ(Number(many, "requests"), std::stoi(requests));
  }
  ASSERT_EQ(Run(Decode("decode", {"--requests", "5", "--batch", "2", "--json"})), cli::kExitOk);
  EXPECT_TRUE(IsNull(Json(), "overhead_ratio_goal"));
  // Without server times the whole latency is the per-call overhead.
  ASSERT_EQ(Run({"bench", "--rpc", "softmax", "--n_kv", "4", "--requests", "5", "--json"}),
            cli::kExitOk);
  const google::protobuf::Struct softmax = Json();
  EXPECT_EQ(Number(softmax, "per_call_overhead_seconds.p50"),
            Number(softmax, "latency_seconds.p50"));
  EXPECT_TRUE(IsNull(softmax, "overhead_ratio_goal"));
}

TEST_F(BenchCliTest, TextNamesTheRatioAndTheGoalOfOneTokenSteps) {
  ASSERT_EQ(Run(Decode("decode", {"--requests", "5"})), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\nempty unary "));
  EXPECT_THAT(out_.str(), ::testing::ContainsRegex(
                              "\nper call [0-9.]+ [mun]?s = [0-9.]+x the empty unary "
                              "\\(Health/Check [0-9.]+ [mun]?s\\), p50s; means [0-9.]+x\n"));
  EXPECT_THAT(out_.str(), ::testing::ContainsRegex(
                              "\ngoal for a 1-token DecodeBatch step: <= 1.5x the empty unary: "
                              "(met|not met) at p50\n"));
  ASSERT_EQ(Run(Decode("decode_stream", {"--requests", "5"})), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("goal for a 1-token DecodeStream step: <= 1.0x"));
  ASSERT_EQ(Run({"bench", "--n_kv", "4", "--requests", "5"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("x the empty unary"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("goal")));
}

TEST_F(BenchCliTest, NoEmptyUnarySkipsTheYardstick) {
  ASSERT_EQ(Run({"bench", "--n_kv", "4", "--requests", "3", "--no_empty_unary", "--json"}),
            cli::kExitOk);
  const google::protobuf::Struct r = Json();
  EXPECT_TRUE(IsNull(r, "empty_unary"));
  EXPECT_TRUE(IsNull(r, "overhead_ratio"));
  ASSERT_EQ(Run({"bench", "--n_kv", "4", "--requests", "3", "--no_empty_unary"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), Not(HasSubstr("empty unary")));
}

TEST_F(BenchCliTest, TableFitsColumnsAndWideShowsAll) {
  ScopedColumns columns("60");
  ASSERT_EQ(Run({"bench", "--n_kv", "4", "--requests", "3"}), cli::kExitOk) << err_.str();
  const std::string narrow = out_.str();
  EXPECT_THAT(narrow, ::testing::ContainsRegex("\n +mean +p50 +p90 +p99\n"));
  EXPECT_THAT(narrow, HasSubstr("\n(max hidden to fit 60 columns; -o wide shows it)\n"));
  // The table's lines: from its header to the note.
  const size_t header = narrow.find("   mean");
  const size_t note = narrow.find("\n(max hidden");
  ASSERT_LT(header, note);
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(narrow).substr(header, note - header), '\n')) {
    EXPECT_LE(line.size(), 60u) << line;
  }
  ASSERT_EQ(Run({"bench", "--n_kv", "4", "--requests", "3", "-o", "wide"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), ::testing::ContainsRegex("\n +mean +p50 +p90 +p99 +max\n"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("hidden")));
}

TEST_F(BenchCliTest, ProgressOnlyOnATerminal) {
  ASSERT_EQ(Run({"bench", "--rpc", "softmax", "--n_kv", "4", "--requests", "20"}), cli::kExitOk);
  EXPECT_EQ(err_.str(), "");  // piped: nothing extra

  cli::CliOptions terminal;
  terminal.err_is_terminal = true;
  std::ostringstream out, err;
  ASSERT_EQ(cli::RunCli({"--target", absl::StrCat("127.0.0.1:", server_->port()), "bench", "--rpc",
                         "softmax", "--n_kv", "4", "--requests", "20"},
                        out, err, terminal),
            cli::kExitOk);
  // One line for the RPC's calls and the empty unary's, which alternate, cleared at its end;
  // stdout as without a terminal.
  const std::string e = err.str();
  EXPECT_THAT(e, HasSubstr("\rbench Softmax and Health/Check: 0/40 requests"));
  EXPECT_THAT(e.substr(e.rfind('\r', e.size() - 2)), ::testing::MatchesRegex("\r *\r"));
  EXPECT_EQ(e.find('\n'), std::string::npos);
  EXPECT_THAT(out.str(), HasSubstr("bench Softmax on"));
}

}  // namespace
}  // namespace attend
