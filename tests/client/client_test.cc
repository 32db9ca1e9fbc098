// The client library's building blocks: tensors on the wire, .npy files, argument parsing.
#include <cmath>
#include <cstring>
#include <sstream>

#include "CLI/CLI.hpp"
#include "client/cli/framework/args.h"
#include "client/cli/render/format.h"
#include "client/npy.h"
#include "client/tensor.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;
using client::FloatTensor;
using client::Wire;

TEST(CliFormat, CountsBytesAndFieldsAsTheCommandsPrintThem) {
  EXPECT_EQ(cli::Count(0), "0");
  EXPECT_EQ(cli::Count(4194304), "4,194,304");
  EXPECT_EQ(cli::Count(-1500), "-1,500");
  EXPECT_EQ(cli::Count(INT64_MIN), "-9,223,372,036,854,775,808");
  EXPECT_EQ(cli::Plural(1, "token", "tokens"), "1 token");
  EXPECT_EQ(cli::Plural(4096, "token", "tokens"), "4,096 tokens");
  EXPECT_EQ(cli::BinaryBytes(100), "100 bytes");
  EXPECT_EQ(cli::BinaryBytes(1023), "1023 bytes");
  EXPECT_EQ(cli::BinaryBytes(1024), "1.00 KiB");
  EXPECT_EQ(cli::BinaryBytes(int64_t{80} << 30), "80.00 GiB");
  EXPECT_EQ(cli::BinaryBytes(-(int64_t{3} << 19)), "-1.50 MiB");
  cli::Fields f;
  f.Add("a", "1");
  f.Add("longer", "2");
  EXPECT_EQ(f.Render("  "), "  a       1\n  longer  2\n");
}

TEST(CliFormat, StatsShowComputeRateAndQueue) {
  v1::ComputeStats stats;
  stats.set_engine("onednn/f32");
  stats.set_attended_pairs(6);
  stats.set_attention_flops(192);
  stats.set_compute_seconds(2e-6);
  stats.set_queue_seconds(5e-6);
  std::ostringstream out;
  cli::PrintStats(out, stats);
  EXPECT_EQ(
      out.str(),
      "engine onednn/f32: 6 attended pairs, 192 FLOP in 2.0 us (96 MFLOP/s); queued 5.0 us\n");
}

TEST(ClientTensor, RoundTripsEveryWire) {
  const FloatTensor t{{2, 3}, {1.0f, -2.5f, 0.125f, 3.0f, 1e-3f, -7.0f}};
  for (Wire wire : {Wire::kFloat32, Wire::kBFloat16, Wire::kFloat16, Wire::kValues}) {
    v1::Tensor proto;
    client::EncodeTensor(t, wire, &proto);
    auto back = client::DecodeTensor(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->shape, t.shape);
    const double tolerance = wire == Wire::kBFloat16 ? 0.01 : (wire == Wire::kFloat16 ? 1e-3 : 0.0);
    for (size_t i = 0; i < t.values.size(); ++i) {
      EXPECT_NEAR(back->values[i], t.values[i], tolerance * std::abs(t.values[i]) + 1e-7);
    }
  }
}

TEST(ClientTensor, DecodeRejectsPayloadThatDisagreesWithShape) {
  v1::Tensor proto;
  proto.add_shape(3);
  proto.set_data(std::string(8, '\0'));
  EXPECT_THAT(client::DecodeTensor(proto),
              StatusIs(absl::StatusCode::kInvalidArgument, {"8 bytes", "3 elements"}));
}

TEST(ClientTensor, ParsesWireNames) {
  EXPECT_EQ(*client::ParseWire("bf16"), Wire::kBFloat16);
  EXPECT_EQ(*client::ParseWire("float16"), Wire::kFloat16);
  EXPECT_THAT(client::ParseWire("int8"), StatusIs(absl::StatusCode::kInvalidArgument, {"int8"}));
}

