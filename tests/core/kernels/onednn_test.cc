// The matmul adapter against plain loops: dense and strided (transposed) operands, more shapes
// than a thread keeps ready (so entries are dropped and rebuilt), from several threads at once.
#include "core/kernels/onednn.h"

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"
#include "core/kernels/cpu_features.h"
#include "tests/test_util.h"

namespace attend::onednn {
namespace {

using ::attend::testing::RandomFloats;
using ::attend::testing::StatusIs;

struct Product {
  MatmulSpec spec;
  std::vector<float> a, b, expected;
};

// dst[m, n] = a[m, k] x b[k, n]; b is read through `transposed` strides (b stored [n, k]) for
// odd shapes, and a's rows are padded by `pad` elements.
Product MakeProduct(std::mt19937_64& rng, int64_t m, int64_t k, int64_t n, bool transposed,
                    int64_t pad) {
  Product p;
  p.spec.src = {m, k, k + pad, 1, DType::kFloat32};
  p.spec.weights =
      transposed ? Operand{k, n, 1, k, DType::kFloat32} : Operand{k, n, n, 1, DType::kFloat32};
  p.spec.dst = {m, n, n, 1, DType::kFloat32};
  p.a = RandomFloats(rng, m * (k + pad));
  p.b = RandomFloats(rng, k * n);
  p.expected.assign(static_cast<size_t>(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t x = 0; x < k; ++x) {
        const float w = transposed ? p.b[j * k + x] : p.b[x * n + j];
        sum += static_cast<double>(p.a[i * (k + pad) + x]) * w;
      }
      p.expected[i * n + j] = static_cast<float>(sum);
    }
  }
  return p;
}

void CheckProduct(const Product& p) {
  std::vector<float> dst(p.expected.size(), -7.0f);
  ASSERT_OK(RunMatmul(p.spec, p.a.data(), p.b.data(), dst.data()));
  for (size_t i = 0; i < dst.size(); ++i) {
    ASSERT_NEAR(dst[i], p.expected[i], 1e-4 * (1.0 + std::abs(p.expected[i]))) << p.spec.Key();
  }
}

// 40 specs, more than the 32 a thread keeps with their arguments bound, run in rounds: every
// round evicts and re-adds entries. Runs of six share their src operand and differ only in the
// weights' width or layout, so a call that picked a spec by part of it would get a wrong shape.
std::vector<Product> ManyProducts() {
  std::mt19937_64 rng(3);
  std::vector<Product> products;
  for (int64_t i = 0; i < 40; ++i) {
    const int64_t same_src = i / 6;
    products.push_back(MakeProduct(rng, 1 + same_src % 4, 8 + 8 * (same_src % 2), 3 + i % 3,
                                   (i / 3) % 2 == 1, same_src % 3));
  }
  return products;
}

TEST(RunMatmul, MatchesLoopsAcrossMoreShapesThanAThreadKeeps) {
  const std::vector<Product> products = ManyProducts();
  for (int round = 0; round < 3; ++round) {
    for (const Product& p : products) CheckProduct(p);
  }
}

TEST(RunMatmul, ThreadsRunTheSameShapesAtOnce) {
  const std::vector<Product> products = ManyProducts();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&products, t] {
      for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < products.size(); ++i) CheckProduct(products[(i + 7 * t) % 40]);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// The shared cache keeps at most its capacity, dropping the least recently used; products stay
// right whether their primitive was kept, dropped or recreated.
TEST(MatmulCache, KeepsAtMostItsCapacityDroppingTheLeastRecentlyUsed) {
  const int64_t saved = GetMatmulCacheStats().capacity;
  SetMatmulCacheCapacity(4);
  std::mt19937_64 rng(11);
  std::vector<Product> products;
  for (int64_t i = 0; i < 6; ++i) products.push_back(MakeProduct(rng, 2, 24, 5 + i, false, 1));
  // GetMatmul goes to the shared cache every time (RunMatmul's per-thread list would hide it).
  auto get = [&](int i) { return GetMatmul(products[static_cast<size_t>(i)].spec); };
  for (int i = 0; i < 4; ++i) ASSERT_OK(get(i));
  const MatmulCacheStats full = GetMatmulCacheStats();
  EXPECT_EQ(full.entries, 4);
  ASSERT_OK(get(0));  // product 0 is now the most recently used; 1 the least
  ASSERT_OK(get(4));  // drops 1
  int64_t creations = GetMatmulCacheStats().creations;
  ASSERT_OK(get(0));
  EXPECT_EQ(GetMatmulCacheStats().creations, creations) << "product 0 was dropped";
  ASSERT_OK(get(1));
  EXPECT_EQ(GetMatmulCacheStats().creations, creations + 1) << "product 1 was kept";
  const MatmulCacheStats after = GetMatmulCacheStats();
  EXPECT_EQ(after.entries, 4);
  EXPECT_EQ(after.capacity, 4);
  EXPECT_GE(after.evictions, full.evictions + 2);
  for (const Product& p : products) CheckProduct(p);
  SetMatmulCacheCapacity(saved);
  EXPECT_EQ(GetMatmulCacheStats().capacity, saved);
}

TEST(RunMatmul, RefusesShapesThatDoNotAgree) {
  MatmulSpec spec;
  spec.src = {4, 8, 8, 1, DType::kFloat32};
  spec.weights = {6, 5, 5, 1, DType::kFloat32};
  spec.dst = {4, 5, 5, 1, DType::kFloat32};
  std::vector<float> a(32), b(30), c(20);
  EXPECT_THAT(RunMatmul(spec, a.data(), b.data(), c.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// bf16 products run on oneDNN's bf16 matmul only where it is the faster one: with AMX, or on
// AMD's AVX512-BF16 (Zen 4: twice the f32 rate). On Intel cores without AMX, vdpbf16ps retires
// at half the rate of the f32 FMAs, and oneDNN's bf16 matmul ran at 0.5-0.7x its f32 one, so
// bf16 there multiplies bf16-rounded values on the f32 matmul (the same exact products).
// Weights packed once into the primitive's own layout give the same products as the plain
// (strided) weights they came from, for the prefill's tile shapes and odd ones, f32 and bf16
// (bf16 where oneDNN has a bf16 matmul): prefill packs a key tile once for all query tiles.
TEST(PackWeights, PackedWeightsGiveThePlainProducts) {
  std::mt19937_64 rng(9);
  std::vector<DType> types = {DType::kFloat32};
  if (HasBf16Matmul()) types.push_back(DType::kBFloat16);
  struct Shape {
    int64_t m, k, n;
    bool transposed;
  };
  for (const DType type : types) {
    for (const Shape& shape :
         {Shape{64, 128, 512, true}, Shape{64, 512, 128, false}, Shape{64, 128, 192, true},
          Shape{16, 72, 40, false}, Shape{7, 33, 5, true}}) {
      SCOPED_TRACE(::testing::Message()
                   << shape.m << "x" << shape.k << "x" << shape.n
                   << (shape.transposed ? " transposed" : "") << " " << DTypeName(type));
      const int64_t m = shape.m, k = shape.k, n = shape.n;
      const size_t bytes = type == DType::kBFloat16 ? 2 : 4;
      const std::vector<float> a = RandomFloats(rng, m * k), b = RandomFloats(rng, k * n);
      // The operands in `type` (bf16 values are exact in both, so the two products agree).
      std::vector<char> a_data(a.size() * bytes), b_data(b.size() * bytes);
      for (size_t i = 0; i < a.size(); ++i) {
        if (type == DType::kBFloat16) {
          reinterpret_cast<uint16_t*>(a_data.data())[i] = FloatToBf16(a[i]);
        } else {
          reinterpret_cast<float*>(a_data.data())[i] = a[i];
        }
      }
      for (size_t i = 0; i < b.size(); ++i) {
        if (type == DType::kBFloat16) {
          reinterpret_cast<uint16_t*>(b_data.data())[i] = FloatToBf16(b[i]);
        } else {
          reinterpret_cast<float*>(b_data.data())[i] = b[i];
        }
      }
      MatmulSpec plain;
      plain.src = {m, k, k, 1, type};
      plain.weights = shape.transposed ? Operand{k, n, 1, k, type} : Operand{k, n, n, 1, type};
      plain.dst = {m, n, n, 1, DType::kFloat32};
      std::vector<float> expected(static_cast<size_t>(m * n)), got(expected.size(), -7.0f);
      ASSERT_OK(RunMatmul(plain, a_data.data(), b_data.data(), expected.data()));

      MatmulSpec packed = plain;
      packed.weights.packed = true;
      const absl::StatusOr<int64_t> size = PackedWeightsBytes(packed);
      ASSERT_OK(size);
      ASSERT_GE(*size, static_cast<int64_t>(k * n * bytes));
      std::vector<char> packed_data(static_cast<size_t>(*size));
      ASSERT_OK(PackWeights(packed, plain.weights, b_data.data(), packed_data.data()));
      ASSERT_OK(RunMatmul(packed, a_data.data(), packed_data.data(), got.data()));
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], expected[i], 1e-5 * (1.0 + std::abs(expected[i]))) << "element " << i;
      }
    }
  }
}

TEST(PackWeights, RefusesWeightsThatDoNotFit) {
  MatmulSpec spec;
  spec.src = {16, 32, 32, 1, DType::kFloat32};
  spec.weights = {32, 16, 16, 1, DType::kFloat32, /*packed=*/true};
  spec.dst = {16, 16, 16, 1, DType::kFloat32};
  std::vector<float> plain(32 * 16), packed(64 * 64);
  // The plain layout's shape must be the spec's.
  EXPECT_THAT(PackWeights(spec, {16, 32, 32, 1, DType::kFloat32}, plain.data(), packed.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A spec whose weights are not packed has no packed layout.
  MatmulSpec not_packed = spec;
  not_packed.weights.packed = false;
  EXPECT_THAT(PackedWeightsBytes(not_packed), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PackWeights(not_packed, not_packed.weights, plain.data(), packed.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(UseBf16Matmul, OnlyWhereItIsTheFasterMatmul) {
  __builtin_cpu_init();
  const bool amx = CpuIsaName() == "avx512_core_amx";
  if (!HasBf16Matmul()) {
    EXPECT_FALSE(UseBf16Matmul());
  } else if (amx || !__builtin_cpu_is("intel")) {
    EXPECT_TRUE(UseBf16Matmul()) << CpuIsaName();
  } else {
    EXPECT_FALSE(UseBf16Matmul()) << CpuIsaName();
  }
}

}  // namespace
}  // namespace attend::onednn
