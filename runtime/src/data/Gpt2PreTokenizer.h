// GPT-2's pre-tokenizer: splits text into the chunks that byte-level BPE
// then encodes one by one.
#ifndef MTRT_SRC_DATA_GPT2PRETOKENIZER_H
#define MTRT_SRC_DATA_GPT2PRETOKENIZER_H

#include <string_view>
#include <vector>

namespace mtrt::data {

/// Splits UTF-8 `text` into chunks as GPT-2's pattern
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// does, scanning left to right and taking at each position the first
/// alternative that matches:
/// - the contractions 's 't 're 've 'm 'll 'd (ASCII apostrophe, lower
///   case only);
/// - a run of letters (Unicode category L), a run of numbers (category N),
///   or a run of other characters (neither letters, numbers nor white
///   space), each with one optional leading U+0020 space;
/// - a run of white space (the Unicode White_Space property): all of it at
///   the end of the text or before more white space; otherwise all but its
///   last character, which then leads the next chunk when it is a space,
///   or is a chunk of its own (so "a  b" is "a", " ", " b").
/// The chunks are views into `text` and cover it exactly, in order.
/// Throws Error (INVALID_ARGUMENT) naming the byte offset of invalid UTF-8.
std::vector<std::string_view> splitGpt2Chunks(std::string_view text);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_GPT2PRETOKENIZER_H
