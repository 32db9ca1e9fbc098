#include "client/npy.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/output_file.h"
#include "common/half.h"

namespace attend::client {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

// The header dict's entries, key -> value text (trimmed, e.g. "'<f4'", "False", "(2, 3)"), as
// numpy.save writes them: exactly the keys descr, fortran_order and shape, each once. A repeated
// key is read differently by different readers (numpy keeps the last), and an unknown one means
// a writer this reader does not know.
absl::StatusOr<std::map<std::string, std::string>> HeaderDict(absl::string_view header) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("npy header: ", parts...));
  };
  size_t i = header.find('{');
  if (i == absl::string_view::npos) return bad("not a dict");
  std::map<std::string, std::string> dict;
  while (true) {
    ++i;  // past '{' or the value that ended at a ',' or '}'
    while (i < header.size() && (absl::ascii_isspace(header[i]) || header[i] == ',')) ++i;
    if (i >= header.size()) return bad("the dict is not closed");
    if (header[i] == '}') return dict;
    const char quote = header[i];
    if (quote != '\'' && quote != '"') return bad("expected a quoted key at offset ", i);
    const size_t close = header.find(quote, i + 1);
    if (close == absl::string_view::npos) return bad("a key is not closed");
    const std::string key(header.substr(i + 1, close - i - 1));
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      return bad("unexpected key '", key.substr(0, 32),
                 "'; a .npy header has exactly descr, fortran_order and shape");
    }
    if (dict.count(key) > 0) return bad("'", key, "' appears twice");
    size_t colon = close + 1;
    while (colon < header.size() && absl::ascii_isspace(header[colon])) ++colon;
    if (colon >= header.size() || header[colon] != ':') return bad("no value for '", key, "'");
    // The value runs to the next comma or closing brace outside brackets and strings.
    int depth = 0;
    char in_string = 0;
    for (i = colon + 1; i < header.size(); ++i) {
      const char c = header[i];
      if (in_string != 0) {
        if (c == in_string) in_string = 0;
      } else if (c == '\'' || c == '"') {
        in_string = c;
      } else if (c == '(' || c == '[' || c == '{') {
        ++depth;
      } else if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) break;
        --depth;
      } else if (c == ',' && depth == 0) {
        break;
      }
    }
    dict[key] = std::string(absl::StripAsciiWhitespace(header.substr(colon + 1, i - colon - 1)));
    if (i < header.size() && header[i] == '}') return dict;
  }
}

// The bytes per element of the header's 'descr': 4, 8 or 2 for little-endian (or native)
// float32, float64 and float16.
absl::StatusOr<size_t> ElementWidth(const std::string& descr) {
  std::string d = descr;
  absl::StripAsciiWhitespace(&d);
  if (d.size() >= 2 && (d.front() == '\'' || d.front() == '"')) d = d.substr(1, d.size() - 2);
  if (d == "<f4" || d == "=f4" || d == "f4") return 4;
  if (d == "<f8" || d == "=f8" || d == "f8") return 8;
  if (d == "<f2" || d == "=f2" || d == "f2") return 2;
  return absl::InvalidArgumentError(
      absl::StrCat("npy: dtype '", d,
                   "' is not supported; use little-endian float32, float64 "
                   "or float16"));
}

// The dimensions of the header's 'shape' tuple: non-negative integers.
absl::StatusOr<std::vector<int64_t>> NpyShape(const std::string& shape_text) {
  absl::string_view s = shape_text;
  if (!absl::ConsumePrefix(&s, "(") || !absl::ConsumeSuffix(&s, ")")) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: shape '", absl::string_view(shape_text).substr(0, 64),
                     shape_text.size() > 64 ? "...'" : "'", " is not a tuple"));
  }
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int64_t dim;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      // Bounded: the header is the file's, and may hold anything up to 64 KiB.
      return absl::InvalidArgumentError(absl::StrCat("npy: bad dimension '", part.substr(0, 32),
                                                     part.size() > 32 ? "...'" : "'"));
    }
    shape.push_back(dim);
  }
  return shape;
}

// Array data is read and converted this many bytes at a time: a multiple of every width, small
// next to the arrays worth a file, large enough that the reads cost little.
constexpr int64_t kChunkBytes = int64_t{1} << 20;

// Where a .npy file's bytes come from: a stream (a file, a pipe) or bytes in memory.
class Source {
 public:
  virtual ~Source() = default;
  // Copies up to `n` bytes to `dst`; fewer only at the end, or when reading failed (failed()).
  virtual size_t Read(char* dst, size_t n) = 0;
  virtual bool failed() const = 0;
  // The bytes left where that is known (in memory), -1 for a stream.
  virtual int64_t remaining() const = 0;
};

class StreamSource final : public Source {
 public:
  explicit StreamSource(std::istream& in) : in_(in) {}
  size_t Read(char* dst, size_t n) override {
    if (n == 0 || !in_) return 0;
    in_.read(dst, static_cast<std::streamsize>(n));
    return static_cast<size_t>(in_.gcount());
  }
  bool failed() const override { return in_.bad(); }
  int64_t remaining() const override { return -1; }

