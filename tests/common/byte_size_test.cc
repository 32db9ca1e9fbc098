#include "common/byte_size.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

TEST(ParseByteSize, UnitsAndErrors) {
  const struct {
    const char* text;
    int64_t bytes;
  } ok[] = {{"0", 0},
            {"4096", 4096},
            {"1e9", 1'000'000'000},
            {"1.5e3", 1500},
            {"80GiB", int64_t{80} << 30},
            {"80gib", int64_t{80} << 30},
            {"80 GiB", int64_t{80} << 30},
            {"80GB", 80'000'000'000},
            {"80Gb", 80'000'000'000},
            {"512MiB", int64_t{512} << 20},
            {"1KiB", 1024},
            {"1kB", 1000},
            {"3TB", 3'000'000'000'000},
            {"1PiB", int64_t{1} << 50},
            {"100B", 100},
            {" 7 MB ", 7'000'000},
            {"0.5KiB", 512}};
  for (const auto& c : ok) {
    absl::StatusOr<int64_t> v = ParseByteSize(c.text, "--budget");
    ASSERT_OK(v) << c.text;
    EXPECT_EQ(*v, c.bytes) << c.text;
  }
  for (const char* bad : {"", "GiB", "abc", "-1GiB", "80G", "80XB", "1e30", "8e18GB", "nan", "inf",
                          "80GiBs", "1..2", "--5"}) {
    EXPECT_THAT(ParseByteSize(bad, "--budget"),
                StatusIs(absl::StatusCode::kInvalidArgument, {"--budget: '", "80GiB"}))
        << bad;
  }
  EXPECT_THAT(ParseByteSize("80G", "--budget"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"ambiguous"}));
  EXPECT_THAT(ParseByteSize("-1GiB", "--budget"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"negative"}));
  // The first value that does not fit in int64, and one just below.
  EXPECT_THAT(ParseByteSize("9223372036854775808", "--x"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"2^63"}));
  ASSERT_OK(ParseByteSize("9e18", "--x"));
}

TEST(FormatByteSize, ShortestExactSpellingRoundTrips) {
  EXPECT_EQ(FormatByteSize(0), "0");
  EXPECT_EQ(FormatByteSize(1000), "1000");
  EXPECT_EQ(FormatByteSize(1024), "1KiB");
  EXPECT_EQ(FormatByteSize(int64_t{64} << 20), "64MiB");
  EXPECT_EQ(FormatByteSize(int64_t{3} << 29), "1536MiB");
  EXPECT_EQ(FormatByteSize(int64_t{1} << 50), "1PiB");
  EXPECT_EQ(FormatByteSize(int64_t{1} << 62), "4096PiB");
  for (int64_t b : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1025}, int64_t{1} << 40,
                    (int64_t{1} << 40) + 1, INT64_MAX}) {
    absl::StatusOr<int64_t> back = ParseByteSize(FormatByteSize(b), "x");
    ASSERT_TRUE(back.ok()) << b << " " << back.status();
    EXPECT_EQ(*back, b);
  }
}

// The server's size flags parse through absl's flag marshalling.
TEST(ByteSizeFlag, ParsesUnitsAndReportsErrors) {
  ByteSize size;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag("10GiB", &size, &error)) << error;
  EXPECT_EQ(size.bytes, int64_t{10} << 30);
  ASSERT_TRUE(absl::ParseFlag("1073741824", &size, &error)) << error;
  EXPECT_EQ(size.bytes, int64_t{1} << 30);
  EXPECT_EQ(absl::UnparseFlag(size), "1GiB");
  EXPECT_FALSE(absl::ParseFlag("10G", &size, &error));
  EXPECT_NE(error.find("ambiguous"), std::string::npos) << error;
  EXPECT_EQ(size.bytes, int64_t{1} << 30) << "a refused value leaves the flag as it was";
}

}  // namespace
}  // namespace attend
