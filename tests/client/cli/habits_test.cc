// The CLI's habits: -h and `attend help`, `attend version`, completion scripts, did-you-mean for
// commands and flags, hyphens in flag names, and stray arguments refused by every command.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/framework/args.h"
#include "client/cli/framework/command.h"
#include "common/version/version.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cli/cli_fixture.h"
#include "tests/server/server_fixture.h"

namespace attend {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class HabitsTest : public ::attend::testing::CliServerSuite {};

TEST_F(HabitsTest, DashHAndHelpPrintTheOverview) {
  ASSERT_EQ(Run({"--help"}), cli::kExitOk);
  const std::string overview = out_.str();
  EXPECT_THAT(overview, HasSubstr("commands:"));
  EXPECT_THAT(overview, HasSubstr("completion"));
  EXPECT_EQ(Run({"-h"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), overview);
  EXPECT_EQ(Run({"help"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), overview);
}

TEST_F(HabitsTest, HelpOfACommandAndASubcommand) {
  ASSERT_EQ(Run({"plan", "--help"}), cli::kExitOk);
  const std::string plan = out_.str();
  EXPECT_EQ(Run({"help", "plan"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), plan);
  EXPECT_EQ(Run({"plan", "-h"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), plan);
  ASSERT_EQ(Run({"seq", "create", "--help"}), cli::kExitOk);
  const std::string create = out_.str();
  EXPECT_THAT(create, HasSubstr("usage: attend seq create"));
  EXPECT_EQ(Run({"help", "seq", "create"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), create);
}

TEST_F(HabitsTest, HelpOfAnUnknownCommandIsAUsageErrorWithASuggestion) {
  EXPECT_EQ(Run({"help", "helth"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown command 'helth'; did you mean 'health'?\n");
  EXPECT_EQ(Run({"help", "seq", "craete"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown subcommand 'craete'; did you mean 'create'?\n");
  EXPECT_EQ(Run({"help", "health", "x"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: 'attend health' has no subcommands; unexpected 'x'\n");
  EXPECT_EQ(Run({"help", "seq", "create", "x"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unexpected 'x'"));
}

TEST_F(HabitsTest, VersionPrintsTheClientsAndTheServersLines) {
  const std::string target = absl::StrCat("127.0.0.1:", server_->port());
  ASSERT_EQ(Run({"version"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), absl::StrCat("client: ", VersionLine("attend"), "\nserver ", target, ": ",
                                     VersionLine("attend-server"), "\n"));
  EXPECT_EQ(err_.str(), "");
  ASSERT_EQ(Run({"version", "--json"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            absl::StrCat("{\"client\": \"", VersionLine("attend"),
                         "\", \"server\": {\"target\": \"", target, "\", \"version\": \"",
                         VersionLine("attend-server"), "\", \"error\": null}}\n"));
  // --version stays the client's line alone, without a call.
  ASSERT_EQ(Run({"--version"}), cli::kExitOk);
  EXPECT_EQ(out_.str(), VersionLine("attend") + "\n");
  EXPECT_EQ(Run({"version", "x"}), cli::kExitUsage);
}

// A target gRPC would misread (a port past 65535 wraps around to another port; an empty one
// fails as a "secure channel" error) is a usage error naming it.
TEST_F(HabitsTest, TargetsThatCannotBeDialledAreUsageErrors) {
  for (const char* target : {"127.0.0.1:118947", "127.0.0.1:65536", "", "localhost:-1"}) {
    std::ostringstream out, err;
    EXPECT_EQ(cli::RunCli({"--target", target, "health"}, out, err), cli::kExitUsage) << target;
    EXPECT_NE(err.str().find("--target"), std::string::npos) << target << ": " << err.str();
  }
  for (const char* target : {"127.0.0.1:1", "[::1]:1", "unix:///tmp/no-such-socket"}) {
    std::ostringstream out, err;
    EXPECT_NE(cli::RunCli({"--target", target, "--deadline", "1", "health"}, out, err),
              cli::kExitUsage)
        << target << ": " << err.str();
  }
}

TEST_F(HabitsTest, VersionWithoutAServerSaysWhyAndExitsZero) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"--target", "127.0.0.1:1", "version"}, out, err), cli::kExitOk);
  EXPECT_THAT(out.str(), StartsWith(absl::StrCat("client: ", VersionLine("attend"),
                                                 "\nserver 127.0.0.1:1: not reachable (")));
  EXPECT_THAT(out.str(), HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(err.str(), "");
}

// Writes `text` to a temporary file and returns `<shell> -n` of it's exit status.
int SyntaxCheck(const std::string& shell, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/attend_completion." + shell;
  std::ofstream(path) << text;
  return std::system((shell + " -n " + path).c_str());
}

TEST_F(HabitsTest, BashCompletionParsesAndNamesCommandsSubcommandsAndFlags) {
  ASSERT_EQ(Run({"completion", "bash"}), cli::kExitOk) << err_.str();
  const std::string script = out_.str();
  EXPECT_EQ(SyntaxCheck("bash", script), 0) << script;
  EXPECT_THAT(script, HasSubstr("complete -o default -F _attend attend"));
  for (const char* command :
       {"health", "softmax", "attend", "mha", "scaling", "models", "model", "plan", "cost", "seq",
        "bench", "example", "help", "version", "completion"}) {
    EXPECT_THAT(script, HasSubstr(absl::StrCat("    ", command, ")"))) << command;
  }
  for (const char* words : {"create append", "--n_head_kv", "--weights", "--service", "--target",
                            "--kv_dtype", "--budget", "bash zsh"}) {
    EXPECT_THAT(script, HasSubstr(words)) << words;
  }
}

// What the bash script offers for the last of `words` (the word being completed, maybe ""):
// its _attend run by bash on COMP_WORDS, sorted, one line.
std::string BashOffers(const std::string& script, const std::vector<std::string>& words) {
  const std::string stem = ::testing::TempDir() + "/attend_completion_run";
  std::ofstream(stem + ".bash") << script;
  std::string quoted;
  for (const std::string& w : words) absl::StrAppend(&quoted, " '", w, "'");
  std::ofstream(stem + ".sh")
      << "source " << stem << ".bash\nCOMP_WORDS=(attend" << quoted
      << ")\nCOMP_CWORD=" << words.size()
      << "\n_attend\nprintf '%s\\n' \"${COMPREPLY[@]}\" | sort | tr '\\n' ' '\n";
  FILE* pipe = popen(absl::StrCat("bash ", stem, ".sh").c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t got;
  while (pipe != nullptr && (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    out.append(buffer, got);
  }
  if (pipe != nullptr) pclose(pipe);
  return out;
}

TEST_F(HabitsTest, BashCompletionOffersFlagValuesAndExampleNames) {
  ASSERT_EQ(Run({"completion", "bash"}), cli::kExitOk) << err_.str();
  const std::string script = out_.str();
  EXPECT_EQ(BashOffers(script, {"-o", ""}), "json table wide ");
  EXPECT_EQ(BashOffers(script, {"--output", "w"}), "wide ");
  EXPECT_EQ(BashOffers(script, {"attend", "--example", ""}), "causal it ");
  EXPECT_EQ(BashOffers(script, {"attend", "--heatmap_scale", ""}), "auto fixed ");
  EXPECT_THAT(BashOffers(script, {"example", "f"}), HasSubstr("full-attention "));
  EXPECT_THAT(BashOffers(script, {"example", "l"}), HasSubstr("list "));
  // -o's value is not taken for the command: after it come the commands.
  EXPECT_THAT(BashOffers(script, {"-o", "json", "pl"}), HasSubstr("plan "));
}

TEST_F(HabitsTest, ZshCompletionNamesTheCommands) {
  ASSERT_EQ(Run({"completion", "zsh"}), cli::kExitOk) << err_.str();
  const std::string script = out_.str();
  EXPECT_THAT(script, StartsWith("#compdef attend\n"));
  if (std::system("command -v zsh >/dev/null 2>&1") == 0) {
    EXPECT_EQ(SyntaxCheck("zsh", script), 0) << script;
  }
  for (const char* command : {"health", "softmax", "plan", "seq", "bench", "example", "help"}) {
    EXPECT_THAT(script, HasSubstr(absl::StrCat("    ", command, ")"))) << command;
  }
  EXPECT_THAT(script, HasSubstr("--weights"));
}

TEST_F(HabitsTest, CompletionNeedsAShell) {
  EXPECT_EQ(Run({"completion"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: give a shell: attend completion bash|zsh\n");
  EXPECT_EQ(Run({"completion", "fish"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: give a shell: attend completion bash|zsh; got 'fish'\n");
}

TEST_F(HabitsTest, UnknownCommandsAndFlagsSuggestTheCloseOne) {
  EXPECT_EQ(Run({"helth"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(),
              StartsWith("usage error: unknown command 'helth'; did you mean 'health'?\n"));
  EXPECT_EQ(Run({"pla"}), cli::kExitUsage);  // a unique prefix
  EXPECT_THAT(err_.str(), HasSubstr("did you mean 'plan'?"));
  EXPECT_EQ(Run({"xyzzy"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("usage error: unknown command 'xyzzy'\n"));
  EXPECT_EQ(Run({"attend", "--weight"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag --weight; did you mean --weights?\n");
  EXPECT_EQ(Run({"attend", "--bogus"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag --bogus\n");
}

// Before the command only global flags go: a command's flag there is named as the command's (it
// cannot tell whether the next word is its value or the command), a mistyped global flag gets its
// suggestion, and neither's value is taken for the command.
TEST_F(HabitsTest, CommandFlagsBeforeTheCommandSaySo) {
  EXPECT_EQ(Run({"--n_q", "4", "attend"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: --n_q is a flag of 'attend attend' (and 'attend bench'); put it after "
            "the command\n");
  EXPECT_EQ(Run({"--n-q=4", "attend"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("usage error: --n-q is a flag of 'attend attend'"));
  EXPECT_EQ(Run({"--weights", "attend"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: --weights is a flag of 'attend attend' (and 'attend mha', 'attend seq "
            "append'); put it after the command\n");
  EXPECT_EQ(Run({"--new_id", "b", "seq", "fork"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: --new_id is a flag of 'attend seq fork'; put it after the command\n");
  EXPECT_EQ(Run({"--id", "x", "seq", "get"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("usage error: --id is a flag of 'attend seq create' (and "));
  EXPECT_THAT(err_.str(), HasSubstr(" more); put it after the command\n"));
  EXPECT_EQ(Run({"--outptu", "json", "health"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag --outptu; did you mean --output?\n");
  EXPECT_EQ(Run({"-x", "4", "health"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag -x\n");
  // Global flags still go before or after the command, and a group's flags before its
  // subcommand.
  EXPECT_EQ(Run({"-o", "json", "health"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Run({"health", "-o", "json"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Run({"seq", "--id", "nobody", "get"}), cli::kExitServerError) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
}

// Subcommands and example names get the suggestion commands get; with none close, the choices.
TEST_F(HabitsTest, MistypedSubcommandsAndExamplesSuggestTheCloseOne) {
  EXPECT_EQ(Run({"seq", "crate"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown subcommand 'crate'; did you mean 'create'?\n");
  EXPECT_EQ(Run({"seq", "zzzzzz"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(),
              StartsWith("usage error: unknown subcommand 'zzzzzz'; use one of create, append, "));
  EXPECT_EQ(Run({"example", "caus"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: 'caus' is not an example; did you mean 'causal'?\n");
  EXPECT_EQ(Run({"example", "lst"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: 'lst' is not an example; did you mean 'list'?\n");
  EXPECT_EQ(Run({"example", "zzzzzz"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(),
              StartsWith("usage error: 'zzzzzz' is not an example; one of: list, it, softmax, "));
  // `attend attend --example`'s worked examples too.
  EXPECT_EQ(Run({"attend", "--example", "caus"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: --example: 'caus' is not an example; did you mean 'causal'?\n");
  EXPECT_EQ(Run({"attend", "--example=itt"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: --example: 'itt' is not an example; did you mean 'it'?\n");
  EXPECT_EQ(Run({"attend", "--example", "zzzzzz"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: --example: 'zzzzzz' is not an example; use it or causal\n");
}

// --max_message_bytes takes the units of the server's size flags (common/byte_size.h), from the
// command line and from ATTEND_MAX_MESSAGE_BYTES.
TEST_F(HabitsTest, MaxMessageBytesTakesUnits) {
  EXPECT_EQ(Run({"--max_message_bytes", "1MiB", "health"}), cli::kExitOk) << err_.str();
  // 1 kB is too small for the answer: the limit was read as 1,000 bytes.
  EXPECT_EQ(Run({"--max_message_bytes", "1kB", "models"}), cli::kExitServerError) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_EQ(Run({"--max_message_bytes", "1M", "health"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: --max_message_bytes: '1M' has an ambiguous unit (binary GiB or decimal "
            "GB?); write a byte count such as 80GiB (2^30), 80GB (10^9), 512MiB or 1e9\n");
  setenv("ATTEND_MAX_MESSAGE_BYTES", "1 KiB", 1);
  EXPECT_EQ(Run({"models"}), cli::kExitServerError) << err_.str();
  setenv("ATTEND_MAX_MESSAGE_BYTES", "x", 1);
  EXPECT_EQ(Run({"health"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("usage error: ATTEND_MAX_MESSAGE_BYTES: 'x' is not a size"));
  unsetenv("ATTEND_MAX_MESSAGE_BYTES");
}

TEST_F(HabitsTest, DidYouMean) {
  EXPECT_EQ(cli::DidYouMean("helth", {"health", "help"}), "health");
  EXPECT_EQ(cli::DidYouMean("he", {"health", "help"}), "");  // not unique
  EXPECT_EQ(cli::DidYouMean("heal", {"health", "help"}), "health");
  EXPECT_EQ(cli::DidYouMean("o", {"n", "out"}), "out");  // "n" is too far for one letter
  EXPECT_EQ(cli::DidYouMean("zzzzzz", {"health"}), "");
}

TEST_F(HabitsTest, HyphensInFlagNamesReadAsUnderscores) {
  ASSERT_EQ(Run({"attend", "--n-q", "4", "--n-head", "1", "--head-dim=4", "--causal"}),
            cli::kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("output [4, 1, 4]"));
  // Only in the name: the value keeps its hyphen.
  ASSERT_EQ(Run({"--json", "example", "matrix-form"}), cli::kExitOk) << err_.str();
  ASSERT_EQ(Run({"--max-message-bytes", "100000", "health"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Run({"attend", "--n-qq", "4"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag --n-qq; did you mean --n_q?\n");
}

TEST_F(HabitsTest, StrayArgumentsAreUsageErrors) {
  EXPECT_EQ(Run({"health", "foo"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(),
            "usage error: 'attend health' takes no arguments; unexpected 'foo' (attend help "
            "health)\n");
  EXPECT_EQ(Run({"scaling", "12"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'attend scaling' takes no arguments; unexpected '12'"));
  for (const char* command : {"attend", "mha", "bench"}) {
    EXPECT_EQ(Run({command, "x"}), cli::kExitUsage) << command;
    EXPECT_THAT(err_.str(), HasSubstr("unexpected 'x'")) << command;
  }
  for (const char* command : {"models", "model", "plan", "cost", "example"}) {
    EXPECT_EQ(Run({command, "llama-3-8b", "extra"}), cli::kExitUsage) << command;
    EXPECT_THAT(err_.str(), HasSubstr(absl::StrCat("'attend ", command,
                                                   "' takes at most 1 argument; unexpected "
                                                   "'extra'")))
        << command;
  }
  EXPECT_EQ(Run({"seq", "stats", "extra"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unexpected 'extra'"));
  // Those that take arguments still do.
  EXPECT_EQ(Run({"softmax", "2", "-1", "-inf", "-.5"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Run({"models", "llama-3-8b"}), cli::kExitOk) << err_.str();
  EXPECT_EQ(Run({"health"}), cli::kExitOk) << err_.str();
}

TEST_F(HabitsTest, SingleDashTokensThatAreNotNumbersAreUnknownFlags) {
  // -h and -o are the only one-dash flags (--help and --output).
  EXPECT_EQ(Run({"health", "-x", "json"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag -x\n");
  EXPECT_EQ(Run({"-x", "health"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag -x\n");
  EXPECT_EQ(Run({"attend", "-weights"}), cli::kExitUsage);
  EXPECT_EQ(err_.str(), "usage error: unknown flag -weights; did you mean --weights?\n");
  // After --, anything is an argument.
  EXPECT_EQ(Run({"softmax", "--", "-o"}), cli::kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("'-o' is not a decimal number"));
}

}  // namespace
}  // namespace attend
