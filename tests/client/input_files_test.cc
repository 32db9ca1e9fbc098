// Reading the files a user names: .npy inputs are bounded and checked header first, so that
// /dev/zero, a FIFO that never ends or a huge file that is not a .npy file fails at once with
// little memory. Reads that could run away run in a child process (child_run.h) with a deadline
// and an address-space cap, which also measures their peak memory.
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/connection.h"
#include "client/input_file.h"
#include "client/npy.h"
#include "tests/client/child_run.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::ChildRun;
using ::attend::testing::RunInChild;
using ::attend::testing::SanitizedRss;
using ::attend::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
// Enough for the test binary and a few MiB of reading; far below the 100 MiB files below.
constexpr int64_t kSmallRss = 40 * kMiB;
constexpr int64_t kChildAddressSpace = int64_t{1} << 30;
constexpr double kTimeoutSeconds = 20;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// The bytes of a version 1.0 .npy header (magic through the '\n' that ends the dict).
std::string NpyHeader(const std::string& dict) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header;
}

// Writes `bytes` to `path`, then extends the file with a hole to `size` bytes (no disk used).
void WriteSparse(const std::string& path, const std::string& bytes, int64_t size) {
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; }
  std::filesystem::resize_file(path, static_cast<uintmax_t>(size));
}

// ReadNpyFile(path) in a child: the status message, or "ok <number of values>".
ChildRun ReadInChild(const std::string& path) {
  return RunInChild(
      [&] {
        absl::StatusOr<client::FloatTensor> t = client::ReadNpyFile(path);
        return t.ok() ? absl::StrCat("ok ", t->values.size()) : std::string(t.status().message());
      },
      kTimeoutSeconds, kChildAddressSpace);
}

