#!/usr/bin/env python3
"""Builds small tokenizer directories shaped like those of Llama 3, Qwen2.5,
Llama 2 and Mistral, with the ids that the `tokenizers` library gives them.

The published files cannot be fetched where this runs (no network), so each
family's tokenizer.json is rebuilt with its exact pipeline (normalizer,
pre-tokenizer regex, model flags, post-processor, decoder, added tokens) around
a small BPE trained on data/corpus.txt and unicode.txt. Only the vocabulary and
merges are smaller than the published ones.

usage: make-tokenizers.py OUT
writes OUT/tokenizers.tar.gz holding, per family, FAMILY/tokenizer.json,
FAMILY/tokenizer_config.json and FAMILY/ids.json, and prints a summary
(with whether transformers' AutoTokenizer gives the same ids).

ids.json: for "corpus" and "unicode", "ids" (tokenizers' encode, special
tokens added as the post-processor adds them, as Megatron-LM's
HuggingFaceTokenizer does) and "decoded" (tokenizers' decode of those ids,
special tokens kept), or null where that equals the input text; "cases":
[text, ids] for short texts at the corners.
"""
import io
import json
import os
import sys
import tarfile
import tempfile

import tokenizers
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

# The published pre-tokenizer patterns.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                  r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                  r"\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                 r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# (content, special) in Qwen2.5's order; the tool and fill-in-the-middle
# tokens are added tokens that are not special.
QWEN2_ADDED = [(t, True) for t in [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>"]] + [(t, False) for t in [
        "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
        "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]]

VOCAB_SIZE = 2000

# Short texts at the corners: empty and white space only, spaces before and
# after, contractions in upper case and with a long s, digit runs, added
# tokens back to back and inside words, composed and decomposed accents,
# emoji, and the white space that Unicode and the regex engines disagree on.
CASES = [
    "", " ", "  ", "a", " a", "  a", "a ", "a  ", "\n", " \n ", "\n\n\n",
    "hello world", "Hello  World!!", "I'M", "'S", "x'\u017ft", "we'Ll",
    "123456789", "1.5e-10", "\t\ttab", "<s>", "<s> hi", " <s>hi",
    "</s></s>", "<|endoftext|><|endoftext|>", "a<|im_start|>b",
    "<|begin_of_text|> x", "<tool_call>", "\u00e9", "e\u0301",
    "\U0001f916", "\u0085", "a\u180eb", "a\u3000 b", "a\u00a0b",
    "\r\n\r\n", "x \r\n y", "  \t\n  x", "\u2581", "<0x41>",
]


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def added(i, content, special=True):
    return {"id": i, "content": content, "single_word": False,
            "lstrip": False, "rstrip": False, "normalized": False,
            "special": special}


def template(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id],
                                     "tokens": [bos]}}}


def bpe_model(vocab, merges, string_merges, **flags):
    model = {"type": "BPE", "dropout": None, "unk_token": None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False}
    model.update(flags)
    model["vocab"] = vocab
    # Files before tokenizers 0.20 (and most published ones) write a merge
    # as "a b"; later ones as ["a", "b"].
    model["merges"] = ([" ".join(m) for m in merges] if string_merges
                       else [list(m) for m in merges])
    return model


def merge_pairs(model):
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
            for m in model["merges"]]


def train_byte_level(pattern, texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], merge_pairs(model)


