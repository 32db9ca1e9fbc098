// Human-readable output of the CLI: aligned tables, compact numbers, tensor previews and a
// minimal JSON writer for --json.
#ifndef ATTEND_CLIENT_CLI_FORMAT_H_
#define ATTEND_CLIENT_CLI_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "client/tensor.h"

namespace attend::cli {

// Columns padded to their widest cell; numeric-looking cells are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// Fixed-point with `decimals` digits ("0.6285").
std::string Fixed(double value, int decimals);
// SI-scaled with a unit: 1.3e9 FLOP -> "1.30 GFLOP".
std::string Si(double value, const std::string& unit);
// Seconds as "12.3 us", "4.56 ms", "1.20 s".
std::string Duration(double seconds);
// "[2, 8, 64]".
std::string ShapeString(absl::Span<const int64_t> shape);

// A JSON array of numbers, shortest round-trip form; NaN/inf as null.
std::string JsonNumbers(absl::Span<const float> values);
std::string JsonNumbers(absl::Span<const double> values);
std::string JsonString(const std::string& s);
// {"shape": [...], "values": [...]}
std::string JsonTensor(const client::FloatTensor& tensor);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_FORMAT_H_
