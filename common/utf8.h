// UTF-8 well-formedness, one sequence at a time: what the JSON parser needs to reject bad text
// and what the CLI's SVG writer needs to cut labels between characters.
//
// Thread-safety: pure functions.
#ifndef ATTEND_COMMON_UTF8_H_
#define ATTEND_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace attend::utf8 {

// Length of the well-formed UTF-8 sequence that starts at text[i] (1 for ASCII), or 0 when the
// bytes there are not one (bad lead or continuation byte, overlong form, surrogate, above
// U+10FFFF, cut short); *code_point (optional) receives the character.
// REQUIRES: i < text.size().
size_t SequenceAt(absl::string_view text, size_t i, uint32_t* code_point = nullptr);

}  // namespace attend::utf8

#endif  // ATTEND_COMMON_UTF8_H_
