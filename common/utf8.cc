#include "common/utf8.h"

namespace attend::utf8 {

size_t SequenceAt(absl::string_view text, size_t i, uint32_t* code_point) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = at(i);
  if (lead < 0x80) {
    if (code_point) *code_point = lead;
    return 1;
  }
  size_t length;
  uint32_t cp;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0Fu;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07u;
  } else {
    return 0;  // a continuation byte, or a lead that can only start an overlong or huge form
  }
  if (text.size() - i < length) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((at(i + k) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3Fu);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < smallest[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  if (code_point) *code_point = cp;
  return length;
}

}  // namespace attend::utf8
