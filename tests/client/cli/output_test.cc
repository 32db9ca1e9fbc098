// The CLI's output conventions: one flag vocabulary (bench's --n_head), -o table|json|wide and
// --no-headers, tables that fit $COLUMNS, and health --json.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/cli.h"
#include "client/cli/framework/command.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ::attend::testing::ScopedColumns;

class OutputTest : public ::attend::testing::CliServerSuite {};

TEST_F(OutputTest, BenchTakesNHeadWithHeadsAsAnAlias) {
  ASSERT_EQ(Run({"bench", "--n_head", "4", "--n_head_kv", "2", "--n_kv", "8", "--head_dim", "4",
                 "--requests", "2", "--warmup", "0", "--json"}),
            cli::kExitOk)
      << err_.str();
  const std::string with_n_head = out_.str();
  EXPECT_THAT(with_n_head, HasSubstr("k/v [8, 2, 4]"));
  ASSERT_EQ(Run({"bench", "--heads", "4", "--heads_kv", "2", "--n_kv", "8", "--head_dim", "4",
                 "--requests", "2", "--warmup", "0", "--json"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("k/v [8, 2, 4]"));
  EXPECT_EQ(Run({"bench", "--n_head", "4", "--heads", "4"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: give --n_head or its alias --heads, not both\n");
  EXPECT_EQ(Run({"bench", "--heads", "0"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--heads"));
  ASSERT_EQ(Run({"bench", "--help"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("--n_head=<value>"));
  EXPECT_THAT(out_.str(), HasSubstr("alias of --n_head\n"));
  EXPECT_THAT(out_.str(), HasSubstr("alias of --n_head_kv\n"));
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

size_t Widest(const std::string& text) {
  size_t widest = 0;
  for (const std::string& line : Lines(text)) widest = std::max(widest, line.size());
  return widest;
}

TEST_F(OutputTest, DashOJsonIsJson) {
  ScopedColumns columns(std::nullopt);
  ASSERT_EQ(Run({"--json", "models"}), cli::kExitOk) << err_.str();
  const std::string json = out_.str();
  ASSERT_EQ(Run({"-o", "json", "models"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), json);
  ASSERT_EQ(Run({"models", "-o=json"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), json);
  ASSERT_EQ(Run({"models", "--output", "json"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), json);
  ASSERT_EQ(Run({"-o", "table", "models"}), cli::kExitOk) << err_.str();
  const std::string table = out_.str();
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), table);
}

TEST_F(OutputTest, DashOWithAnotherValueIsAUsageError) {
  EXPECT_EQ(Run({"-o", "yaml", "models"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("usage error: -o/--output: 'yaml'; use table, json or wide\n"));
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(Run({"models", "-o"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: --output needs a value\n");
  EXPECT_EQ(Run({"--json", "-o", "wide", "models"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("usage error: --json contradicts -o wide; give one\n"));
  EXPECT_EQ(Run({"models", "-x"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unknown flag -x"));
}

TEST_F(OutputTest, ModelsFitColumnsAndSayWhatIsHidden) {
  ScopedColumns columns("80");
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  const std::string narrow = out_.str();
  const std::vector<std::string> lines = Lines(narrow);
  ASSERT_GE(lines.size(), 3u);
  // The name column is as wide as the longest preset name, kimi-linear-48b's 15 characters.
  EXPECT_EQ(lines[0], "name             layers  heads  kv heads                params  max context")
      << narrow;
  EXPECT_EQ(lines[7],
            "mixtral-8x7b         32     32         8  46.7B (12.9B active)       32,768");
  EXPECT_EQ(lines[lines.size() - 2],
            "(source, window, head dim hidden to fit 80 columns; -o wide shows them)");
  for (const std::string& line : lines) {
    if (line.rfind("'attend model", 0) != 0) {
      EXPECT_LE(line.size(), 80u) << line;
    }
  }
  EXPECT_EQ(err_.str(), "");

  ASSERT_EQ(Run({"-o", "wide", "models"}), cli::kExitOk) << err_.str();
  const std::string wide = out_.str();
  EXPECT_THAT(Lines(wide)[0], HasSubstr("source"));
  EXPECT_THAT(wide, Not(HasSubstr("hidden to fit")));
  EXPECT_GT(Widest(wide), 120u);

  ScopedColumns wider("400");
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), wide);
}

TEST_F(OutputTest, PipedWithoutColumnsPrintsEveryColumn) {
  ScopedColumns columns(std::nullopt);
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  const std::string piped = out_.str();
  ASSERT_EQ(Run({"models", "-o", "wide"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(piped, out_.str());
  ScopedColumns garbage("wide");  // not a number: as if unset
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), piped);
}

TEST_F(OutputTest, NoHeadersKeepsOnlyTheRows) {
  ScopedColumns columns(std::nullopt);
  ASSERT_EQ(Run({"models"}), cli::kExitOk) << err_.str();
  const std::vector<std::string> with = Lines(out_.str());
  ASSERT_EQ(Run({"models", "--no-headers"}), cli::kExitOk) << err_.str();
  const std::vector<std::string> without = Lines(out_.str());
  // No header line and no hint below; the rows as before (the header set no column's width).
  ASSERT_EQ(without.size(), with.size() - 2) << out_.str();
  EXPECT_EQ(without[0].substr(0, 11), with[1].substr(0, 11));
  EXPECT_THAT(out_.str(), Not(HasSubstr("name ")));
  ScopedColumns narrow("80");
  ASSERT_EQ(Run({"models", "--no-headers"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), Not(HasSubstr("hidden")));
  // Without the header line the columns are narrower: head dim stays (with the header it goes
  // too); Llama 4 Scout's 10,485,760-token context is what pushes window out.
  EXPECT_EQ(err_.str(), "(source, window hidden to fit 80 columns; -o wide shows them)\n");
  ASSERT_EQ(Run({"health", "--no-headers"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Lines(out_.str())[0], "(server)             SERVING");
  // The plan's variants: rows only, not the note marking the model's own.
  ASSERT_EQ(Run({"plan", "llama-3-8b", "--no-headers"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), Not(HasSubstr("the model's own")));
  EXPECT_THAT(out_.str(), HasSubstr("grouped-query (GQA) *"));
}

TEST_F(OutputTest, CostFitsColumns) {
  ScopedColumns columns(std::nullopt);
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "1024"}), cli::kExitOk) << err_.str();
  const std::string wide = out_.str();
  EXPECT_THAT(wide, HasSubstr("$/Mtok"));
  ScopedColumns narrow("80");
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "1024"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(
      out_.str(),
      HasSubstr("\n\n"
                "phase    attention FLOPs  weight FLOPs  bytes moved      time  bound    "
                "tokens/s\n"
                "prefill      275.1 GFLOP    16.4 TFLOP      16.2 GB  16.90 ms  compute    "
                "60,597\n"
                "decode       536.9 MFLOP    16.1 GFLOP      16.2 GB   4.83 ms  memory        "
                "207\n"
                "($/Mtok, FLOP/byte hidden to fit 80 columns; -o wide shows them)\n"
                "prefill: "))
      << out_.str();
  ASSERT_EQ(Run({"cost", "llama-3-8b", "--prompt", "1024", "-o", "wide"}), cli::kExitOk)
      << err_.str();
  EXPECT_EQ(out_.str(), wide);
}

// The lines of `text` from the one starting with `first` to the one before `end` (or to the end).
std::vector<std::string> Section(const std::string& text, const std::string& first,
                                 const std::string& end) {
  std::vector<std::string> section;
  for (const std::string& line : Lines(text)) {
    if (section.empty() && line.rfind(first, 0) != 0) continue;
    if (!end.empty() && line.rfind(end, 0) == 0) break;
    section.push_back(line);
  }
  return section;
}

TEST_F(OutputTest, PlanVariantsFitColumns) {
  ScopedColumns columns("60");
  ASSERT_EQ(Run({"plan", "tiny", "--context", "4096", "--batch", "2"}), cli::kExitOk) << err_.str();
  const std::vector<std::string> table = Section(out_.str(), "variant", "* the model");
  ASSERT_GE(table.size(), 5u) << out_.str();
  EXPECT_EQ(table[0], "variant                kv heads  GiB at 4096 tokens  GiB x 2");
  EXPECT_EQ(table.back(), "(group, KiB/token hidden to fit 60 columns; -o wide shows them)");
  for (const std::string& line : table) {
    if (line[0] != '(') {  // the note is prose
      EXPECT_LE(line.size(), 60u) << line;
    }
  }
  ASSERT_EQ(Run({"plan", "tiny", "--context", "4096", "--batch", "2", "-o", "wide"}), cli::kExitOk);
  EXPECT_EQ(Section(out_.str(), "variant", "")[0],
            "variant                kv heads  group  KiB/token  GiB at 4096 tokens  GiB x 2");
  EXPECT_THAT(out_.str(), Not(HasSubstr("hidden")));
}

TEST_F(OutputTest, SeqListAndStatsFitColumns) {
  ASSERT_EQ(Run({"seq", "create", "--id", "fit-columns-source"}), cli::kExitOk) << err_.str();
  ASSERT_EQ(Run({"seq", "append", "--id", "fit-columns-source", "--n", "3"}), cli::kExitOk);
  ASSERT_EQ(Run({"seq", "fork", "--id", "fit-columns-source", "--new_id", "fit-columns-fork"}),
            cli::kExitOk)
      << err_.str();
  ScopedColumns columns("60");
  ASSERT_EQ(Run({"seq", "list"}), cli::kExitOk) << err_.str();
  const std::vector<std::string> table = Section(out_.str(), "id", "");
  ASSERT_GE(table.size(), 4u) << out_.str();
  EXPECT_THAT(table[0], Not(HasSubstr("forked from")));
  EXPECT_THAT(out_.str(), HasSubstr("hidden to fit 60 columns; -o wide shows them)\n"));
  for (const std::string& line : table) {
    // The note and the summary below are prose.
    if (line[0] != '(' && line.find("referenced") == std::string::npos) {
      EXPECT_LE(line.size(), 60u) << line;
    }
  }
  // --no-headers: the rows, not the summary below them.
  ASSERT_EQ(Run({"seq", "list", "--no-headers"}), cli::kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("fit-columns-source"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("referenced")));
  ASSERT_EQ(Run({"seq", "list", "-o", "wide"}), cli::kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("forked from"));
  EXPECT_THAT(out_.str(), HasSubstr("fit-columns-source"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("hidden")));

  ASSERT_EQ(Run({"seq", "stats"}), cli::kExitOk) << err_.str();
  const std::string narrow = out_.str();
  for (const std::string& line : Lines(narrow)) EXPECT_LE(line.size(), 60u) << line;
  ASSERT_EQ(Run({"seq", "stats", "-o", "wide"}), cli::kExitOk);
  EXPECT_GT(Widest(out_.str()), 60u) << out_.str();
  // The same words, only the lines broken differently.
  std::vector<std::string> narrow_words =
      absl::StrSplit(narrow, absl::ByAnyChar(" \n"), absl::SkipEmpty());
  std::vector<std::string> wide_words =
      absl::StrSplit(out_.str(), absl::ByAnyChar(" \n"), absl::SkipEmpty());
  EXPECT_EQ(narrow_words, wide_words);
}

TEST_F(OutputTest, HealthJsonNamesTheServer) {
  ASSERT_EQ(Run({"--json", "health"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "{\"server\": \"SERVING\", \"attend.v1.Attention\": \"SERVING\", "
            "\"attend.v1.KvCache\": \"SERVING\", \"attend.v1.Planner\": \"SERVING\"}\n");
  ASSERT_EQ(Run({"-o", "json", "health", "--service", ""}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "{\"server\": \"SERVING\"}\n");
  EXPECT_EQ(Run({"-o", "json", "health", "--service", "no.such.Service"}), cli::kExitNotServing);
  EXPECT_EQ(out_.str(), "{\"no.such.Service\": \"SERVICE_UNKNOWN\"}\n");
}

}  // namespace
}  // namespace attend
