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
// 512-bit vpdpbusd with q's 4 bytes broadcast from memory ({1to16}), as int8 q.k runs it.
// REQUIRES: AVX512F, BW and VNNI.
float DpBusdBroadcastChains();
// 512-bit vpdpbusd, one 512-bit shuffle (vpunpck*dq, vshufi32x4) per two, as the int8 q.k
// kernel's transposes mix them: the same rate as DpBusdChains where shuffles run on other pipes.
// REQUIRES: AVX512F, BW and VNNI.
float DpBusdWithShufflesChains();
// 512-bit vpdpwssd (int8 p.v). REQUIRES: AVX512F, BW and VNNI.
float DpWssdChains();

}  // namespace attend::bench

#endif  // ATTEND_BENCH_INSTRUCTION_CHAINS_H_