TEST(NpyFile, DevZeroFailsAtOnceOnTheMagic) {
  const ChildRun run = ReadInChild("/dev/zero");
  ASSERT_TRUE(run.finished) << "still reading /dev/zero after " << run.seconds << " s";
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.output, HasSubstr("/dev/zero: not a .npy file: it starts with"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
}

TEST(NpyFile, EndlessFifoFailsAtOnceOnTheMagic) {
  const std::string fifo = TempPath("input_files_test.fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const pid_t writer = ::attend::testing::StartEndlessWriter(fifo);
  const ChildRun run = ReadInChild(fifo);
  ::attend::testing::StopWriter(writer);
  ASSERT_TRUE(run.finished) << "still reading the FIFO after " << run.seconds << " s";
  EXPECT_THAT(run.output, HasSubstr("not a .npy file"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
}

// The case: 100 MiB without a header used to be read whole (213 MiB peak) before
// "not a .npy file".
TEST(NpyFile, HugeFileWithoutHeaderIsRefusedAfterItsFirstBytes) {
  const std::string path = TempPath("input_files_test_noheader.npy");
  WriteSparse(path, "PK\x03\x04 not numpy", 100 * kMiB);
  const ChildRun run = ReadInChild(path);
  ASSERT_TRUE(run.finished);
  EXPECT_THAT(run.output,
              HasSubstr("not a .npy file: it starts with \"PK\\x03\\x04 n\", not the magic"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss)) << "peak RSS while refusing a 100 MiB file";
  std::filesystem::remove(path);
}

// A header that asks for more values than a message can carry is refused before the body is
// read, even when the body is there.
TEST(NpyFile, ShapeOverTheLimitIsRefusedBeforeTheBody) {
  const std::string path = TempPath("input_files_test_bigshape.npy");
  const std::string header =
      NpyHeader("{'descr': '<f2', 'fortran_order': False, 'shape': (40000000,), }");
  WriteSparse(path, header, static_cast<int64_t>(header.size()) + 2 * 40000000);
  const ChildRun run = ReadInChild(path);
  ASSERT_TRUE(run.finished);
  EXPECT_THAT(run.output, HasSubstr("the shape (40000000,) holds 40000000 values"));
  EXPECT_THAT(run.output, HasSubstr("limited to 33554432 values"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
  std::filesystem::remove(path);
}

// Bytes after the data are refused after reading one of them, not the rest of the file.
TEST(NpyFile, TrailingBytesAreRefusedWithoutReadingThemAll) {
  const std::string path = TempPath("input_files_test_trailing.npy");
  std::string bytes =
      NpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }") + std::string(8, 0);
  WriteSparse(path, bytes, 100 * kMiB);
  const ChildRun run = ReadInChild(path);
  ASSERT_TRUE(run.finished);
  EXPECT_THAT(run.output, HasSubstr("more than the 8 bytes of data the shape (2,) needs"));
  EXPECT_LT(run.max_rss_bytes, SanitizedRss(kSmallRss));
  std::filesystem::remove(path);
}

TEST(NpyFile, TruncatedBodyAndHeaderPastTheEndAreNamed) {
  const std::string path = TempPath("input_files_test_truncated.npy");
  const std::string header =
      NpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << header << std::string(10, 0); }
  EXPECT_THAT(client::ReadNpyFile(path),
              ::attend::testing::StatusIs(
                  absl::StatusCode::kInvalidArgument,
                  {path, "truncated", "the shape (2, 3) needs 24 bytes of data", "has 10"}));
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << header.substr(0, 40); }
  EXPECT_THAT(client::ReadNpyFile(path),
              ::attend::testing::StatusIs(
                  absl::StatusCode::kInvalidArgument,
                  {path, "truncated", "header of 118 bytes", "the file ends after 40 bytes"}));
  std::filesystem::remove(path);
}

// --- limits given as parameters, on streams ------------------------------------------------------

absl::StatusOr<client::FloatTensor> ReadWithLimit(const std::string& bytes, int64_t max_values) {
  std::istringstream in(bytes);
  client::NpyLimits limits;
  limits.max_values = max_values;
  limits.reason = "the test's limit";
  return client::ReadNpy(in, "--q t.npy", limits);
}

TEST(NpyStream, ArraysUpToTheLimitLoad) {
  const client::FloatTensor t{{2, 3}, {1, 2, 3, 4, 5, 6}};
  absl::StatusOr<client::FloatTensor> read = ReadWithLimit(client::SerializeNpy(t), 6);
  ASSERT_OK(read);
  EXPECT_EQ(read->shape, t.shape);
  EXPECT_EQ(read->values, t.values);
  // float64 takes 8 bytes a value; the limit counts values, not bytes.
  std::string f8 = NpyHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }");
  const double values[6] = {1.5, -0.25, 3, 4, 5, 6};
  f8.append(reinterpret_cast<const char*>(values), sizeof(values));
  read = ReadWithLimit(f8, 6);
  ASSERT_OK(read);
  EXPECT_EQ(read->values, (std::vector<float>{1.5f, -0.25f, 3, 4, 5, 6}));
  // Arrays larger than a read chunk (1 MiB) arrive whole.
  client::FloatTensor big{{3, 100000}, std::vector<float>(300000)};
  for (size_t i = 0; i < big.values.size(); ++i) big.values[i] = static_cast<float>(i);
  read = ReadWithLimit(client::SerializeNpy(big), 300000);
  ASSERT_OK(read);
  EXPECT_EQ(read->values, big.values);
  // Zero values whatever the other dimensions say.
  read = ReadWithLimit(NpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (0, "
                                 "4611686018427387904, 4611686018427387904), }"),
                       6);
  ASSERT_OK(read);
  EXPECT_TRUE(read->values.empty());
}

// The header alone is there: the refusal comes from the shape, not from a missing body.
TEST(NpyStream, ShapeOverTheLimitIsRefusedFromTheHeaderAlone) {
  EXPECT_THAT(
      ReadWithLimit(NpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }"), 6),
      StatusIs(absl::StatusCode::kInvalidArgument,
               {"--q t.npy: the shape (7,) holds 7 values; a .npy input is limited to 6 "
                "values (the test's limit)"}));
  EXPECT_THAT(ReadWithLimit(NpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                      "(4611686018427387904, 4611686018427387904), }"),
                            6),
              StatusIs(absl::StatusCode::kInvalidArgument, {"holds more than 2^63 values"}));
}

TEST(NpyStream, HeaderLengthIsBoundedBeforeItIsRead) {
  std::string v2("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  EXPECT_THAT(
      ReadWithLimit(v2, 6),
      StatusIs(absl::StatusCode::kInvalidArgument,
               {"--q t.npy: npy: the header claims 4294967295 bytes, more than the 65535"}));
  EXPECT_THAT(ReadWithLimit(std::string("\x93NUMPY\x02\x00\x10", 9), 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"truncated .npy file: it ends after 9 bytes, inside the preamble"}));
}

