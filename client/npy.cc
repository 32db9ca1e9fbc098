#include "client/npy.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

// The header dict of a .npy file's bytes (format versions 1-3); *data_offset is where the
// array's bytes start.
absl::StatusOr<absl::string_view> NpyHeader(absl::string_view bytes, size_t* data_offset) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError("not a .npy file (missing the \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len;
  size_t offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError("npy: truncated header length");
    uint32_t len;
    std::memcpy(&len, bytes.data() + 8, 4);
    header_len = len;
    offset = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy: unsupported format version ", major));
  }
  if (header_len > bytes.size() - offset) {
    return absl::InvalidArgumentError("npy: header runs past the end of the file");
  }
  *data_offset = offset + header_len;
  return bytes.substr(offset, header_len);
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

// The dimensions of the header's 'shape' tuple, whose element count may not exceed
// `file_size` (a cheap bound that keeps the product from overflowing).
absl::StatusOr<std::vector<int64_t>> NpyShape(const std::string& shape_text, size_t file_size) {
  absl::string_view s = shape_text;
  if (!absl::ConsumePrefix(&s, "(") || !absl::ConsumeSuffix(&s, ")")) {
    return absl::InvalidArgumentError(absl::StrCat("npy: shape '", shape_text, "' is not a tuple"));
  }
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int64_t dim;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy: bad dimension '", part, "'"));
    }
    if (dim > 0 && count > static_cast<int64_t>(file_size) / dim) {
      return absl::InvalidArgumentError("npy: shape is larger than the file");
    }
    count *= dim;
    shape.push_back(dim);
  }
  return shape;
}

// `count` elements of `width` bytes each (see ElementWidth) as floats.
std::vector<float> ToFloats(const char* data, int64_t count, size_t width) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
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
  return values;
}

}  // namespace

absl::StatusOr<FloatTensor> ParseNpy(absl::string_view bytes) {
  size_t offset = 0;
  absl::StatusOr<absl::string_view> header = NpyHeader(bytes, &offset);
  if (!header.ok()) return header.status();
  absl::StatusOr<std::map<std::string, std::string>> dict = HeaderDict(*header);
  if (!dict.ok()) return dict.status();
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (dict->count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy header lacks '", key, "'"));
    }
  }
  const std::string& descr = dict->at("descr");
  const std::string& fortran = dict->at("fortran_order");
  const std::string& shape_text = dict->at("shape");
  if (fortran != "False") {
    return absl::InvalidArgumentError(
        "npy: Fortran-ordered arrays are not supported; save with "
        "numpy.ascontiguousarray");
  }
  absl::StatusOr<size_t> width = ElementWidth(descr);
  if (!width.ok()) return width.status();
  absl::StatusOr<std::vector<int64_t>> shape = NpyShape(shape_text, bytes.size());
  if (!shape.ok()) return shape.status();
  int64_t count = 1;
  for (int64_t dim : *shape) count *= dim;
  if (static_cast<size_t>(count) * *width != bytes.size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat("npy: shape needs ", count * *width,
                                                   " bytes of data, the file has ",
                                                   bytes.size() - offset));
  }
  FloatTensor out;
  out.shape = *std::move(shape);
  out.values = ToFloats(bytes.data() + offset, count, *width);
  return out;
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

absl::StatusOr<FloatTensor> ReadNpyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<FloatTensor> tensor = ParseNpy(buffer.str());
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat(path, ": ", tensor.status().message()));
  }
  return tensor;
}

absl::Status WriteNpyFile(const std::string& path, const FloatTensor& tensor) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string bytes = SerializeNpy(tensor);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace attend::client
