#include "planner/hardware.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "core/kernels/cpu_features.h"
#include "core/kernels/onednn.h"
#include "planner/catalog.h"
#include "planner/cost.h"
#include "tests/planner/planner_test_util.h"
#include "tests/test_util.h"

namespace attend::planner {
namespace {

using ::attend::testing::StatusIs;

TEST(HardwareCatalog, DatasheetFigures) {
  const HardwareProfile h100 = *FindHardware("h100");
  EXPECT_EQ(h100.peak_flops_bf16, 989.5e12);
  EXPECT_EQ(h100.peak_flops_fp8, 1979e12);
  EXPECT_EQ(h100.peak_flops_f32, 67e12);
  EXPECT_EQ(h100.memory_bandwidth_bytes_per_second, 3.35e12);
  EXPECT_EQ(h100.memory_bytes, 80.0 * (1 << 30));
  EXPECT_EQ(FindHardware("h200")->memory_bandwidth_bytes_per_second, 4.8e12);
  EXPECT_EQ(FindHardware("a100")->peak_flops_bf16, 312e12);
  EXPECT_EQ(FindHardware("a100")->memory_bandwidth_bytes_per_second, 2.039e12);
  // Xeon Platinum 8480+: 56 cores x 2.0 GHz x 64 f32 FLOP/cycle; 8 x DDR5-4800 x 8 bytes.
  const HardwareProfile cpu = *FindHardware("cpu-socket");
  EXPECT_DOUBLE_EQ(cpu.peak_flops_f32, 7.168e12);
  EXPECT_DOUBLE_EQ(cpu.peak_flops_bf16, 114.688e12);
  EXPECT_DOUBLE_EQ(cpu.memory_bandwidth_bytes_per_second, 8 * 4800e6 * 8);
  for (const HardwareProfile& h : HardwareCatalog()) {
    SCOPED_TRACE(h.name);
    EXPECT_OK(ValidateHardware(h));
    EXPECT_FALSE(h.note.empty());
  }
}

TEST(FindHardware, AliasesAndUnknownNames) {
  EXPECT_EQ(FindHardware("H100-SXM")->name, "h100");
  EXPECT_EQ(FindHardware("a100-80gb")->name, "a100");
  EXPECT_EQ(FindHardware("xeon-8480+")->name, "cpu-socket");
  EXPECT_THAT(FindHardware("tpu-v5"),
              StatusIs(absl::StatusCode::kNotFound, {"'tpu-v5'", "h100", "cpu-socket", "local"}));
}

TEST(ValidateHardware, RejectsBadCustomProfiles) {
  HardwareProfile h;
  h.name = "custom";
  h.peak_flops_bf16 = 1e12;
  h.memory_bandwidth_bytes_per_second = 1e11;
  EXPECT_OK(ValidateHardware(h));
  HardwareProfile bad = h;
  bad.memory_bandwidth_bytes_per_second = 0;
  EXPECT_THAT(ValidateHardware(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, {"memory_bandwidth", "> 0"}));
  bad = h;
  bad.peak_flops_f32 = -1;
  EXPECT_THAT(ValidateHardware(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, {"hardware.peak_flops_f32: -1"}));
  bad = h;
  bad.memory_bytes = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(ValidateHardware(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, {"hardware.memory_bytes"}));
  bad = h;
  bad.peak_flops_bf16 = 0;
  EXPECT_THAT(ValidateHardware(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, {"every peak FLOP/s figure is 0"}));
  bad = h;
  bad.name = std::string(1000, 'x');
  EXPECT_THAT(ValidateHardware(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, {"hardware.name: 1000 bytes"}));
}

// Figures below 1 FLOP/s or 1 byte/s describe no machine, and denormal ones made the roofline
// times infinite and the price NaN in an OK answer: 0 (absent) or at least 1.
TEST(ValidateHardware, RejectsFiguresBelowOne) {
  HardwareProfile h;
  h.peak_flops_f32 = 1e12;
  h.memory_bandwidth_bytes_per_second = 1e11;
  for (double tiny : {5e-324, 1e-300, 0.5}) {
    HardwareProfile bad = h;
    bad.peak_flops_f32 = tiny;
    EXPECT_THAT(ValidateHardware(bad, "custom"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         {"custom.peak_flops_f32", "0 (none) or at least 1"}));
    bad = h;
    bad.memory_bandwidth_bytes_per_second = tiny;
    EXPECT_THAT(
        ValidateHardware(bad, "custom"),
        StatusIs(absl::StatusCode::kInvalidArgument, {"custom.memory_bandwidth_bytes_per_second"}));
  }
  // The smallest accepted figures still give finite answers for a large model and prompt.
  HardwareProfile slow;
  slow.peak_flops_f32 = 1;
  slow.peak_flops_bf16 = 1;
  slow.memory_bandwidth_bytes_per_second = 1;
  ASSERT_OK(ValidateHardware(slow));
  CostRequest r;
  r.prompt_tokens = 1 << 20;
  r.batch = 1024;
  r.price_per_hour_usd = 1e9;
  absl::StatusOr<CostEstimate> e = EstimateCost(testing::Preset("llama-3-70b"), r, slow);
  ASSERT_OK(e);
  for (const PhaseCost* phase : {&e->prefill, &e->decode}) {
    EXPECT_TRUE(std::isfinite(phase->roofline_seconds));
    EXPECT_TRUE(std::isfinite(phase->usd_per_million_tokens));
    EXPECT_TRUE(std::isfinite(phase->tokens_per_second));
  }
}

// A custom profile nested in a request is checked under its path; a name from a request field
// gets the field as the subject of its error.
TEST(ValidateHardware, NamesFieldsUnderTheGivenPath) {
  HardwareProfile h;
  h.peak_flops_bf16 = 1e12;
  h.memory_bandwidth_bytes_per_second = 0;
  EXPECT_THAT(ValidateHardware(h, "custom"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       {"custom.memory_bandwidth_bytes_per_second: must be > 0"}));
  h.memory_bandwidth_bytes_per_second = 1e11;
  h.peak_flops_bf16 = 0;
  EXPECT_THAT(ValidateHardware(h, "custom"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                      {"custom: every peak FLOP/s figure is 0"}));
  EXPECT_THAT(FindHardware("tpu-v5", "profile"),
              StatusIs(absl::StatusCode::kNotFound, {"profile: hardware 'tpu-v5' is not"}));
}

TEST(HardwareMeasure, RejectsBadArguments) {
  EXPECT_THAT(MeasureMatmulFlops(8, 1, false),
              StatusIs(absl::StatusCode::kInvalidArgument, {"n: 8"}));
  EXPECT_THAT(MeasureMatmulFlops(64, 0, false),
              StatusIs(absl::StatusCode::kInvalidArgument, {"runs: 0"}));
  EXPECT_THAT(MeasureReadBandwidth(1000, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, {"bytes: 1000"}));
  EXPECT_THAT(MeasureReadBandwidth(int64_t{1} << 40, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, {"bytes"}));
}

TEST(HardwareMeasure, SmallRunsGivePositiveRates) {
  absl::StatusOr<double> flops = MeasureMatmulFlops(128, 2, false);
  ASSERT_OK(flops);
  EXPECT_GT(*flops, 1e8);
  absl::StatusOr<double> bandwidth = MeasureReadBandwidth(int64_t{8} << 20, 2);
  ASSERT_OK(bandwidth);
  EXPECT_GT(*bandwidth, 1e8);
}

// The local profile is measured once, shared by concurrent first callers, and plausible for a
// CPU: between 1 GFLOP/s and 100 TFLOP/s, between 100 MB/s and 2 TB/s.
TEST(LocalHardware, MeasuredOnceAndPlausible) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const HardwareProfile*> seen(4, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = &LocalHardware(); });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const HardwareProfile* p : seen) EXPECT_EQ(p, seen[0]);
  const HardwareProfile& local = *seen[0];
  EXPECT_EQ(local.name, "local");
  EXPECT_GT(local.peak_flops_f32, 1e9);
  EXPECT_LT(local.peak_flops_f32, 1e14);
  EXPECT_GT(local.memory_bandwidth_bytes_per_second, 1e8);
  EXPECT_LT(local.memory_bandwidth_bytes_per_second, 2e12);
  EXPECT_GT(local.memory_bytes, 0.0);
  EXPECT_EQ(local.peak_flops_fp8, 0.0);
  // bf16 requests get what attend runs them on: the f32 matmul unless it uses a bf16 one.
  if (!HasBf16Matmul()) {
    EXPECT_EQ(local.peak_flops_bf16, local.peak_flops_f32);
    EXPECT_TRUE(absl::StrContains(local.note, "no bf16 matmul")) << local.note;
  } else if (!UseBf16Matmul()) {
    EXPECT_EQ(local.peak_flops_bf16, local.peak_flops_f32);
    EXPECT_TRUE(absl::StrContains(local.note, "slower than its f32 one")) << local.note;
  } else {
    EXPECT_GT(local.peak_flops_bf16, 0.0);
  }
  EXPECT_TRUE(absl::StrContains(local.note, "measured at first use")) << local.note;
  EXPECT_OK(ValidateHardware(local));
  absl::StatusOr<HardwareProfile> found = FindHardware("local");
  ASSERT_OK(found);
  EXPECT_EQ(found->peak_flops_f32, local.peak_flops_f32);
  // Generous: the measurement is designed to take a few hundred milliseconds.
  EXPECT_LT(seconds, 20.0);
  std::cout << absl::StrFormat(
      "local: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, read %.2f GB/s, memory %.1f GiB "
      "(first use took %.2f s)\n  note: %s\n",
      local.peak_flops_f32 / 1e9, local.peak_flops_bf16 / 1e9,
      local.memory_bandwidth_bytes_per_second / 1e9, local.memory_bytes / (1 << 30) / 1.0, seconds,
      local.note);
}

}  // namespace
}  // namespace attend::planner