TEST(Npy, RoundTripsAndAlignsTheHeader) {
  const FloatTensor t{{2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  const std::string bytes = client::SerializeNpy(t);
  EXPECT_EQ(bytes.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_EQ((bytes.size() - 12 * 4) % 64, 0u);  // data starts on a 64-byte boundary
  EXPECT_NE(bytes.find("'shape': (2, 2, 3)"), std::string::npos);
  auto back = client::ParseNpy(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_EQ(back->values, t.values);
  // One-dimensional shapes carry the tuple comma.
  EXPECT_NE(client::SerializeNpy({{3}, {1, 2, 3}}).find("(3,)"), std::string::npos);
}

std::string NpyWithHeader(const std::string& dict, size_t data_bytes) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Npy, ReadsFloat64AndFloat16) {
  std::string f8 = NpyWithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 0);
  const double values[2] = {1.5, -0.25};
  f8.append(reinterpret_cast<const char*>(values), sizeof(values));
  auto t = client::ParseNpy(f8);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->values, (std::vector<float>{1.5f, -0.25f}));
  std::string f2 = NpyWithHeader("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 1), }", 0);
  f2 += std::string("\x00\x3c", 2);  // 1.0 in binary16
  auto h = client::ParseNpy(f2);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->values, (std::vector<float>{1.0f}));
}