 private:
  std::istream& in_;
};

class BufferSource final : public Source {
 public:
  explicit BufferSource(absl::string_view bytes) : bytes_(bytes) {}
  size_t Read(char* dst, size_t n) override {
    n = std::min(n, bytes_.size());
    if (n > 0) std::memcpy(dst, bytes_.data(), n);
    bytes_.remove_prefix(n);
    return n;
  }
  bool failed() const override { return false; }
  int64_t remaining() const override { return static_cast<int64_t>(bytes_.size()); }

 private:
  absl::string_view bytes_;
};

absl::Status ReadFailed() { return absl::DataLossError("reading the file failed"); }

// The refusal of a file whose first bytes, `start`, are not the magic.
absl::Status NotNpy(absl::string_view start) {
  const std::string magic = absl::StrCat("\"", absl::CHexEscape(kMagic), "\"");
  if (start.empty()) return absl::InvalidArgumentError("not a .npy file: it is empty");
  if (start.size() < kMagic.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a .npy file: it holds only ", start.size(), " bytes (\"", absl::CHexEscape(start),
        "\"), fewer than the magic ", magic, " that starts one"));
  }
  return absl::InvalidArgumentError(absl::StrCat("not a .npy file: it starts with \"",
                                                 absl::CHexEscape(start.substr(0, kMagic.size())),
                                                 "\", not the magic ", magic));
}

// A shape as numpy writes it: "(2, 3)", "(4,)", "()".
std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")");
}

// Appends `count` elements of `width` bytes each (see ElementWidth) as floats.
void AppendFloats(const char* data, size_t count, size_t width, std::vector<float>* out) {
  const size_t start = out->size();
  out->resize(start + count);
  float* values = out->data() + start;
  for (size_t i = 0; i < count; ++i) {
    if (width == 4) {
      std::memcpy(&values[i], data + 4 * i, 4);
    } else if (width == 8) {
      double x;
      std::memcpy(&x, data + 8 * i, 8);
      values[i] = static_cast<float>(x);
    } else {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      values[i] = HalfToFloat(h);
    }
  }
}

// The message refusing a shape of `count` values (a number, or "more than 2^63").
using TooManyValues =
    std::function<std::string(const std::string& shape, const std::string& count)>;

// One .npy file from `source`, header first: nothing of the array is read or allocated before
// the header is valid and its shape holds at most `max_values` values. Then exactly the array's
// bytes are read, and one more to refuse trailing bytes.
// REQUIRES: 0 <= max_values <= INT64_MAX / 8, so that the array's byte count cannot overflow.
absl::StatusOr<FloatTensor> ReadNpyFrom(Source& source, int64_t max_values,
                                        const TooManyValues& too_many) {
  // The preamble: magic (6 bytes), version (2), header length (2 bytes in version 1, 4 after).
  char preamble[12];
  size_t got = source.Read(preamble, 10);
  if (source.failed()) return ReadFailed();
  if (got < kMagic.size() || absl::string_view(preamble, kMagic.size()) != kMagic) {
    return NotNpy(absl::string_view(preamble, got));
  }
  const auto truncated_preamble = [](size_t size) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy file: it ends after ", size,
                     " bytes, inside the preamble (magic, version and header length)"));
  };
  if (got < 10) return truncated_preamble(got);
  const int major = static_cast<unsigned char>(preamble[6]);
  int64_t header_len;
  if (major == 1) {
    header_len =
        static_cast<unsigned char>(preamble[8]) | (static_cast<unsigned char>(preamble[9]) << 8);
  } else if (major == 2 || major == 3) {
    got += source.Read(preamble + 10, 2);
    if (source.failed()) return ReadFailed();
    if (got < 12) return truncated_preamble(got);
    uint32_t len;
    std::memcpy(&len, preamble + 8, 4);
    header_len = len;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy: unsupported format version ", major));
  }
  if (header_len > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("npy: the header claims ", header_len,
                                                   " bytes, more than the ", kMaxNpyHeaderBytes,
                                                   " a .npy header may have here"));
  }
  const size_t preamble_size = got;
  std::string header(static_cast<size_t>(header_len), '\0');
  got = source.Read(header.data(), header.size());
  if (source.failed()) return ReadFailed();
  if (got < header.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .npy file: the header of ", header_len,
        " bytes runs past the end; the file ends after ", preamble_size + got, " bytes"));
  }

  absl::StatusOr<std::map<std::string, std::string>> dict = HeaderDict(header);
  if (!dict.ok()) return dict.status();
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (dict->count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy header lacks '", key, "'"));
    }
  }
  if (dict->at("fortran_order") != "False") {
    return absl::InvalidArgumentError(
        "npy: Fortran-ordered arrays are not supported; save with "
        "numpy.ascontiguousarray");
  }
  absl::StatusOr<size_t> width = ElementWidth(dict->at("descr"));
  if (!width.ok()) return width.status();
  absl::StatusOr<std::vector<int64_t>> shape = NpyShape(dict->at("shape"));
  if (!shape.ok()) return shape.status();
  // The number of values, refused before anything of the array is read or allocated. A zero
  // dimension makes it 0 whatever the others say.
  int64_t count = 1;
  bool overflow = false;
  for (int64_t dim : *shape) overflow |= __builtin_mul_overflow(count, dim, &count);
  if (std::find(shape->begin(), shape->end(), 0) != shape->end()) {
    overflow = false;
    count = 0;
  }
  if (overflow || count > max_values) {
    return absl::InvalidArgumentError(
        too_many(ShapeText(*shape), overflow ? "more than 2^63" : absl::StrCat(count)));
  }
  const int64_t data_bytes = count * static_cast<int64_t>(*width);
  const std::string shape_text = ShapeText(*shape);
  const auto truncated_data = [&](int64_t has) {
    return absl::InvalidArgumentError(absl::StrCat("truncated .npy file: the shape ", shape_text,
                                                   " needs ", data_bytes,
                                                   " bytes of data, the file has ", has));
  };
  const auto trailing = [&](absl::string_view how_many) {
    return absl::InvalidArgumentError(absl::StrCat("npy: the file holds more than the ", data_bytes,
                                                   " bytes of data the shape ", shape_text,
                                                   " needs", how_many));
  };
  // In memory the size is known: a wrong one is refused before anything is converted.
  if (const int64_t left = source.remaining(); left >= 0 && left != data_bytes) {
    return left < data_bytes ? truncated_data(left)
                             : trailing(absl::StrCat(" (it has ", left, ")"));
  }

  FloatTensor out;
  out.shape = *std::move(shape);
  // Address space only: pages are touched as the data arrives, so a header that promises more
  // than the file holds costs no memory.
  out.values.reserve(static_cast<size_t>(count));
  std::string chunk(static_cast<size_t>(std::min(data_bytes, kChunkBytes)), '\0');
  for (int64_t done = 0; done < data_bytes;) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(chunk.size(), data_bytes - done));
    got = source.Read(chunk.data(), want);
    if (source.failed()) return ReadFailed();
    if (got < want) return truncated_data(done + static_cast<int64_t>(got));
    AppendFloats(chunk.data(), want / *width, *width, &out.values);
    done += static_cast<int64_t>(want);
  }
  char extra;
  if (source.Read(&extra, 1) > 0) return trailing("");
  if (source.failed()) return ReadFailed();
  return out;
}

