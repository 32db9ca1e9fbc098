// Loops that time one vector instruction's throughput on one core, for decode_bench's
// BM_InstructionRate: kIterations steps of kChains independent chains of the instruction, each
// returning a sum so that nothing is optimised away (an asm barrier on the multiplier keeps the
// compiler from folding the chains).
//
// Thread-safety: pure functions.
#ifndef ATTEND_BENCH_INSTRUCTION_CHAINS_H_
#define ATTEND_BENCH_INSTRUCTION_CHAINS_H_

#include <cstdint>

namespace attend::bench {

constexpr int kChains = 24;
constexpr int64_t kIterations = 20'000'000;

// 8-lane FMAs. REQUIRES: AVX2 and FMA.
float Fma8Chains();
// 16-lane FMAs. REQUIRES: AVX512F.
float Fma16Chains();
// 512-bit vdpbf16ps. REQUIRES: AVX512F, BW and BF16.
float DpBf16Chains();
// 512-bit vpdpbusd. REQUIRES: AVX512F, BW and VNNI.
float DpBusdChains();

}  // namespace attend::bench

#endif  // ATTEND_BENCH_INSTRUCTION_CHAINS_H_
