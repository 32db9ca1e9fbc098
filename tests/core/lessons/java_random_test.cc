// JavaRandom against java.util.Random itself, and the lessons' draws built on it.
//
// The golden rows were printed by Java 17's java.util.Random with
//   cd tests/core/lessons && javac -d /tmp/jrg JavaRandomGolden.java && java -cp /tmp/jrg
//   JavaRandomGolden
// (JavaRandomGolden.java, next to this file, says what each column is). Doubles and floats are
// compared as raw bits: the lessons' tables reproduce only if every draw is bit-identical.
#include "core/lessons/java_random.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/lessons/lesson_init.h"
#include "tests/test_util.h"

namespace attend {
namespace {

using ::attend::testing::StatusIs;

struct Golden {
  int64_t seed;
  int32_t bits[3];            // next(32), next(17), next(1) of a fresh generator
  uint64_t doubles[6];        // nextDouble, 3 x nextGaussian, nextDouble, nextGaussian
  uint32_t lesson_floats[7];  // 4 x (float)(g * 0.5), then 3 x (float)(g * 0.1)
};

const Golden kGolden[] = {
    {0LL,
     {-1155484576, 108978, 0},
     {0x3fe764168ea6ca89ULL, 0xbff4a2176d8fccc4ULL, 0x3fe5db040637e12eULL, 0x3ff2186dc26849b8ULL,
      0x3fd55373440b5f04ULL, 0x40017f904b19393aULL},
     {0x3ecd72cfu, 0xbee6cbb9u, 0x3f852dceu, 0x3ec3867bu, 0x3dc9a410u, 0xbe2c61a4u, 0xbb32d977u}},
    {1LL,
     {-1155869325, 13169, 0},
     {0x3fe7635aa8cdc4e6ULL, 0xbfda640e89be5e1aULL, 0xbff57231a53896e9ULL, 0xbfabc3ea91a85735ULL,
      0x3f790e549c66e000ULL, 0x3fc368c8296a4bffULL},
     {0x3f47e1e3u, 0xbe9bb1dbu, 0xbf0bad5bu, 0xbe9fe1ddu, 0xbde5063fu, 0xbe29cfe9u, 0xbe40bbcfu}},
    {3LL,
     {-1155099828, 73716, 0},
     {0x3fe764d26c7fd02cULL, 0x3fe73bf2ef2e93fbULL, 0xbfe79ff2b607862aULL, 0x3fe1fcbb7c573192ULL,
      0x3f9e8886695c6fc0ULL, 0x3ff1342b7dba8774ULL},
     {0x3d9bef37u, 0xbe10c354u, 0xbf1554bfu, 0x3eaf9ae0u, 0x3c2fa97au, 0xbdb5cf69u, 0xbe0bd8b4u}},
    {42LL,
     {-1170105035, 7165, 1},
     {0x3fe74833a06ff457ULL, 0x3ff1a4d76a1d7504ULL, 0xbff26b7713e0ae21ULL, 0xbff3b3e821a12136ULL,
      0x3fece86cf39c2cbeULL, 0x3fed438c0426bcb9ULL},
     {0x3f1229f4u, 0x3eeb5e52u, 0xbef32a76u, 0xbf0db1dcu, 0x3ce62d48u, 0x3d8c35f4u, 0xbda75df0u}},
    {-7LL,
     {1155869324, 118161, 1},
     {0x3fd1394aae6c88b8ULL, 0x40004a6b1a79afe2ULL, 0x3fd02bfa3b486341ULL, 0xbfb7b468b2d78517ULL,
      0x3fc60eb07185dea0ULL, 0x3fedca9f40d75de6ULL},
     {0xbf17cfb5u, 0x3ee3bf27u, 0x3d1399bdu, 0x3f170dbdu, 0xbdaead34u, 0xbc061fbfu, 0x3e46cc94u}},
    {123456789012345LL,
     {-1421006947, 67860, 1},
     {0x3fe569a4f4245262ULL, 0x3fe5fc739236ebdaULL, 0x3fdc38ad10d2856aULL, 0xbff30de568cd8cb7ULL,
      0x3fe57cdaf9c8f132ULL, 0x3fee2b6c5602b3e7ULL},
     {0x3e4a236cu, 0x3ed98cb6u, 0x3e198557u, 0x3e2e0ee9u, 0x3dc6dc90u, 0xbdbf8b4eu, 0x3df6f22au}},
    {std::numeric_limits<int64_t>::min(),
     {-1155484576, 108978, 0},
     {0x3fe764168ea6ca89ULL, 0xbff4a2176d8fccc4ULL, 0x3fe5db040637e12eULL, 0x3ff2186dc26849b8ULL,
      0x3fd55373440b5f04ULL, 0x40017f904b19393aULL},
     {0x3ecd72cfu, 0xbee6cbb9u, 0x3f852dceu, 0x3ec3867bu, 0x3dc9a410u, 0xbe2c61a4u, 0xbb32d977u}},
};

// h = h * 31 + bits of each of 1,000,000 nextGaussian draws.
const struct {
  int64_t seed;
  uint64_t hash;
} kLongRuns[] = {
    {1LL, 0xccbbe7d9a149bdddULL},
    {3LL, 0x90ea69ae041faf5aULL},
    {42LL, 0xe84d80775afe03c4ULL},
};

// StrictMath.log(x), as bits: {x, log(x)}.
const uint64_t kStrictLog[][2] = {
    {0x3feffffde7210be9ULL, 0xbeb0c6f82d74d230ULL}, {0x3ff000001ad7f29bULL, 0x3e7ad7f2847b6492ULL},
    {0x3fe0000000000000ULL, 0xbfe62e42fefa39efULL}, {0x3fe8000000000000ULL, 0xbfd269621134db92ULL},
    {0x01a56e1fc2f8f359ULL, 0xc085963447f87fb5ULL}, {0x0000000000000001ULL, 0xc0874385446d71c3ULL},
    {0x7e37e43c8800759cULL, 0x4085963447f87fb5ULL}, {0x3fbf9adbb8f8da72ULL, 0xc000bc239b9f4f40ULL},
    {0x3feccccccccccccdULL, 0xbfbaf8e8210a415cULL},
};

uint64_t Bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

TEST(JavaRandom, NextBitsMatchJava) {
  for (const Golden& g : kGolden) {
    JavaRandom r(g.seed);
    EXPECT_EQ(r.Next(32), g.bits[0]) << "seed " << g.seed;
    EXPECT_EQ(r.Next(17), g.bits[1]) << "seed " << g.seed;
    EXPECT_EQ(r.Next(1), g.bits[2]) << "seed " << g.seed;
  }
}

// nextGaussian's cached second value survives a nextDouble in between, as in Java.
TEST(JavaRandom, DoublesAndGaussiansMatchJavaBitForBit) {
  for (const Golden& g : kGolden) {
    JavaRandom r(g.seed);
    EXPECT_EQ(Bits(r.NextDouble()), g.doubles[0]) << "seed " << g.seed;
    for (int i = 1; i <= 3; ++i) {
      EXPECT_EQ(Bits(r.NextGaussian()), g.doubles[i]) << "seed " << g.seed << " gaussian " << i;
    }
    EXPECT_EQ(Bits(r.NextDouble()), g.doubles[4]) << "seed " << g.seed;
    EXPECT_EQ(Bits(r.NextGaussian()), g.doubles[5]) << "seed " << g.seed << " cached gaussian";
  }
}

// The rare last-bit differences between glibc's log and StrictMath.log show up only over many
// draws; a million per seed catches them.
TEST(JavaRandom, MillionGaussiansMatchJava) {
  for (const auto& run : kLongRuns) {
    JavaRandom r(run.seed);
    uint64_t h = 0;
    for (int i = 0; i < 1000000; ++i) h = h * 31 + Bits(r.NextGaussian());
    EXPECT_EQ(h, run.hash) << "seed " << run.seed;
  }
}

TEST(JavaRandom, FdlibmLogMatchesStrictMath) {
  for (const auto& [x, log_x] : kStrictLog) {
    double d;
    std::memcpy(&d, &x, sizeof(d));
    EXPECT_EQ(Bits(FdlibmLog(d)), log_x) << "x = " << d;
  }
}

TEST(JavaRandom, LessonFloatsMatchJavaBitForBit) {
  for (const Golden& g : kGolden) {
    JavaRandom r(g.seed);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(Bits(static_cast<float>(r.NextGaussian() * 0.5)), g.lesson_floats[i]);
    }
    for (int i = 4; i < 7; ++i) {
      EXPECT_EQ(Bits(static_cast<float>(r.NextGaussian() * 0.1)), g.lesson_floats[i]);
    }
  }
}

// DrawLessonInputs starts with x, row-major, at the default stddev 0.5.
TEST(LessonInit, DrawsXFirstLikeTheLessons) {
  for (const Golden& g : kGolden) {
    LessonInitSpec spec;
    spec.seed = g.seed;
    spec.n = 2;
    spec.d_model = 2;
    auto in = DrawLessonInputs(spec, AttentionLimits{});
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_EQ(in->x.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(Bits(in->x[i]), g.lesson_floats[i]) << "seed " << g.seed;
    EXPECT_EQ(in->head_dim, 2);  // d_model / n_head
    EXPECT_TRUE(in->wo.empty());
  }
}

// x, Wq, Wk, Wv, Wo in that order from one generator: the shapes of lesson 003 Example 9.
TEST(LessonInit, DrawsTheMatricesInTheLessonsOrder) {
  LessonInitSpec spec;
  spec.seed = 3;
  spec.n = 4;
  spec.d_model = 8;
  spec.n_head = 2;
  spec.with_wo = true;
  auto in = DrawLessonInputs(spec, AttentionLimits{});
  ASSERT_TRUE(in.ok()) << in.status();
  JavaRandom r(3);
  for (const std::vector<float>* m : {&in->x, &in->wq, &in->wk, &in->wv, &in->wo}) {
    for (float f : *m) ASSERT_EQ(Bits(f), Bits(static_cast<float>(r.NextGaussian() * 0.5)));
  }
  EXPECT_EQ(in->wq_shape, (Shape{8, 8}));
  EXPECT_EQ(in->wo_shape, (Shape{8, 8}));
}

TEST(LessonInit, GroupedQueryShapesAndExplicitWidths) {
  LessonInitSpec spec;
  spec.n = 3;
  spec.d_model = 5;
  spec.head_dim = 2;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.with_wo = true;
  spec.d_out = 3;
  spec.stddev = 0.1;
  auto in = DrawLessonInputs(spec, AttentionLimits{});
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->x_shape, (Shape{3, 5}));
  EXPECT_EQ(in->wq_shape, (Shape{5, 8}));
  EXPECT_EQ(in->wk_shape, (Shape{5, 4}));
  EXPECT_EQ(in->wv_shape, (Shape{5, 4}));
  EXPECT_EQ(in->wo_shape, (Shape{8, 3}));
}

TEST(LessonInit, RejectsBadFieldsBeforeAllocating) {
  auto spec = [](auto edit) {
    LessonInitSpec s;
    s.n = 4;
    s.d_model = 4;
    edit(s);
    return DrawLessonInputs(s, AttentionLimits{}).status();
  };
  const auto ia = absl::StatusCode::kInvalidArgument;
  const auto re = absl::StatusCode::kResourceExhausted;
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.n = 0; }), StatusIs(ia, {"init.n: 0"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.d_model = -3; }), StatusIs(ia, {"init.d_model: -3"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.head_dim = -1; }), StatusIs(ia, {"init.head_dim"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.n_head = 3; }),
              StatusIs(ia, {"does not divide init.d_model 4"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.d_out = 2; }), StatusIs(ia, {"init.d_out"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.stddev = -0.5; }), StatusIs(ia, {"init.stddev"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.stddev = 0; }), StatusIs(ia, {"init.stddev"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.stddev = std::numeric_limits<double>::quiet_NaN(); }),
              StatusIs(ia, {"init.stddev"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.stddev = std::numeric_limits<double>::infinity(); }),
              StatusIs(ia, {"init.stddev"}));
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.n_head_kv = 3; }), StatusIs(ia, {"n_head_kv"}));
  // Huge sizes are refused by arithmetic, never by trying to allocate.
  EXPECT_THAT(spec([](LessonInitSpec& s) { s.n = std::numeric_limits<int32_t>::max(); }),
              StatusIs(re, {"over the limit of"}));
  // The matrices together are bounded too: 16 + 3 x 16 elements against a total of 63.
  LessonInitSpec four;
  four.n = 4;
  four.d_model = 4;
  EXPECT_THAT(DrawLessonInputs(four, AttentionLimits{}, 63).status(),
              StatusIs(re, {"64 elements together", "over the limit of 63"}));
  EXPECT_TRUE(DrawLessonInputs(four, AttentionLimits{}, 64).ok());
  // With no element limit at all, every matrix's count is still checked before any is drawn.
  LessonInitSpec huge;
  huge.n = 1;
  huge.d_model = std::numeric_limits<int32_t>::max();
  huge.head_dim = std::numeric_limits<int32_t>::max();
  huge.n_head = std::numeric_limits<int32_t>::max();
  AttentionLimits unlimited;
  unlimited.max_tensor_elements = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(DrawLessonInputs(huge, unlimited).status(), StatusIs(ia, {"overflows 64 bits"}));
}

}  // namespace
}  // namespace attend
