// The planner commands of the attend CLI against a real server: models, model, plan and cost,
// their tables and --json, --plot (SVG checked with python3's xml.etree), byte-size parsing,
// imports from files, and the exit codes of usage, local and server errors.
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "attend/v1/planner.pb.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "planner/catalog.h"
#include "tests/client/xml_check.h"
#include "tests/planner/hybrid_model_files.h"
#include "tests/planner/model_files.h"
#include "tests/server/server_fixture.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::planner::testing::kLlama3_8BConfig;
using ::attend::planner::testing::TinyGguf;
using ::attend::testing::StatusIs;
using ::testing::HasSubstr;

std::string WriteTemp(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// The data-series of every polyline in the SVG at `path` as python3's xml.etree parses it, one
// per line, or the parser's error.
std::string PythonSeries(const std::string& path) {
  return ::attend::testing::PythonSeries(::attend::testing::ReadFile(path));
}

// The points of the polyline whose data-series is `series`, in pixels.
std::vector<std::pair<double, double>> SeriesPoints(const std::string& svg,
                                                    const std::string& series) {
  const std::regex re("<polyline data-series=\"" + series + "\"[^>]* points=\"([^\"]*)\"");
  std::smatch m;
  std::vector<std::pair<double, double>> out;
  if (!std::regex_search(svg, m, re)) return out;
  for (absl::string_view p : absl::StrSplit(m[1].str(), ' ', absl::SkipEmpty())) {
    const std::vector<std::string> xy = absl::StrSplit(p, ',');
    out.emplace_back(std::stod(xy.at(0)), std::stod(xy.at(1)));
  }
  return out;
}

class PlannerCliTest : public ::attend::testing::ServerSuite {
 protected:
  int Run(std::vector<std::string> tokens) {
    tokens.insert(tokens.begin(), {"--target", absl::StrCat("127.0.0.1:", server_->port())});
    out_.str("");
    err_.str("");
    return cli::RunCli(tokens, out_, err_);
  }
  void ExpectOut(const std::vector<std::string>& substrings) {
    for (const std::string& s : substrings) {
      EXPECT_NE(out_.str().find(s), std::string::npos) << "\"" << s << "\" in\n" << out_.str();
    }
  }
  // Like ExpectOut, but a run of two or more spaces in `lines` matches any run of spaces, so that
  // column alignment is not part of the expectation.
  void ExpectAligned(const std::vector<std::string>& lines) {
    for (const std::string& line : lines) {
      std::string pattern;
      for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] == ' ' && i + 1 < line.size() && line[i + 1] == ' ') {
          while (i + 1 < line.size() && line[i + 1] == ' ') ++i;
          pattern += " +";
        } else if (std::string("\\^$.|?*+()[]{}").find(line[i]) != std::string::npos) {
          pattern += std::string("\\") + line[i];
        } else {
          pattern += line[i];
        }
      }
      ExpectOutMatches(pattern);
    }
  }
  void ExpectOutMatches(const std::string& pattern) {
    EXPECT_TRUE(std::regex_search(out_.str(), std::regex(pattern))) << "/" << pattern << "/ in\n"
                                                                    << out_.str();
  }
  template <typename Message>
  Message ParseJson() {
    Message m;
    const auto status = google::protobuf::util::JsonStringToMessage(out_.str(), &m);
    EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << out_.str();
    return m;
  }

  std::ostringstream out_, err_;
};

// --- models / model ---------------------------------------------------------------------------

TEST_F(PlannerCliTest, ModelsPrintsTheCatalogAsATable) {
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  ExpectOutMatches(
      "name +layers +heads +kv heads +head dim +window +params +max context +source\n");
  ExpectOutMatches("\ntiny +4 +8 +2 +32 +- +19.4M +4,096 +lesson 3");
  ExpectOutMatches("\nllama-3-8b +32 +32 +8 +128 +- +8.03B +8,192 +Hugging Face");
  ExpectOutMatches("\nllama-3-70b +80 +64 +8 +128 +- +70.6B +8,192 ");
  ExpectOutMatches("\nmistral-7b +32 +32 +8 +128 +4,096 +7.24B +32,768 ");
  ExpectOutMatches("\ngemma-2-9b +42 +16 +8 +256 +4,096 on 21/42 ");
  ExpectOutMatches("\nmixtral-8x7b .* 46.7B \\(12.9B active\\) ");
}

TEST_F(PlannerCliTest, ModelsJsonHoldsEveryPreset) {
  ASSERT_EQ(Run({"--json", "models"}), cli::kExitOk) << err_.str();
  const v1::ListModelsResponse r = ParseJson<v1::ListModelsResponse>();
  ASSERT_EQ(r.models_size(), static_cast<int>(planner::Catalog().size()));
  EXPECT_EQ(r.models(0).name(), "tiny");
}

