#!/usr/bin/env python3
"""The tiny Hugging Face MoE models' training step against transformers'.

Standard library only (the build machine has no numpy or torch).

  hf-moe-step.py dataset CORPUS PREFIX
      writes CORPUS's bytes as one document of an indexed dataset
      PREFIX.{bin,idx} (docs/IndexedDataset.md; int32 tokens), so that a
      model of fewer than 256 tokens reads them (the ByteTokenizer of a text
      --data-path needs 256).
  hf-moe-step.py fuse IN OUT [DROP]
      rewrites the hub-named IN as transformers 5 holds the experts in
      memory: model.layers.L.mlp.gate.weight, mlp.experts.gate_up_proj
      [E, 2 I, H] (gate rows first) and mlp.experts.down_proj [E, H, I];
      DROP, a tensor name, is left out (for the error of a missing one).
  hf-moe-step.py compare REFERENCE_DIR LOG_JSONL AFTER_STEP TOLERANCE
      compares megatron-train's first logged loss with reference.txt's
      loss-f64, and every parameter of AFTER_STEP (megatron-train
      --save-weights: the bundle's names, experts as [E, out, in]) with
      REFERENCE_DIR/after-step.safetensors (the hub's per-expert names),
      each tensor's relative L2 error and the largest element's; fails when
      a relative error is above TOLERANCE or a tensor is missing.
  hf-moe-step.py compare-hub REFERENCE_DIR AFTER_STEP TOLERANCE
      the same for the weights, AFTER_STEP written in the hub's per-expert
      names (--save-weights-experts mixtral or qwen3-moe): every name of
      after-step.safetensors and no other.
"""
import json
import math
import re
import struct
import sys


def write_dataset(corpus, prefix):
    with open(corpus, "rb") as f:
        tokens = list(f.read())
    with open(prefix + ".bin", "wb") as f:
        f.write(struct.pack("<%di" % len(tokens), *tokens))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, 4, 1, 2))
        f.write(struct.pack("<i", len(tokens)))
        f.write(struct.pack("<q", 0))
        f.write(struct.pack("<2q", 0, 1))


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        fmt = {"F32": "f", "F64": "d"}[info["dtype"]]
        count = (end - begin) // struct.calcsize(fmt)
        out[name] = (info["shape"], struct.unpack_from(
            "<%d%s" % (count, fmt), blob, 8 + size + begin))
    return out


HUB = [
    (r"model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight",
     "model.layers.{0}.mlp.gate.weight"),
    (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w1\.weight",
     "model.layers.{0}.mlp.experts.gate_proj.weight"),
    (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w3\.weight",
     "model.layers.{0}.mlp.experts.up_proj.weight"),
    (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w2\.weight",
     "model.layers.{0}.mlp.experts.down_proj.weight"),
    (r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight",
     "model.layers.{0}.mlp.experts.{2}_proj.weight"),
]


def stacked(reference):
    """The hub's per-expert tensors stacked as the bundle's [E, out, in]."""
    out, experts = {}, {}
    for name, (shape, values) in reference.items():
        for pattern, target in HUB:
            m = re.fullmatch(pattern, name)
            if not m:
                continue
            groups = m.groups()
            if len(groups) == 1:
                out[target.format(*groups)] = (shape, values)
            else:
                key = target.format(*groups)
                experts.setdefault(key, {})[int(groups[1])] = (shape, values)
            break
        else:
            out[name] = (shape, values)
    for key, parts in experts.items():
        shape = [len(parts)] + parts[0][0]
        values = []
        for e in range(len(parts)):
            values += parts[e][1]
        out[key] = (shape, tuple(values))
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        shape, values = tensors[name]
        data = struct.pack("<%df" % len(values), *values)
        header[name] = dict(dtype="F32", shape=list(shape),
                            data_offsets=[offset, offset + len(data)])
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def fuse(source, target, drop=None):
    tensors = stacked(read_safetensors(source))
    out = {}
    for name, value in tensors.items():
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(gate|up|down)"
                         r"_proj\.weight", name)
        if not m:
            out[name] = value
        elif m.group(2) == "down":
            out[m.group(1) + ".down_proj"] = value
        elif m.group(2) == "gate":
            (e, rows, cols), gate = value
            up = tensors[m.group(1) + ".up_proj.weight"][1]
            fused = []
            for k in range(e):
                fused += gate[k * rows * cols:(k + 1) * rows * cols]
                fused += up[k * rows * cols:(k + 1) * rows * cols]
            out[m.group(1) + ".gate_up_proj"] = ([e, 2 * rows, cols], fused)
    out.pop(drop, None)
    write_safetensors(target, out)


def compare(reference_dir, log, after, tolerance):
    ok = True
    with open(reference_dir + "/reference.txt") as f:
        want = float(f.readline().split()[1])
    with open(log) as f:
        got = json.loads(f.readline())["loss"]
    rel = abs(got - want) / abs(want)
    print("loss: transformers %.9f, megatron-train %.9f, relative %.2g"
          % (want, got, rel))
    ok &= rel <= tolerance
    reference = stacked(read_safetensors(reference_dir +
                                         "/after-step.safetensors"))
    ok &= compare_tensors(reference, read_safetensors(after), tolerance)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


def compare_hub(reference_dir, after, tolerance):
    """AFTER in the hub's per-expert names (--save-weights-experts) against
    the reference's after-step weights, name by name."""
    ok = compare_tensors(read_safetensors(reference_dir +
                                          "/after-step.safetensors"),
                         read_safetensors(after), tolerance)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


def compare_tensors(reference, ours, tolerance):
    ok = True
    worst = 0.0
    for name in sorted(reference):
        shape, values = reference[name]
        if name not in ours:
            print("missing %s" % name)
            ok = False
            continue
        got_shape, got_values = ours[name]
        if list(got_shape) != list(shape):
            print("%s: shape %s, expected %s" % (name, got_shape, shape))
            ok = False
            continue
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(got_values, values)))
        norm = math.sqrt(sum(b * b for b in values))
        worst = max(worst, diff / norm)
        if diff / norm > tolerance:
            print("%s: relative L2 error %.3g" % (name, diff / norm))
            ok = False
    extra = sorted(set(ours) - set(reference))
    if extra:
        print("not in the reference: %s" % ", ".join(extra))
        ok = False
    print("weights after one AdamW step: %d tensors, largest relative L2 "
          "error %.2g" % (len(reference), worst))
    return ok


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "dataset":
        write_dataset(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) in (4, 5) and sys.argv[1] == "fuse":
        fuse(*sys.argv[2:])
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "compare-hub":
        return compare_hub(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    if len(sys.argv) == 6 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3], sys.argv[4],
                       float(sys.argv[5]))
    sys.exit(__doc__)


sys.exit(main())
