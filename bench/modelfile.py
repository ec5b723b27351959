"""Reads a model file (models/*.yaml) for the bench scripts, and counts what
MFU needs, as ../shared/DESIGN.md defines it:

    MFU = (6 N + 12 L h s) * tokens/s / 989 TFLOP/s,

N = the parameters without the position embeddings, counted as the bundle
holds them (the vocabulary padded to make_vocab_size_divisible_by, one rank).
torch_step.py, summarize.py and step_table.py all use this one definition.
"""
import yaml

H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of an H100/H200 SXM


def load(path, overrides=None):
    """The model section of PATH as a dict, with the defaults models/README.md
    gives for the keys the bench needs, and derived fields: padded_vocab,
    head_dim, query_groups, llama (RMSNorm + RoPE + SwiGLU)."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    model = dict(doc.get("model", {}))
    model.update(overrides or {})
    model["micro_batch_size"] = doc.get("batch", {}).get("micro_batch_size", 1)
    model.setdefault("num_query_groups", model["num_attention_heads"])
    model.setdefault("ffn_hidden_size", 4 * model["hidden_size"])
    model.setdefault("make_vocab_size_divisible_by", 128)
    model.setdefault("untie_embeddings_and_output_weights", False)
    model.setdefault("add_bias_linear", True)
    model.setdefault("norm_epsilon", 1e-5)
    model.setdefault("rotary_base", 10000)
    model.setdefault("init_method_std", 0.02)
    multiple = model["make_vocab_size_divisible_by"]
    model["padded_vocab"] = -(-model["vocab_size"] // multiple) * multiple
    model["head_dim"] = model["hidden_size"] // model["num_attention_heads"]
    model["llama"] = model.get("position_embedding_type") == "rope"
    if model["llama"] and (model.get("normalization") != "RMSNorm" or
                           model.get("activation") != "swiglu" or
                           model["add_bias_linear"]):
        raise ValueError(f"{path}: the bench's Llama is RMSNorm, RoPE, SwiGLU "
                         f"without biases; this file mixes them")
    return model


def parameters(m):
    """Every parameter the bundle holds (padded vocabulary)."""
    h, layers, ffn = m["hidden_size"], m["num_layers"], m["ffn_hidden_size"]
    v = m["padded_vocab"]
    q = m["num_attention_heads"] * m["head_dim"]
    kv = m["num_query_groups"] * m["head_dim"]
    tables = v * h * (2 if m["untie_embeddings_and_output_weights"] else 1)
    if m["llama"]:
        # q, k, v, o, gate, up, down; two RMSNorm weights; the final norm.
        return tables + layers * (h * (q + 2 * kv) + q * h + 3 * h * ffn +
                                  2 * h) + h
    bias = m["add_bias_linear"]
    per_layer = (h * (q + 2 * kv) + q * h + 2 * h * ffn + 4 * h +
                 (q + 2 * kv + h + ffn + h if bias else 0))
    return tables + m["seq_length"] * h + layers * per_layer + 2 * h


def flops_per_token(m):
    """6 N + 12 L h s, N without the position embeddings."""
    n = parameters(m) - (0 if m["llama"] else m["seq_length"] *
                         m["hidden_size"])
    return 6 * n + 12 * m["num_layers"] * m["hidden_size"] * m["seq_length"]


def mfu(m, tokens_per_second):
    return flops_per_token(m) * tokens_per_second / H200_BF16_PEAK