TEST_F(PlannerCliTest, ModelShowsOnePresetInFull) {
  ASSERT_EQ(Run({"model", "llama-3-8b"}), cli::kExitOk) << err_.str();
  ExpectAligned({"Llama 3 8B\n", "key/value heads     8 (grouped-query, 4 query heads per",
                 "parameters          8,030,261,248 (8.03B)", "max context         8,192 tokens",
                 "KV cache (float16)  128.00 KiB per token, 1.00 GiB at 8,192 tokens",
                 "source              Hugging Face meta-llama/Meta-Llama-3-8B config.json"});
  const std::string model = out_.str();
  ASSERT_EQ(Run({"models", "llama-3-8b"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), model);
  ASSERT_EQ(Run({"model", "gemma-2-9b"}), cli::kExitOk) << err_.str();
  ExpectOut({"21 layers (0, 2, 4, ..., 40): 8 key/value heads, sliding window of 4,096 tokens",
             "21 layers (1, 3, 5, ..., 41): 8 key/value heads, full attention"});
  ASSERT_EQ(Run({"model", "tiny", "--json"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(ParseJson<v1::ModelSpec>().parameters(), 19400960);
}

// Lesson 3, Example 10: "per layer: Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216
// parameters" (4096 x 32 x 128 and 4096 x 8 x 128; 41,943,040 together).
TEST_F(PlannerCliTest, ModelShowsTheLessonsPerLayerProjections) {
  ASSERT_EQ(Run({"model", "llama-3-8b"}), cli::kExitOk) << err_.str();
  ExpectAligned(
      {"per layer           Wq 16,777,216  Wk 4,194,304  Wv 4,194,304  Wo 16,777,216 "
       "parameters (41,943,040 in all)\n"});
}

// A model whose layers differ in key/value heads lists one projection line per kind. The
// lessons' tiny model with layer 1 multi-query, from a GGUF header: d_model 256, 8 heads of 32,
// so Wq = Wo = 256 x 8 x 32 = 65,536; Wk = Wv = 256 x 2 x 32 = 16,384, or 8,192 with 1 head.
TEST_F(PlannerCliTest, ModelListsProjectionsPerLayerKind) {
  planner::testing::GgufWriter w;
  w.Str("general.architecture", "llama")
      .Str("general.name", "Mixed Tiny")
      .U32("llama.block_count", 4)
      .U32("llama.context_length", 4096)
      .U32("llama.embedding_length", 256)
      .U32("llama.feed_forward_length", 768)
      .U32("llama.attention.head_count", 8)
      .Array("llama.attention.head_count_kv", planner::gguf::kU32,
             std::vector<uint32_t>{2, 1, 2, 2})
      .U32("llama.vocab_size", 32000);
  const std::string gguf = WriteTemp("planner_cli_mixed.gguf", w.Build());
  ASSERT_EQ(Run({"model", "--gguf", gguf}), cli::kExitOk) << err_.str();
  ExpectAligned(
      {"per layer           3 layers with 2 key/value heads (first: layer 0): Wq 65,536  "
       "Wk 16,384  Wv 16,384  Wo 65,536 parameters (163,840 in all)\n",
       "\n                    1 layer with 1 key/value head (first: layer 1): Wq 65,536  "
       "Wk 8,192  Wv 8,192  Wo 65,536 parameters (147,456 in all)\n"});
}

// --- plan ---------------------------------------------------------------------------------------

TEST_F(PlannerCliTest, PlanPrintsTheLessonNumbers) {
  ASSERT_EQ(Run({"plan", "tiny", "--context", "4096"}), cli::kExitOk) << err_.str();
  ExpectAligned({"bytes per token               1.00 KiB (1,024 bytes)",
                 "per sequence (4,096 tokens)   4.00 MiB (4,194,304 bytes)"});
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--context", "8192"}), cli::kExitOk) << err_.str();
  ExpectAligned({"bytes per token               128.00 KiB (131,072 bytes)",
                 "per sequence (8,192 tokens)   1.00 GiB (1,073,741,824 bytes)"});
}

// Lesson 3, Example 10, llama.cpp's log for the tiny model at 4096 tokens: "size = 4.00 MiB ...
// K (f16): 2.00 MiB, V (f16): 2.00 MiB". By hand, a half is 4 layers x 2 KV heads x 32 x 2
// bytes = 512 bytes per token, x 4096 = 2 MiB; for 3 sequences 6 MiB each.
TEST_F(PlannerCliTest, PlanSplitsKeysAndValuesLikeLlamaCpp) {
  ASSERT_EQ(Run({"plan", "tiny", "--context", "4096"}), cli::kExitOk) << err_.str();
  ExpectAligned(
      {"bytes per token               1.00 KiB (1,024 bytes)\n"
       "  keys + values               512 bytes + 512 bytes\n",
       "per sequence (4,096 tokens)   4.00 MiB (4,194,304 bytes)\n"
       "  keys + values               2.00 MiB + 2.00 MiB\n"
       "total (1 sequence)            4.00 MiB (4,194,304 bytes)\n"});
  ASSERT_EQ(Run({"plan", "tiny", "--context", "4096", "--batch", "3"}), cli::kExitOk) << err_.str();
  ExpectAligned(
      {"total (3 sequences)           12.00 MiB (12,582,912 bytes)\n"
       "  keys + values               6.00 MiB + 6.00 MiB\n"});
}

// `attend --json plan` carries the halves and the projections under their proto field names.
TEST_F(PlannerCliTest, PlanJsonCarriesKeysValuesAndProjections) {
  ASSERT_EQ(Run({"--json", "plan", "tiny", "--context", "4096", "--batch", "2"}), cli::kExitOk)
      << err_.str();
  // int64 fields are JSON numbers while a double holds them exactly.
  ExpectOut({"\"k_bytes_per_token\": 512", "\"v_bytes_per_token\": 512",
             "\"k_bytes_per_sequence\": 2097152", "\"v_bytes_per_sequence\": 2097152",
             "\"k_total_bytes\": 4194304", "\"v_total_bytes\": 4194304", "\"projections\": ["});
  const v1::PlanKvCacheResponse r = ParseJson<v1::PlanKvCacheResponse>();
  EXPECT_EQ(r.k_total_bytes() + r.v_total_bytes(), r.total_bytes());
  // The tiny model: d_model 256, 8 heads of 32, 2 KV heads: Wq = Wo = 256 x 8 x 32 = 65,536,
  // Wk = Wv = 256 x 2 x 32 = 16,384.
  ASSERT_EQ(r.projections_size(), 1);
  EXPECT_EQ(r.projections(0).wq(), 65536);
  EXPECT_EQ(r.projections(0).wk(), 16384);
  EXPECT_EQ(r.projections(0).wv(), 16384);
  EXPECT_EQ(r.projections(0).wo(), 65536);
  EXPECT_EQ(r.projections(0).layers(), 4);

  // Llama 3 8B in q8_0: a 128-value head row is 4 blocks of 34 bytes in each half, so a half is
  // 32 x 8 x 136 = 34,816 bytes per token, and the lesson's projections (Example 10).
  ASSERT_EQ(Run({"--json", "plan", "llama-3-8b", "--context", "8192", "--kv_dtype", "q8_0"}),
            cli::kExitOk)
      << err_.str();
  const v1::PlanKvCacheResponse q = ParseJson<v1::PlanKvCacheResponse>();
  EXPECT_EQ(q.k_bytes_per_token(), 34816);
  EXPECT_EQ(q.v_bytes_per_token(), 34816);
  EXPECT_EQ(q.k_bytes_per_sequence(), 34816LL * 8192);
  ASSERT_EQ(q.projections_size(), 1);
  EXPECT_EQ(q.projections(0).wq(), 16777216);
  EXPECT_EQ(q.projections(0).wk(), 4194304);
}

// The lesson's table: "variant  kv heads  group  KiB/token  GiB at 32768 tokens".
TEST_F(PlannerCliTest, PlanPrintsTheVariantsTableLikeTheLesson) {
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--context", "32768"}), cli::kExitOk) << err_.str();
  ExpectOutMatches("variant +kv heads +group +KiB/token +GiB at 32768 tokens\n");
  ExpectOutMatches("multi-head \\(MHA\\) +32 +1 +512 +16\\.00\n");
  ExpectOutMatches("grouped-query \\(GQA\\) \\* +8 +4 +128 +4\\.00\n");
  ExpectOutMatches("multi-query \\(MQA\\) +1 +32 +16 +0\\.50\n");
  ExpectOut({"* the model's own key/value heads"});
}

// "Llama 3 70B, 32k context, 16 concurrent users, fp8 KV: does it fit in 80 GiB?" Exactly:
// 163,840 bytes per token x 32,768 x 16 = 80 GiB.
TEST_F(PlannerCliTest, PlanAnswersTheBudgetQuestion) {
  ASSERT_EQ(Run({"plan", "llama-3-70b", "--context", "32768", "--batch", "16", "--kv_dtype", "fp8",
                 "--budget", "80GiB"}),
            cli::kExitOk)
      << err_.str();
  ExpectAligned({"KV cache in fp8 (1 byte per value), 32,768 tokens x 16 sequences",
                 "note: Llama 3 70B accepts at most 8,192 tokens",
                 "total (16 sequences)          80.00 GiB (85,899,345,920 bytes)",
                 "budget 80.00 GiB (85,899,345,920 bytes): fits", "it fits, with 0 bytes to spare",
                 "longest context, 16 sequences    32,768 tokens",
                 "longest context, one sequence    524,288 tokens",
                 "most sequences of 32,768 tokens  16"});
  ExpectOutMatches("grouped-query \\(GQA\\) \\* +8 +8 +160 +5\\.00 +80\\.00\n");

  ASSERT_EQ(
      Run({"plan", "llama-3-8b", "--budget", "80GB", "--subtract_weights", "--block_tokens", "16"}),
      cli::kExitOk)
      << err_.str();
  ExpectAligned(
      {"budget 74.51 GiB (80,000,000,000 bytes) - weights 14.96 GiB = 59.55 GiB for the "
       "cache: fits",
       "paged (16-token blocks)       1.00 GiB (1,073,741,824 bytes) allocated, 512 blocks",
       "most sequences of 8,192 tokens   59"});
}

TEST_F(PlannerCliTest, PlanJsonIsTheResponse) {
  ASSERT_EQ(Run({"--json", "plan", "llama-3-8b", "--context", "8192", "--batch", "2", "--budget",
                 "80GB", "--kv_dtype", "q8_0"}),
            cli::kExitOk)
      << err_.str();
  const v1::PlanKvCacheResponse r = ParseJson<v1::PlanKvCacheResponse>();
  EXPECT_EQ(r.kv_dtype(), v1::KV_Q8_0);
  // A 128-value head row of q8_0 is 4 blocks of 34 bytes: 2 x 32 x 8 x 136 per token.
  EXPECT_EQ(r.bytes_per_token(), 2 * 32 * 8 * 136);
  EXPECT_EQ(r.total_bytes(), 2 * 8192 * int64_t{2 * 32 * 8 * 136});
  EXPECT_EQ(r.budget().budget_bytes(), 80'000'000'000);
  EXPECT_TRUE(r.budget().fits());
  EXPECT_EQ(r.variants_size(), 3);
}

// --replica_memory: the fleet section, in the table and in JSON.
TEST_F(PlannerCliTest, PlanFleetReplicas) {
  ASSERT_EQ(Run({"plan", "llama-3-70b", "--context", "32768", "--batch", "500", "--kv_dtype", "fp8",
                 "--replica_memory", "64GiB"}),
            cli::kExitOk)
      << err_.str();
  const std::string text = out_.str();
  EXPECT_NE(text.find("fleet, 64.00 GiB per replica: "), std::string::npos) << text;
  // 5 GiB per sequence: 12 per replica, 42 replicas if spread evenly (by hand).
  EXPECT_TRUE(std::regex_search(text, std::regex("sequences of 32,768 tokens per replica +12\n")))
      << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("replicas if spread evenly +42\n"))) << text;
  ASSERT_EQ(Run({"--json", "plan", "llama-3-70b", "--context", "32768", "--batch", "500",
                 "--kv_dtype", "fp8", "--replica_memory", "64GiB"}),
            cli::kExitOk);
  const v1::FleetPlan fleet = ParseJson<v1::PlanKvCacheResponse>().fleet();
  EXPECT_EQ(fleet.sequences_per_replica(), 12);
  EXPECT_GT(fleet.replicas(), 42);
  EXPECT_TRUE(std::regex_search(
      text,
      std::regex(absl::StrCat("replicas behind the consistent hash +", fleet.replicas(), "\n"))))
      << text;
  EXPECT_EQ(Run({"plan", "tiny", "--replica_memory", "64G"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("--replica_memory: '64G'"), std::string::npos) << err_.str();
}

// --budget takes binary and decimal units: GiB = 2^30 bytes, GB = 10^9.
TEST_F(PlannerCliTest, PlanBudgetSizes) {
  const struct {
    const char* flag;
    int64_t bytes;
  } cases[] = {
      {"80GiB", int64_t{80} << 30}, {"80GB", 80'000'000'000}, {"512MiB", int64_t{512} << 20},
      {"1e9", 1'000'000'000},       {"1.5KiB", 1536},         {"2 tib", int64_t{2} << 40}};
  for (const auto& c : cases) {
    ASSERT_EQ(Run({"--json", "plan", "tiny", "--budget", c.flag}), cli::kExitOk) << err_.str();
    EXPECT_EQ(ParseJson<v1::PlanKvCacheResponse>().budget().budget_bytes(), c.bytes) << c.flag;
  }
}

TEST_F(PlannerCliTest, PlanImportsConfigAndGgufFiles) {
  const std::string config = WriteTemp("planner_cli_config.json", kLlama3_8BConfig);
  ASSERT_EQ(Run({"plan", "--config", config, "--context", "8192"}), cli::kExitOk) << err_.str();
  ExpectAligned({"bytes per token               128.00 KiB (131,072 bytes)",
                 "per sequence (8,192 tokens)   1.00 GiB (1,073,741,824 bytes)"});
  ASSERT_EQ(Run({"--json", "model", "--config", config, "my-llama"}), cli::kExitOk) << err_.str();
  const v1::ModelSpec spec = ParseJson<v1::ModelSpec>();
  EXPECT_EQ(spec.name(), "my-llama");
  EXPECT_EQ(spec.parameters(), 8030261248);

  const std::string gguf =
      WriteTemp("planner_cli_tiny.gguf", TinyGguf().Build() + std::string(1000, 'T'));
  ASSERT_EQ(Run({"plan", "--gguf", gguf}), cli::kExitOk) << err_.str();
  ExpectAligned(
      {"Tiny Lesson Model (tiny-lesson-model): 4 layers, 8 query heads, 2 key/value heads, head "
       "size 32",
       "per sequence (4,096 tokens)   4.00 MiB (4,194,304 bytes)"});

  // Only the start of a large file travels: max_message_bytes - 4 KiB of it.
  const std::string big =
      WriteTemp("planner_cli_big.gguf", TinyGguf().Build() + std::string(1 << 20, '\x7f'));
  ASSERT_EQ(Run({"--max_message_bytes", "8192", "plan", "--gguf", big}), cli::kExitOk)
      << err_.str();
  ExpectOut({"Tiny Lesson Model (tiny-lesson-model)"});
  EXPECT_EQ(Run({"--max_message_bytes", "4200", "plan", "--gguf", big}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("note: sent the first 104 bytes of"), std::string::npos) << err_.str();

  // A GGUF cut inside its metadata is the server's INVALID_ARGUMENT, naming the field.
  const std::string cut = WriteTemp("planner_cli_cut.gguf", TinyGguf().Build().substr(0, 100));
  EXPECT_EQ(Run({"plan", "--gguf", cut}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("INVALID_ARGUMENT: gguf: "), std::string::npos) << err_.str();
  const std::string broken = WriteTemp("planner_cli_broken.json", "{\"num_hidden_layers\": 3,");
  EXPECT_EQ(Run({"plan", "--config", broken}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("INVALID_ARGUMENT: hf_config_json: config.json: line 1"),
            std::string::npos)
      << err_.str();
}

// Files that cannot be a config.json or a GGUF file are refused here, before anything is sent:
// bytes that are not UTF-8 (which protobuf would log about and the server refuse), a config over
// the server's 1 MiB, and a GGUF file without its magic. /dev/zero ends at the bound, at once.
TEST_F(PlannerCliTest, ImportFilesAreCheckedLocally) {
  const std::string binary = WriteTemp("planner_cli_binary.json", "{\"a\": \"\x89PNG\"}");
  EXPECT_EQ(Run({"plan", "--config", binary}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(), absl::StrCat("error: --config ", binary,
                                     ": not UTF-8 text (byte 7 is 0x89), so not a config.json\n"));
  EXPECT_EQ(Run({"plan", "--config", "/dev/zero"}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(),
            "error: --config /dev/zero: more than 1048576 bytes; the server takes a config.json of "
            "at most 1 MiB\n");
  const std::string large = WriteTemp("planner_cli_large.json", std::string(2 << 20, ' '));
  EXPECT_EQ(Run({"model", "--config", large}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("more than 1048576 bytes"));
  // A smaller --max_message_bytes bounds it lower, and says so.
  const std::string config = WriteTemp("planner_cli_config_small.json", kLlama3_8BConfig);
  EXPECT_EQ(Run({"--max_message_bytes", "4200", "plan", "--config", config}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(), absl::StrCat("error: --config ", config,
                                     ": more than 104 bytes; a request of --max_message_bytes "
                                     "4200 carries no more, less 4 KiB for the rest of it\n"));
  EXPECT_EQ(Run({"plan", "--gguf", "/dev/zero"}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(),
            "error: --gguf /dev/zero: not a GGUF file: it starts with \"\\x00\\x00\\x00\\x00\", "
            "not \"GGUF\"\n");
  EXPECT_EQ(Run({"cost", "--gguf", binary, "--context", "10"}), cli::kExitLocalError);
  EXPECT_THAT(err_.str(), HasSubstr("not a GGUF file: it starts with \"{\\\"a\\\"\""));
  const std::string empty = WriteTemp("planner_cli_empty.gguf", "");
  EXPECT_EQ(Run({"plan", "--gguf", empty}), cli::kExitLocalError);
  EXPECT_EQ(err_.str(), absl::StrCat("error: --gguf ", empty,
                                     ": not a GGUF file: it starts with \"\", not \"GGUF\"\n"));
}

TEST_F(PlannerCliTest, PlanPlotsOneLinePerVariant) {
  const std::string path = ::testing::TempDir() + "/planner_cli_kv.svg";
  std::remove(path.c_str());
  ASSERT_EQ(Run({"plan", "mistral-7b", "--plot", path}), cli::kExitOk) << err_.str();
  ExpectOut({"wrote " + path + " (3 lines)"});
  const std::string svg = ::attend::testing::ReadFile(path);
  EXPECT_EQ(PythonSeries(path), "MHA: 32 KV heads\nGQA: 8 KV heads (the model)\nMQA: 1 KV head\n");
  for (const char* label :
       {"Mistral 7B v0.1: KV cache against context", "context (tokens per sequence)",
        "KV cache (GiB, 1 sequence)", "data-marker=\"window 4,096\"", ">35,000</text>"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
  // The sliding window flattens every line: from 4,096 tokens on, the height stays the same.
  const std::vector<std::pair<double, double>> gqa =
      SeriesPoints(svg, "GQA: 8 KV heads \\(the model\\)");
  ASSERT_GE(gqa.size(), 10u);
  EXPECT_LT(gqa.back().second, gqa.front().second);  // it rose
  EXPECT_EQ(gqa.back().second, gqa[gqa.size() - 2].second);
  EXPECT_EQ(gqa.back().second, gqa[gqa.size() / 2].second);

  // Without windows the line keeps rising to the end.
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--plot", path, "--budget", "2GiB"}), cli::kExitOk);
  const std::string llama = ::attend::testing::ReadFile(path);
  EXPECT_EQ(PythonSeries(path),
            "MHA: 32 KV heads\nGQA: 8 KV heads (the model)\nMQA: 1 KV head\n"
            "budget: 2.00 GiB for the cache\n");
  const std::vector<std::pair<double, double>> line =
      SeriesPoints(llama, "GQA: 8 KV heads \\(the model\\)");
  ASSERT_GE(line.size(), 2u);
  EXPECT_LT(line.back().second, line[line.size() - 2].second);
  EXPECT_EQ(llama.find("data-marker"), std::string::npos);
}

TEST_F(PlannerCliTest, PlanPlotsOneLinePerKvType) {
  const std::string path = ::testing::TempDir() + "/planner_cli_dtype.svg";
  ASSERT_EQ(Run({"plan", "gemma-2-9b", "--plot", path, "--plot_by", "dtype", "--json"}),
            cli::kExitOk)
      << err_.str();
  ParseJson<v1::PlanKvCacheResponse>();  // --json output stays pure JSON
  EXPECT_EQ(PythonSeries(path), "float32\nfloat16 / bfloat16\nfp8 / int8\nq8_0\nq4_0\n");
  const std::string svg = ::attend::testing::ReadFile(path);
  EXPECT_NE(svg.find("one line per KV cache type"), std::string::npos);
  // Half of Gemma 2's layers slide: past the window the lines rise at half the slope.
  const std::vector<std::pair<double, double>> f16 = SeriesPoints(svg, "float16 / bfloat16");
  ASSERT_GE(f16.size(), 4u);
  // Samples: 1, 682, 1365, 2048, 2730, 3413, 4096 (the window), 4778, ... 8192.
  const auto slope = [&](size_t i) {
    return (f16[i + 1].second - f16[i].second) / (f16[i + 1].first - f16[i].first);
  };
  EXPECT_NEAR(slope(f16.size() - 2), slope(1) / 2, std::abs(slope(1)) * 0.02);
}

TEST_F(PlannerCliTest, PlanErrorsAndExitCodes) {
  // Usage errors: exit 2, nothing sent.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"plan"},
           {"plan", "a", "b"},
           {"plan", "tiny", "--kv_dtype", "f12"},
           {"plan", "tiny", "--context", "many"},
           {"plan", "tiny", "--budget", "80G"},
           {"plan", "tiny", "--budget", "-5GB"},
           {"plan", "--config", "a.json", "--gguf", "b.gguf"},
           {"plan", "tiny", "--plot", "x.svg", "--plot_by", "colour"},
           {"plan", "tiny", "--plot_by", "dtype"},
           {"plan", "tiny", "--no_such_flag"},
           {"model"},
           {"model", "a", "b"},
       }) {
    EXPECT_EQ(Run(args), cli::kExitUsage) << absl::StrJoin(args, " ") << "\n" << err_.str();
    EXPECT_NE(err_.str().find("usage error: "), std::string::npos) << err_.str();
  }
  // Local file errors: exit 1.
  EXPECT_EQ(Run({"plan", "--config", "/nonexistent/config.json"}), cli::kExitLocalError);
  EXPECT_NE(err_.str().find("cannot open"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"plan", "tiny", "--plot", "/nonexistent/dir/kv.svg"}), cli::kExitLocalError);
  // Server errors: exit 4 with the code and the field.
  EXPECT_EQ(Run({"plan", "no-such-model"}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("NOT_FOUND: model.name: model 'no-such-model' is not in the catalog"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(Run({"plan", "tiny", "--context", "-5"}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("INVALID_ARGUMENT: context_tokens: -5"), std::string::npos)
      << err_.str();
  EXPECT_EQ(Run({"model", "nope"}), cli::kExitServerError);
  EXPECT_NE(err_.str().find("NOT_FOUND: name: "), std::string::npos) << err_.str();
}

TEST_F(PlannerCliTest, PlanHelpListsTheFlags) {
  ASSERT_EQ(Run({"plan", "--help"}), cli::kExitOk);
  ExpectOut({"--budget", "--kv_dtype", "--plot_by", "80GiB", "--subtract_weights", "--gguf"});
  ASSERT_EQ(Run({"--help"}), cli::kExitOk);
  ExpectOut({"  models", "  plan", "  cost"});
}

// --- cost ---------------------------------------------------------------------------------------

// The lessons' 8B shape with P = 8e9 at 8,192 tokens: prefill attention 17.6 TFLOP against
// 131.1 TFLOP of weights; a decode step 4.29 GFLOP against 16.0. Crossovers: 61,035 and 30,518.
TEST_F(PlannerCliTest, CostPrintsPrefillAndDecode) {
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "8192", "--parameters", "8e9", "--hardware",
                 "h100", "--price", "2.5"}),
            cli::kExitOk)
      << err_.str();
  ExpectOutMatches(
      "phase +attention FLOPs +weight FLOPs +bytes moved +FLOP/byte +time +bound +tokens/s "
      "+\\$/Mtok\n");
  ExpectOutMatches(
      "prefill +17\\.6 TFLOP +131\\.1 TFLOP +17\\.1 GB +[0-9,]+ +[0-9.]+ ms +compute ");
  ExpectOutMatches(
      "decode +4\\.29 GFLOP +16\\.0 GFLOP +17\\.1 GB +1\\.19 +5\\.10 ms +memory +196 ");
  ExpectOut({"on h100", "P = 8,000,000,000 parameters", "bfloat16 at 989.5 TFLOP/s",
             "memory 3.35 TB/s", "from 61,035 tokens", "a decode step's from 30,518 tokens"});
}

TEST_F(PlannerCliTest, CostJsonAndCustomHardware) {
  ASSERT_EQ(Run({"--json", "cost", "llama-3-8b", "--prompt", "1024", "--parameters", "8e9",
                 "--hardware", "my-box", "--peak_flops", "100e12", "--bandwidth", "1TB"}),
            cli::kExitOk)
      << err_.str();
  const v1::EstimateCostResponse r = ParseJson<v1::EstimateCostResponse>();
  EXPECT_EQ(r.hardware().name(), "my-box");
  EXPECT_EQ(r.hardware().peak_flops_bf16(), 100e12);
  EXPECT_EQ(r.hardware().memory_bandwidth_bytes_per_second(), 1e12);
  EXPECT_EQ(r.parameters(), 8'000'000'000);
  EXPECT_DOUBLE_EQ(r.prefill().weight_flops(), 2 * 8e9 * 1024);
  EXPECT_DOUBLE_EQ(r.prefill().attention_flops(), 4.0 * 128 * 32 * 32 * 1024 * 1025 / 2);

  EXPECT_EQ(
      Run({"cost", "llama-3-8b", "--prompt", "10", "--peak_flops", "1e12", "--bandwidth", "0"}),
      cli::kExitServerError);
  EXPECT_NE(err_.str().find("INVALID_ARGUMENT: custom.memory_bandwidth_bytes_per_second"),
            std::string::npos)
      << err_.str();
  EXPECT_EQ(Run({"cost", "llama-3-8b", "--prompt", "10", "--hardware", "tpu"}),
            cli::kExitServerError);
  EXPECT_NE(err_.str().find("NOT_FOUND: profile: hardware 'tpu'"), std::string::npos) << err_.str();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"cost", "llama-3-8b"},
           {"cost", "llama-3-8b", "--prompt", "x"},
           {"cost", "llama-3-8b", "--prompt", "10", "--parameters", "lots"},
           {"cost", "llama-3-8b", "--prompt", "10", "--price", "cheap"},
           {"cost", "llama-3-8b", "--prompt", "10", "--bandwidth", "fast"},
           {"cost", "--prompt", "10"},
       }) {
    EXPECT_EQ(Run(args), cli::kExitUsage) << absl::StrJoin(args, " ") << "\n" << err_.str();
  }
}

TEST_F(PlannerCliTest, CostPlotsFlopsWithTheCrossover) {
  const std::string path = ::testing::TempDir() + "/planner_cli_cost.svg";
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "8192", "--parameters", "8e9", "--plot", path}),
            cli::kExitOk)
      << err_.str();
  EXPECT_EQ(PythonSeries(path),
            "prefill attention\nprefill weights (2P per token)\n"
            "prefill (the whole prompt)\ndecode step (one token per sequence)\n");
  const std::string svg = ::attend::testing::ReadFile(path);
  for (const char* label :
       {"Llama 3 8B: prefill FLOPs against prompt length", "prompt (tokens)", "FLOPs (PFLOP)",
        "data-marker=\"crossover 61,035\"", "data-marker=\"prompt 8,192 (the maximum context)\"",
        "attention overtakes the weights at 61,035 tokens"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
  // Attention starts below the weights and ends above them (the plot runs past the crossover).
  const auto attention = SeriesPoints(svg, "prefill attention");
  const auto weights = SeriesPoints(svg, "prefill weights \\(2P per token\\)");
  ASSERT_EQ(attention.size(), weights.size());
  ASSERT_GE(attention.size(), 30u);
  EXPECT_GT(attention[1].second, weights[1].second);  // pixels: larger y is lower
  EXPECT_LT(attention.back().second, weights.back().second);
}

}  // namespace

// A hybrid imported from its published config.json: the state line, the breakdown of --layers
// (Jamba: 28 Mamba layers of 311,296 bytes = 304.00 KiB each, 4 attention layers of 4,096
// bytes per token), and a preset without attention that says so.
TEST_F(PlannerCliTest, PlanLayersShowsTheBreakdownAndTheState) {
  const std::string config = WriteTemp("planner_cli_jamba.json", planner::testing::kJamba);
  ASSERT_EQ(
      Run({"plan", "--config", config, "--context", "1000", "--kv_dtype", "bf16", "--layers"}),
      cli::kExitOk)
      << err_.str();
  ExpectAligned({"bytes per token  16.00 KiB (16,384 bytes)",
                 "state per sequence  8.31 MiB (8,716,288 bytes) in bfloat16",
                 "28: 0-3, 5-11, 13-19, 21-27, 29-31  state space  -  -  304.00 KiB  8.31 MiB",
                 "4: 4, 12, 20, 28  attention  8  4,096  -  15.62 MiB"});
  ASSERT_EQ(Run({"plan", "mamba2-7b", "--context", "4096", "--kv_dtype", "bf16"}), cli::kExitOk)
      << err_.str();
  ExpectAligned({"64 layers, no attention", "state per sequence  131.75 MiB"});
  // Only state: no context limit, for the batch or for one sequence (not the planner's cap).
  ASSERT_EQ(Run({"plan", "mamba2-7b", "--context", "4096", "--batch", "8", "--budget", "4GiB"}),
            cli::kExitOk)
      << err_.str();
  ExpectAligned({"longest context, 8 sequences  unbounded (no layer grows with the context)",
                 "longest context, one sequence  unbounded (no layer grows with the context)"});
  // Without --layers there is no breakdown.
  ASSERT_EQ(Run({"plan", "--config", config, "--context", "1000"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str().find("per layer ("), std::string::npos) << out_.str();
}

// The 2025-26 layer kinds in the per-layer breakdown (docs/planner.md): DeepSeek-V3.2's latent
// layers carry a 132-byte indexer key (61 x 132 = 8,052 bytes per token; 61 x 128 x 2 = 15,616
// in bf16 with --indexer_dtype kv), MiniMax-M1 has lightning layers, Kimi Linear KDA layers.
TEST_F(PlannerCliTest, PlanShowsTheNewLayerKinds) {
  ASSERT_EQ(Run({"plan", "deepseek-v3.2", "--context", "4096", "--kv_dtype", "bf16", "--layers"}),
            cli::kExitOk)
      << err_.str();
  ExpectOut({"latent 512 + 64, indexer 128", "sparse-attention indexer",
             "7.86 KiB (8,052 bytes) per token, fp8 + float32 scale per 128 values"});
  ASSERT_EQ(Run({"plan", "deepseek-v3.2", "--context", "4096", "--kv_dtype", "bf16",
                 "--indexer_dtype", "kv"}),
            cli::kExitOk)
      << err_.str();
  ExpectOut({"15.25 KiB (15,616 bytes) per token, bfloat16"});
  ASSERT_EQ(Run({"plan", "minimax-m1", "--context", "4096", "--layers"}), cli::kExitOk)
      << err_.str();
  ExpectOut({"70: ", "lightning attention"});
  ASSERT_EQ(Run({"plan", "kimi-linear-48b", "--context", "4096", "--layers"}), cli::kExitOk)
      << err_.str();
  ExpectOut({"kimi delta attention", "latent 512 + 64"});
}

// Breaker finding 11: --indexer_dtype's errors name --indexer_dtype, and an empty value is a
// usage error (it was read as float16).
TEST_F(PlannerCliTest, IndexerDtypeErrorsNameTheFlag) {
  EXPECT_EQ(Run({"plan", "deepseek-v3.2", "--indexer_dtype", "nope"}), cli::kExitUsage);
  EXPECT_NE(err_.str().find("--indexer_dtype: 'nope' is not"), std::string::npos) << err_.str();
  EXPECT_EQ(err_.str().find("--kv_dtype"), std::string::npos) << err_.str();
  EXPECT_EQ(Run({"plan", "deepseek-v3.2", "--kv_dtype", "fp8", "--indexer_dtype", ""}),
            cli::kExitUsage);
  EXPECT_NE(err_.str().find("--indexer_dtype"), std::string::npos) << err_.str();
}

// Breaker finding 17: --indexer_dtype on a model without an indexer says that it changes nothing.
TEST_F(PlannerCliTest, IndexerDtypeOnAModelWithoutAnIndexerSaysSo) {
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--context", "4096", "--indexer_dtype", "f32"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_NE(err_.str().find("no sparse-attention indexer"), std::string::npos) << err_.str();
  ASSERT_EQ(Run({"plan", "deepseek-v3.2", "--context", "4096", "--indexer_dtype", "f32"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_EQ(err_.str().find("no sparse-attention indexer"), std::string::npos) << err_.str();
}

}  // namespace attend
