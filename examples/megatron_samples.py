"""megatron-train's training samples, in its order, for trainers that feed
a compiled step themselves.

It follows the runtime's documented formulas (runtime/src/train/
GptDataset.h and runtime/src/core/Random.h): the byte-level tokenizer (one
token per byte), Megatron-LM's --split into train/validation/test ranges,
windows of seq_length + 1 tokens at a stride of seq_length, and a
Fisher-Yates shuffle per epoch from the counter-based splitmix64 generator
keyed on (seed, epoch). With the same seed, sample i here is sample i of
megatron-train, so a trainer fed from it takes megatron-train's steps.
"""

MASK = (1 << 64) - 1
SHUFFLE_STREAM = 0x53485546464C4500  # "SHUFFLE"


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def stream_key(seed, stream):
    return mix64(mix64(seed ^ 0x6A09E667F3BCC909) ^ (stream & MASK))


def bits_from_key(key, index):
    return mix64((key + (index + 1) * 0x9E3779B97F4A7C15) & MASK)


def split_ranges(weights, size):
    """Megatron-LM's get_train_valid_test_split_: [begin, end) per part."""
    total = sum(weights)
    index = [0]
    for w in weights:
        # C++ llround: halves away from zero (the shares are non-negative).
        index.append(index[-1] + int(w / total * size + 0.5))
    diff = index[-1] - size
    index = [index[0]] + [i - diff for i in index[1:]]
    return [(max(index[i], 0), max(index[i + 1], 0)) for i in range(3)]


class GptSamples:
    """Samples of one part of a byte corpus: inputs and labels of
    seq_length tokens each, in megatron-train's order (shuffled per epoch
    for the training part, in order otherwise)."""

    def __init__(self, corpus_bytes, seq_length, seed=1234, split=(969, 30, 1),
                 part=0):
        begin, end = split_ranges(split, len(corpus_bytes))[part]
        self.tokens = corpus_bytes
        self.begin = begin
        self.seq_length = seq_length
        self.windows = (end - begin - 1) // seq_length if end - begin > seq_length else 0
        if self.windows == 0:
            raise ValueError(f"part {part} of the corpus has {end - begin} tokens; a "
                             f"sample needs seq_length + 1 = {seq_length + 1}")
        self.seed = seed
        self.shuffle = part == 0
        self._epoch = -1
        self._permutation = None

    def window(self, sample):
        epoch, position = divmod(sample, self.windows)
        if not self.shuffle:
            return position
        if epoch != self._epoch:
            permutation = list(range(self.windows))
            key = stream_key(self.seed, SHUFFLE_STREAM + epoch)
            for i in range(self.windows - 1, 0, -1):
                j = (bits_from_key(key, i) * (i + 1)) >> 64
                permutation[i], permutation[j] = permutation[j], permutation[i]
            self._epoch, self._permutation = epoch, permutation
        return self._permutation[position]

    def __getitem__(self, sample):
        """(inputs, labels) of global sample `sample` as lists of ints."""
        start = self.begin + self.window(sample) * self.seq_length
        window = self.tokens[start:start + self.seq_length + 1]
        return list(window[:-1]), list(window[1:])
