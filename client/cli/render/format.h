// Human-readable output of the CLI, shared by every command: aligned tables and label/value
// fields, padded and wrapped text, compact and grouped numbers, binary byte sizes, times,
// tensor previews (rows by head, weight matrices, compute stats), and the JSON pieces that
// --json prints.
//
// Thread-safety: pure functions and value types (Ago reads the clock, nothing else).
#ifndef ATTEND_CLIENT_CLI_RENDER_FORMAT_H_
#define ATTEND_CLIENT_CLI_RENDER_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attend/v1/tensor.pb.h"
#include "client/tensor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace attend::cli {

// How a Table is printed: with or without its header line, and how wide it may be.
struct TableStyle {
  bool headers = true;
  // The widest a line may be, 0 for no limit. Columns are hidden in the table's drop order
  // until it fits, or until none that may go is left.
  size_t max_width = 0;
};

// The style the command line and the terminal ask for: no header line with --no-headers; no
// limit with -o wide; else $COLUMNS when it is a positive number; else, when stdout is a
// terminal, its width (80 when it does not tell); else (piped, as in scripts) no limit.
// Reads the environment and stdout, nothing else.
TableStyle TableStyleFromFlags(bool no_headers, bool wide);

// Columns padded to their widest cell; numeric-looking cells are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // The headers of the columns that may be hidden to fit TableStyle::max_width, the least
  // important first; the other columns always show.
  void set_drop_order(std::vector<std::string> headers) { drop_order_ = std::move(headers); }

  std::string Render() const { return Render(TableStyle()); }
  // The table in `style`; `hidden`, when given, receives the headers of the columns left out.
  std::string Render(const TableStyle& style, std::vector<std::string>* hidden = nullptr) const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::string> drop_order_;
};

// "(source, window hidden to fit 80 columns; -o wide shows them)\n", or "" when `hidden` is
// empty.
std::string HiddenColumnsNote(const std::vector<std::string>& hidden, size_t max_width);

// `table` in the style of the flags (TableStyleFromFlags) on `out`, and the note of the columns
// it hides: on `out` below it, or on `err` with --no-headers, which keeps `out` to the rows.
void PrintTable(const Table& table, const TableStyle& style, std::ostream& out, std::ostream& err);

// "label     value" lines with the values aligned, each line starting with `indent`.
class Fields {
 public:
  void Add(std::string label, std::string value) {
    rows_.emplace_back(std::move(label), std::move(value));
  }
  // With `max_width` > 0 (TableStyle::max_width), a value that would make its line longer is
  // wrapped at spaces onto lines of its own, indented to the value column.
  std::string Render(const std::string& indent = "", size_t max_width = 0) const;

 private:
  std::vector<std::pair<std::string, std::string>> rows_;
};

// `text` followed by spaces up to `width` characters (bytes); longer text is left whole.
std::string PadRight(std::string text, size_t width);
// `text` broken into lines of at most `width` characters (words longer than that stay whole),
// each starting with `indent` and ending in a newline.
std::string Wrap(const std::string& text, size_t width, const std::string& indent);
// At most `max_chars` bytes of `text`, the last three "..." when it is cut.
// REQUIRES: max_chars >= 3.
std::string Shorten(const std::string& text, size_t max_chars);
// `text` in single quotes, as the commands name sequences: "'chat-1'".
std::string Quoted(const std::string& text);

