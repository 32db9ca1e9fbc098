// What the commands that send tensors share (`attend attend`, `mha`, `seq append`, `seq decode`
// and `attend bench`): the --precision and --wire flags and random normal inputs.
//
// Thread-safety: pure functions, except RandomTensor, which advances the generator it is given.
#ifndef ATTEND_CLIENT_CLI_TENSORS_TENSOR_FLAGS_H_
#define ATTEND_CLIENT_CLI_TENSORS_TENSOR_FLAGS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attend/v1/tensor.pb.h"
#include "client/cli/framework/args.h"
#include "client/tensor.h"

namespace attend::cli {

// A --precision value: "" (unspecified), f32/float32 or bf16/bfloat16.
absl::StatusOr<v1::Precision> ParsePrecision(const std::string& precision);

// --precision and --wire (read by ParsePrecision and client::ParseWire) as every command that
// sends tensors declares them.
void DeclarePrecision(Flags& f, std::string* precision);
void DeclareWire(Flags& f, std::string* wire);

// A tensor of `shape` with standard normal values (times `stddev`) drawn from `rng`.
client::FloatTensor RandomTensor(std::mt19937_64& rng, std::vector<int64_t> shape,
                                 float stddev = 1.0f);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_TENSORS_TENSOR_FLAGS_H_
