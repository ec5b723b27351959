#!/usr/bin/env python3
"""Writes bigram.mtb: a small hand-made bundle (docs/BundleFormat.md, version 1)
for megatron-train's smoke test. The model is a bigram language model,
logits = embedding(tokens) @ W + b, with train_step (forward, backward as
autodiff emits it, accumulate_gradient), eval_step and predict_step.

Usage: make-bigram-bundle.py OUT.mtb   (rerun it when the format changes)
"""
import hashlib
import json
import struct
import sys

V, H, B, S, G = 256, 32, 4, 32, 8


def function(name, kind):
    values, instructions = [], []

    def value(shape, dtype="f32"):
        values.append({"shape": shape, "dtype": dtype})
        return len(values) - 1

    def inst(op, operands=(), results=(), attrs=None, free=()):
        i = {"op": op}
        if operands:
            i["operands"] = list(operands)
        if results:
            i["results"] = list(results)
        if attrs:
            i["attrs"] = attrs
        if free:
            i["free"] = list(free)
        instructions.append(i)

    tokens = value([B, S], "i32")
    inputs = [tokens]
    table, w, b = value([V, H]), value([H, V]), value([V])
    for index, param in enumerate((table, w, b)):
        inst("get_parameter", results=[param], attrs={"parameter": index})
    x = value([B, S, H])
    inst("embedding", [table, tokens], [x])
    logits = value([B, S, V])
    inst("linear", [x, w, b], [logits])
    if kind == "predict":
        return {"name": name, "inputs": inputs, "outputs": [logits],
                "values": values, "instructions": instructions}
    labels = value([B, S], "i32")
    inputs.append(labels)
    loss = value([])
    mean = {"reduction": "mean"}
    inst("cross_entropy", [logits, labels], [loss], mean)
    if kind == "train":
        one = value([])
        inst("fill", results=[one], attrs={"value": 1.0})
        dlogits = value([B, S, V])
        inst("cross_entropy_grad", [one, logits, labels], [dlogits], mean,
             free=[one, logits])
        dw, db, dx, dtable = value([H, V]), value([V]), value([B, S, H]), value([V, H])
        inst("linear_weight_grad", [x, dlogits], [dw])
        inst("bias_grad", [dlogits], [db])
        inst("linear", [dlogits, w], [dx], {"transpose_weight": True},
             free=[dlogits])
        inst("embedding_grad", [dx, tokens], [dtable], free=[dx, x])
        for index, grad in enumerate((dtable, dw, db)):
            inst("accumulate_gradient", [grad], attrs={"parameter": index},
                 free=[grad])
    return {"name": name, "inputs": inputs, "outputs": [loss],
            "values": values, "instructions": instructions}


manifest = {
    "format": "megatron-bundle", "version": 1,
    "producer": "runtime/test/data/make-bigram-bundle.py",
    "model": {"name": "bigram", "num_layers": 0, "hidden_size": H,
              "num_attention_heads": 1, "num_query_groups": 1,
              "ffn_hidden_size": H, "seq_length": S, "vocab_size": V,
              "padded_vocab_size": V, "micro_batch_size": B,
              "global_batch_size": G, "tensor_model_parallel_size": 1,
              "pipeline_model_parallel_size": 1, "data_parallel_size": 1,
              "precision": "fp32"},
    "parameters": [
        {"name": "embedding.word_embeddings.weight", "shape": [V, H],
         "dtype": "f32", "init": "normal", "std": 0.02, "weight_decay": True},
        {"name": "output_layer.weight", "shape": [H, V], "dtype": "f32",
         "init": "normal", "std": 0.02, "weight_decay": True},
        {"name": "output_layer.bias", "shape": [V], "dtype": "f32",
         "init": "zeros", "weight_decay": False}],
    "functions": [function("train_step", "train"),
                  function("eval_step", "eval"),
                  function("predict_step", "predict")],
}
text = json.dumps(manifest, sort_keys=True).encode()
header = (b"MTBUNDLE" + struct.pack("<IIQQ", 1, 0, len(text), 0)
          + hashlib.sha256(text).digest())
with open(sys.argv[1], "wb") as out:
    out.write(header + text)