// Fixed-point with `decimals` digits ("0.6285").
std::string Fixed(double value, int decimals);
// SI-scaled with a unit: 1.3e9 FLOP -> "1.30 GFLOP".
std::string Si(double value, const std::string& unit);
// SI-scaled with one decimal from 10 on and two below, as the planner prints FLOPs and bytes:
// "17.6 TFLOP", "131.6 TFLOP", "4.29 GFLOP", "989.5 TFLOP/s".
std::string SiFine(double value, const std::string& unit);
// Tokens per second and similar rates: whole numbers with separators from 1,000 on, smaller ones
// with three significant digits; "-" when not finite.
std::string Rate(double value);
// Seconds as "12.3 us", "4.56 ms", "1.20 s".
std::string Duration(double seconds);
// How long ago a Unix time in milliseconds was, from the clock: "0 s", "42 s", "5 min", "3 h",
// "2 d". Times in the future count as now.
std::string Ago(int64_t unix_ms);
// A Unix time in milliseconds as "2024-05-01 12:30:00 UTC".
std::string UtcTime(int64_t unix_ms);
// "[2, 8, 64]".
std::string ShapeString(absl::Span<const int64_t> shape);
// Thousands separators: "4,194,304", "-1,500".
std::string Count(int64_t value);
// "1 token", "4,096 tokens".
std::string Plural(int64_t n, const std::string& one, const std::string& many);
// Binary units with two decimals, as the planner prints them: "1.00 GiB", "512.00 KiB"; below
// 1 KiB, "100 bytes".
std::string BinaryBytes(int64_t bytes);
// BinaryBytes with the exact count from 1 KiB on: "1.00 GiB (1,073,741,824 bytes)", "100 bytes".
std::string BytesWithCount(int64_t bytes);
// The attention variant that `n_head_kv` key/value heads for `n_head` query heads make:
// "multi-head" (as many), "multi-query" (one) or "grouped-query".
std::string AttentionVariantName(int64_t n_head, int64_t n_head_kv);

// A JSON number with nine significant digits ("%.9g", enough for a float); NaN/inf as null.
std::string JsonNumber(double value);
// A JSON array of numbers, each as JsonNumber writes it.
std::string JsonNumbers(absl::Span<const float> values);
std::string JsonNumbers(absl::Span<const double> values);
std::string JsonString(const std::string& s);
// {"shape": [...], "values": [...]}: what `attend attend --input` reads back.
std::string JsonTensor(const client::FloatTensor& tensor);
// A response message as indented JSON with the proto field names, defaults included; 64-bit
// integers are numbers up to 2^53 in magnitude and strings beyond (UnquoteExactInt64s).
std::string ToJson(const google::protobuf::Message& message);

// --json's rule for 64-bit integers: a number when a double holds it exactly (|x| <= 2^53), else
// a string. protobuf's JSON printer quotes every int64 and uint64 (proto3's JSON mapping, for
// readers that parse numbers as doubles), which makes "tokens": "42" of every count; only values
// past 2^53 would lose digits in such a reader, so only they stay quoted.
//
// `json` as MessageToJsonString printed a message of type `type` with add_whitespace (proto
// field names), with the quotes taken off each value of a 64-bit integer field (singular,
// repeated, map values, in nested messages) that fits. The printer's layout puts one member or
// element on each line, so the text is read line by line alongside the descriptor: a string
// field holding digits stays a string, and google.protobuf's messages are copied as they are.
// Text in any other layout is returned unchanged (still valid proto3 JSON). A pure function.
std::string UnquoteExactInt64s(absl::string_view json, const google::protobuf::Descriptor& type);

// Rows [row, head] of a [rows, heads, dim] tensor (a [rows, dim] one has rows alone), at most
// `max_rows` rows and `max_cols` columns. The first column is named `row_name` and counts from
// `first_row` (e.g. the position of the first appended token).
void PrintHeadRows(std::ostream& out, const client::FloatTensor& t, const std::string& row_name,
                   int64_t first_row = 0, int64_t max_rows = 16, int64_t max_cols = 8);

// Each head's weight matrix of a [heads, n_q, n_kv] tensor, at most 16 x 16, under a heading
// "weights, head h (row = <rows>, column = <columns>):"; rows count from `first_row`.
void PrintWeights(std::ostream& out, const client::FloatTensor& weights, const std::string& rows,
                  const std::string& columns, int64_t first_row = 0);

// "engine onednn/f32: 6 attended pairs, 192 FLOP in 12.3 us (15.6 MFLOP/s); queued 2.0 us".
void PrintStats(std::ostream& out, const v1::ComputeStats& stats);

}  // namespace attend::cli

#endif  // ATTEND_CLIENT_CLI_RENDER_FORMAT_H_