// `status` with "<name>: " before its message; unchanged for an empty name.
absl::Status Named(absl::string_view name, const absl::Status& status) {
  if (name.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(name, ": ", status.message()));
}

}  // namespace

int64_t MaxNpyValuesForMessage(int64_t max_message_bytes) {
  return std::max<int64_t>(1, max_message_bytes / 2);
}

absl::StatusOr<FloatTensor> ParseNpy(absl::string_view bytes) {
  BufferSource source(bytes);
  // A value takes at least 2 bytes, so a shape of more values than there are bytes is wrong;
  // the bound also keeps the array's byte count from overflowing.
  return ReadNpyFrom(source, static_cast<int64_t>(bytes.size()),
                     [&](const std::string& shape, const std::string& count) {
                       return absl::StrCat("npy: the shape ", shape,
                                           " is larger than the file: ", count,
                                           " values, the file has ", bytes.size(), " bytes");
                     });
}

std::string SerializeNpy(const FloatTensor& tensor) {
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    absl::StrAppend(&shape, tensor.shape[i],
                    tensor.shape.size() == 1 || i + 1 < tensor.shape.size() ? "," : "");
    if (i + 1 < tensor.shape.size()) shape += " ";
  }
  shape += ")";
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
  // Pad with spaces so that the data starts on a 64-byte boundary; the header ends in '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(reinterpret_cast<const char*>(tensor.values.data()),
             tensor.values.size() * sizeof(float));
  return out;
}

absl::StatusOr<FloatTensor> ReadNpy(std::istream& in, absl::string_view name,
                                    const NpyLimits& limits) {
  StreamSource source(in);
  const int64_t max_values =
      std::clamp<int64_t>(limits.max_values, 0, std::numeric_limits<int64_t>::max() / 8);
  absl::StatusOr<FloatTensor> tensor =
      ReadNpyFrom(source, max_values, [&](const std::string& shape, const std::string& count) {
        return absl::StrCat("the shape ", shape, " holds ", count,
                            " values; a .npy input is limited to ", max_values, " values (",
                            limits.reason, ")");
      });
  if (!tensor.ok()) return Named(name, tensor.status());
  return tensor;
}

absl::StatusOr<FloatTensor> ReadNpyFile(const std::string& path, const NpyLimits& limits) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open '", path, "': it is a directory; give the path of a file in it"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  return ReadNpy(in, path, limits);
}

absl::Status WriteNpyFile(const std::string& path, const FloatTensor& tensor) {
  return WriteFile(path, SerializeNpy(tensor));
}

}  // namespace attend::client