TEST(Npy, RejectsMalformedFiles) {
  EXPECT_THAT(client::ParseNpy("hello"), StatusIs(absl::StatusCode::kInvalidArgument, {"magic"}));
  EXPECT_THAT(client::ParseNpy(
                  NpyWithHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"Fortran"}));
  EXPECT_THAT(client::ParseNpy(
                  NpyWithHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8)),
              StatusIs(absl::StatusCode::kInvalidArgument, {">f4"}));
  EXPECT_THAT(client::ParseNpy(
                  NpyWithHeader("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 16)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"<i8"}));
  EXPECT_THAT(client::ParseNpy(
                  NpyWithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8)),
              StatusIs(absl::StatusCode::kInvalidArgument, {"needs 12 bytes", "has 8"}));
  EXPECT_THAT(
      client::ParseNpy(NpyWithHeader(
          "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 8)),
      StatusIs(absl::StatusCode::kInvalidArgument, {"larger than the file"}));
  std::string truncated = client::SerializeNpy({{4}, {1, 2, 3, 4}});
  truncated.resize(20);
  EXPECT_THAT(client::ParseNpy(truncated),
              StatusIs(absl::StatusCode::kInvalidArgument, {"past the end"}));
}

// numpy writes each of the three keys once; a header that repeats one (numpy would read the
// last, a first-match reader the first) or adds others was not written by numpy.save.
TEST(Npy, RejectsHeadersWithRepeatedOrUnknownKeys) {
  const auto parse = [](const std::string& dict) {
    return client::ParseNpy(NpyWithHeader(dict, 8));
  };
  EXPECT_THAT(parse("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"'descr' appears twice"}));
  EXPECT_THAT(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'junk': 1}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"unexpected key 'junk'", "descr, fortran_order and shape"}));
  EXPECT_THAT(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 7}"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"npy header"}));
  EXPECT_THAT(parse("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "),
              StatusIs(absl::StatusCode::kInvalidArgument, {"not closed"}));
  EXPECT_THAT(parse("{'descr': '<f4', 'fortran_order': False, }"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"lacks 'shape'"}));
  // Keys inside values do not count, and double quotes are keys too.
  EXPECT_TRUE(parse("{\"descr\": '<f4', 'fortran_order': False, 'shape': (2,)}").ok());
}

// A command line for an app with one command, `run`, whose flags are bound by cli::Flags.
struct CliArgsTest : ::testing::Test {
  CliArgsTest() : root("t") {
    root.set_help_flag();  // as RunCli: --help is a flag of its own, before the subcommands
    run = root.add_subcommand("run");
    cli::Flags globals(&root);
    globals.Add("json", &json, "print JSON");
    cli::Flags flags(run);
    flags.Add("causal", &causal, "causal mask");
    flags.Add("n_q", &n_q, "queries").Range(1, 100);
    flags.Add("scale", &scale, "scale").Shown("1/sqrt(d)");
    flags.Add("name", &name, "a name").Values({"x", "y"});
  }
  absl::StatusOr<cli::ParsedCommandLine> Parse(const std::vector<std::string>& tokens) {
    return cli::ParseCommandLine(root, tokens);
  }
  CLI::App root;
  CLI::App* run;
  bool json = false;
  bool causal = false;
  int64_t n_q = 4;
  std::optional<double> scale;
  std::string name = "x";
};

TEST_F(CliArgsTest, ParsesFlagsValuesAndNegativeNumbers) {
  auto parsed = Parse({"--json", "run", "2", "--causal", "--n-q", "8", "-1.5", "--scale=0.25",
                       "-inf", "--name", "-"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->path.back(), run);
  EXPECT_TRUE(json);
  EXPECT_TRUE(causal);
  EXPECT_EQ(n_q, 8);
  EXPECT_EQ(scale, 0.25);
  EXPECT_EQ(name, "-");
  EXPECT_EQ(parsed->positional, (std::vector<std::string>{"2", "-1.5", "-inf"}));
  // Global flags may follow the command; integers are decimal, "010" too.
  ASSERT_TRUE(Parse({"run", "--json=false", "--n_q", "010"}).ok());
  EXPECT_FALSE(json);
  EXPECT_EQ(n_q, 10);
}

TEST_F(CliArgsTest, RejectsUnknownFlagsMissingValuesAndBadValues) {
  EXPECT_THAT(Parse({"run", "--bogus"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"unknown flag --bogus"}));
  EXPECT_THAT(Parse({"run", "--causl"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"did you mean --causal?"}));
  // One dash is --help and --output's short forms only: "-causal" and "-help" are typos.
  EXPECT_THAT(Parse({"run", "-causal"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"unknown flag -causal; did you mean --causal?"}));
  EXPECT_THAT(Parse({"run", "-json"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"unknown flag -json"}));
  EXPECT_THAT(Parse({"rn"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                      {"unknown command 'rn'; did you mean 'run'?"}));
  EXPECT_THAT(Parse({"run", "--n_q"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"--n_q needs a value"}));
  EXPECT_THAT(Parse({"run", "--causal=maybe"}),
              StatusIs(absl::StatusCode::kInvalidArgument, {"maybe"}));
  EXPECT_THAT(Parse({"run", "--n_q", "eight"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                         {"--n_q needs an integer, got 'eight'"}));
  EXPECT_THAT(Parse({"run", "--n_q", "0"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     {"--n_q must be between 1 and 100, got 0"}));
  EXPECT_THAT(
      Parse({"run", "--scale", "0x1"}),
      StatusIs(absl::StatusCode::kInvalidArgument, {"--scale needs a decimal number, got '0x1'"}));
}

TEST_F(CliArgsTest, HelpShowsEachFlagWithItsDefault) {
  EXPECT_EQ(cli::FlagsHelp(cli::FlagsOf(*run)),
            "  --causal                 causal mask\n"
            "  --n_q=<value>            queries (default: 4)\n"
            "  --scale=<value>          scale (default: 1/sqrt(d))\n"
            "  --name=<value>           a name (default: x)\n");
  EXPECT_EQ(cli::FlagsOf(*run)[3].values, (std::vector<std::string>{"x", "y"}));
}

TEST(CliFormat, AlignsNumbersRightAndTextLeft) {
  cli::Table table({"name", "value"});
  table.AddRow({"a", "1.5"});
  table.AddRow({"longer", "-10.25"});
  EXPECT_EQ(table.Render(), "name     value\na          1.5\nlonger  -10.25\n");
  EXPECT_EQ(cli::Si(1.3e9, "FLOP"), "1.3 GFLOP");
  EXPECT_EQ(cli::JsonNumbers(std::vector<float>{1.0f, NAN}), "[1, null]");
}

}  // namespace
}  // namespace attend