def llama3(texts):
    vocab, merges = train_byte_level(LLAMA3_PATTERN, texts)
    first = len(vocab)
    bos = first
    tokens = [added(first + i, t) for i, t in enumerate(LLAMA3_SPECIALS)]
    config = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": tokens, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False,
             "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True,
             "trim_offsets": False, "use_regex": True},
            template("<|begin_of_text|>", bos)]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": bpe_model(vocab, merges, True, ignore_merges=True)}
    tokenizer_config = {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"}
    return config, tokenizer_config


def qwen25(texts):
    vocab, merges = train_byte_level(QWEN2_PATTERN, texts)
    first = len(vocab)
    tokens = [added(first + i, t, special)
              for i, (t, special) in enumerate(QWEN2_ADDED)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False,
                  "trim_offsets": False, "use_regex": False}
    config = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": tokens, "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN},
             "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": bpe_model(vocab, merges, False,
                           continuing_subword_prefix="",
                           end_of_word_suffix="")}
    tokenizer_config = {
        "add_prefix_space": False, "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None}
    return config, tokenizer_config


def train_sentencepiece_style(texts):
    """A BPE over characters with "▁" for spaces, as SentencePiece trains
    Llama 2's: <unk> <s> </s>, then the 256 byte tokens <0x00>..<0xFF>, then
    the merged tokens. limit_alphabet leaves the rarest characters out of the
    vocabulary, so that they take the byte fallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 256, show_progress=False, limit_alphabet=150,
        special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(texts, trainer)
    model = json.loads(tok.to_str())["model"]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    names = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    names += [t for t, _ in trained if t not in ("<unk>", "<s>", "</s>")]
    vocab = {t: i for i, t in enumerate(names)}
    assert len(vocab) == len(names)
    return vocab, merge_pairs(model)


SP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def sentencepiece_style(vocab, merges, metaspace):
    config = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"),
                         added(2, "</s>")],
        "normalizer": None if metaspace else {
            "type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "},
                 "content": "\u2581"}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False}
        if metaspace else None,
        "post_processor": template("<s>", 1),
        "decoder": SP_DECODER,
        "model": bpe_model(vocab, merges, True, unk_token="<unk>",
                           fuse_unk=True, byte_fallback=True)}
    tokenizer_config = {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
        "clean_up_tokenization_spaces": False, "eos_token": "</s>",
        "legacy": not metaspace, "model_max_length": 1000000000000000019884624838656,
        "pad_token": None, "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
        "use_default_system_prompt": False}
    return config, tokenizer_config


def transformers_ids(directory, texts):
    """transformers' ids for the same directory, as Megatron-LM's
    HuggingFaceTokenizer gets them (AutoTokenizer, then __call__)."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(directory)
        return [tok(t)["input_ids"] for t in texts], type(tok).__name__
    except Exception as e:  # the summary says why
        return None, "%s: %s" % (type(e).__name__, e)


def main():
    out = sys.argv[1]
    corpus = read(os.path.join(ROOT, "data", "corpus.txt"))
    unicode_text = read(os.path.join(HERE, "unicode.txt"))
    texts = [corpus, unicode_text]
    families = {"llama3": llama3(texts), "qwen2.5": qwen25(texts)}
    sp_vocab, sp_merges = train_sentencepiece_style(texts)
    families["llama2"] = sentencepiece_style(sp_vocab, sp_merges, False)
    families["mistral"] = sentencepiece_style(sp_vocab, sp_merges, True)

    summary = {"tokenizers": tokenizers.__version__}
    scratch = tempfile.mkdtemp()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))

        for name, (config, tokenizer_config) in families.items():
            text = json.dumps(config, ensure_ascii=False, indent=2)
            try:
                tok = Tokenizer.from_str(text)
            except Exception as e:  # the summary says which one and why
                summary[name] = "%s: %s" % (type(e).__name__, e)
                continue
            directory = os.path.join(scratch, name)
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "tokenizer.json"), "w",
                      encoding="utf-8") as f:
                f.write(text)
            with open(os.path.join(directory, "tokenizer_config.json"), "w",
                      encoding="utf-8") as f:
                json.dump(tokenizer_config, f, indent=2)
            ids = {}
            entry = {"vocab_size": tok.get_vocab_size(with_added_tokens=True)}
            encoded = [tok.encode(t).ids for t in texts]
            hf_ids, hf_class = transformers_ids(directory, texts)
            entry["transformers_class"] = hf_class
            for key, t, e in zip(("corpus", "unicode"), texts, encoded):
                decoded = tok.decode(e, skip_special_tokens=False)
                ids[key] = {"ids": e,
                            "decoded": None if decoded == t else decoded}
                entry[key] = {"ids": len(e), "decodes_to_input": decoded == t}
            entry["transformers_equal"] = (hf_ids == encoded
                                           if hf_ids is not None else None)
            ids["cases"] = [[t, tok.encode(t).ids] for t in CASES]
            summary[name] = entry
            add(name + "/tokenizer.json", text.encode("utf-8"))
            add(name + "/tokenizer_config.json",
                (json.dumps(tokenizer_config, indent=2) + "\n").encode())
            add(name + "/ids.json", (json.dumps(
                ids, ensure_ascii=False, separators=(",", ":")) + "\n")
                .encode("utf-8"))
    with open(os.path.join(out, "tokenizers.tar.gz"), "wb") as f:
        f.write(archive.getvalue())
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