TEST(NpyStream, TruncatedAndTrailingDataAreNamed) {
  const std::string bytes = client::SerializeNpy({{2}, {1, 2}});
  EXPECT_THAT(
      ReadWithLimit(bytes.substr(0, bytes.size() - 1), 6),
      StatusIs(absl::StatusCode::kInvalidArgument,
               {"truncated .npy file: the shape (2,) needs 8 bytes of data, the file has 7"}));
  EXPECT_THAT(ReadWithLimit(bytes + "x", 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"npy: the file holds more than the 8 bytes of data the shape (2,) needs"}));
}

TEST(NpyStream, NotNpyShowsWhatTheFileStartsWith) {
  EXPECT_THAT(ReadWithLimit("", 6), StatusIs(absl::StatusCode::kInvalidArgument,
                                             {"--q t.npy: not a .npy file: it is empty"}));
  EXPECT_THAT(ReadWithLimit("{}", 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"not a .npy file: it holds only 2 bytes (\"{}\"), fewer than the magic"}));
  EXPECT_THAT(ReadWithLimit("{\"q\": {\"shape\": [1]}}", 6),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"not a .npy file: it starts with \"{\\\"q\\\": \", not the magic "
                        "\"\\x93NUMPY\""}));
}

TEST(NpyFile, DefaultLimitIsTheDefaultMessageLimitAtTwoBytesAValue) {
  EXPECT_EQ(client::NpyLimits{}.max_values,
            client::MaxNpyValuesForMessage(client::ConnectionOptions{}.max_message_bytes));
  EXPECT_EQ(client::MaxNpyValuesForMessage(1), 1);
  EXPECT_EQ(client::MaxNpyValuesForMessage(1000), 500);
}

TEST(NpyFile, DirectoryIsNamed) {
  EXPECT_THAT(client::ReadNpyFile(::testing::TempDir()),
              StatusIs(absl::StatusCode::kFailedPrecondition, {"it is a directory"}));
}

// --- ReadAtMost ----------------------------------------------------------------------------------

TEST(ReadAtMost, ReadsUpToTheLimitAndSaysWhetherThereIsMore) {
  for (const auto& [text, limit, more] : {std::tuple{std::string(""), 4, false},
                                          {"abc", 4, false},
                                          {"abcd", 4, false},
                                          {"abcde", 4, true},
                                          {std::string(200000, 'x'), 200000, false},
                                          {std::string(200001, 'x'), 200000, true}}) {
    std::istringstream in(text);
    bool got_more = !more;
    absl::StatusOr<std::string> read = client::ReadAtMost(in, limit, &got_more, "t");
    ASSERT_OK(read);
    EXPECT_EQ(*read, text.substr(0, static_cast<size_t>(limit)));
    EXPECT_EQ(got_more, more) << text.size() << " bytes, limit " << limit;
  }
}

TEST(ReadAtMost, DevZeroStopsAtTheLimit) {
  std::ifstream in("/dev/zero", std::ios::binary);
  ASSERT_TRUE(in);
  bool more = false;
  absl::StatusOr<std::string> read = client::ReadAtMost(in, 100000, &more, "/dev/zero");
  ASSERT_OK(read);
  EXPECT_EQ(read->size(), 100000u);
  EXPECT_TRUE(more);
}

}  // namespace
}  // namespace attend
