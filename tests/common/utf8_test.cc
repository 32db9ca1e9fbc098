// UTF-8 sequences: every length, and each way a sequence can be malformed.
#include "common/utf8.h"

#include "gtest/gtest.h"

namespace attend::utf8 {
namespace {

TEST(Utf8, SequenceAtAcceptsWellFormedSequencesOnly) {
  uint32_t cp = 0;
  EXPECT_EQ(SequenceAt("a", 0, &cp), 1u);
  EXPECT_EQ(cp, 'a');
  EXPECT_EQ(SequenceAt("x\xC3\xA9", 1, &cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(SequenceAt("\xE2\x82\xAC", 0, &cp), 3u);
  EXPECT_EQ(cp, 0x20ACu);
  EXPECT_EQ(SequenceAt("\xF0\x9F\x98\x80", 0, &cp), 4u);
  EXPECT_EQ(cp, 0x1F600u);
  EXPECT_EQ(SequenceAt("\x80", 0), 0u);              // a continuation byte
  EXPECT_EQ(SequenceAt("\xC0\xAF", 0), 0u);          // overlong '/'
  EXPECT_EQ(SequenceAt("\xED\xA0\x80", 0), 0u);      // a surrogate
  EXPECT_EQ(SequenceAt("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(SequenceAt("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(SequenceAt("\xE2\x82", 0), 0u);          // cut short
  EXPECT_EQ(SequenceAt("\xE2\x41\xAC", 0), 0u);      // not a continuation byte
}

}  // namespace
}  // namespace attend::utf8
