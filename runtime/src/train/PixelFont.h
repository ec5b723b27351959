// A 5x7 pixel font for the labels of the training plots: digits, the
// symbols of numbers and the capital letters.
#ifndef MTRT_SRC_TRAIN_PIXELFONT_H
#define MTRT_SRC_TRAIN_PIXELFONT_H

#include <cstdint>

namespace mtrt::train {

constexpr int kGlyphWidth = 5, kGlyphHeight = 7;

/// The rows of `c`'s glyph, top first, bit 4 the leftmost pixel; lower-case
/// letters are drawn as capitals and unknown characters as a box.
const uint8_t *glyphRows(char c);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_PIXELFONT_H
