"""Checks the memory plans of a bundle manifest (megatron-compile --emit plan)
independently of the compiler and the runtime: every block inside the arena,
no two live blocks sharing a byte unless the later one is a result computed
in place of an operand that dies at its instruction (side buffers: live from
their instruction through `until`, never shared), and the arena no larger
than the blocks need. Prints per function the arena, the in-place results,
the bytes reuse saves against one block per value and side buffer, and the
side buffers:
how many (of them bf16 copies of GEMM operands), and their largest block, and
the attention views: values inside another's block (`views`), each group one
block, the whole's, live from its first member's definition through its
members' last use.

Usage: check-memory-plan.py MANIFEST.json
"""
import json
import sys

IN_PLACE = {"add", "mul", "gelu", "gelu_grad", "silu", "silu_grad", "swiglu",
            "dropout", "bias_add", "reshape"}
SIZES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "i32": 4, "i64": 8}


def nbytes(value):
    n = 1
    for d in value["shape"]:
        n *= d
    return n * SIZES[value["dtype"]]


manifest = json.load(open(sys.argv[1]))
for fn in manifest["functions"]:
    plan = fn["memory_plan"]
    offsets, values = plan["offsets"], fn["values"]
    count = len(values)
    start = {v: -1 for v in fn["inputs"]}
    end = {}
    for i, inst in enumerate(fn["instructions"]):
        for r in inst.get("results", []):
            start[r] = i
        for v in inst.get("free", []):
            end[v] = i
    n = len(fn["instructions"])
    # Views: each inside its whole's block; the group is the whole's block,
    # live over the union of its members' lives.
    views = plan.get("views", [])
    whole_of = {}
    for v, whole, off in views:
        assert v not in whole_of, (fn["name"], v)
        whole_of[v] = whole
    for v, whole, off in views:
        assert whole not in whole_of, (fn["name"], whole)
        assert 0 <= off < nbytes(values[whole]), (fn["name"], v)
        assert offsets[v] == offsets[whole] + off, (fn["name"], v)
        start[whole] = min(start[whole], start[v])
        end[whole] = max(end.get(whole, n), end.get(v, n))
    side = plan.get("side_buffers", [])
    in_place, top = 0, 0
    for v in range(count):
        if offsets[v] < 0 or v in whole_of:
            continue
        assert offsets[v] % plan["alignment"] == 0, (fn["name"], v)
        assert offsets[v] + nbytes(values[v]) <= plan["arena_bytes"], v
        top = max(top, offsets[v] + nbytes(values[v]))
    # Side buffers: ("side", index) blocks, live [instruction, until]; one
    # copy per value, made by an instruction that reads it.
    side_at, side_until, side_range, copied = {}, {}, {}, set()
    for k, (position, offset, size, until, copy_of) in enumerate(side):
        assert position <= until < n, (fn["name"], k)
        assert offset % plan["alignment"] == 0 and size > 0, (fn["name"], k)
        assert offset + size <= plan["arena_bytes"], (fn["name"], k)
        if copy_of >= 0:
            assert copy_of not in copied, (fn["name"], k)
            assert copy_of in fn["instructions"][position]["operands"], k
            copied.add(copy_of)
        side_at.setdefault(position, []).append(("side", k))
        side_until[("side", k)] = until
        side_range[("side", k)] = (offset, offset + size)
        top = max(top, offset + size)

    def span(block):
        if block in side_range:
            return side_range[block]
        return offsets[block], offsets[block] + nbytes(values[block])
    aligned_top = -(-top // plan["alignment"]) * plan["alignment"]
    assert plan["arena_bytes"] <= aligned_top, (plan["arena_bytes"], top)
    by_def = {}
    for v in range(count):
        if offsets[v] >= 0 and nbytes(values[v]) > 0 and v not in whole_of:
            by_def.setdefault(start[v], []).append(v)
    live = []
    for i in range(-1, n):
        inst = fn["instructions"][i] if i >= 0 else None
        placed = by_def.get(i, []) + side_at.get(i, [])
        for v in placed:
            lo, hi = span(v)
            for u in list(live):
                ulo, uhi = span(u)
                if ulo < hi and lo < uhi:
                    ok = (inst and inst["op"] in IN_PLACE and
                          v == inst["results"][0] and
                          u in inst.get("operands", []) and
                          end.get(u) == i and ulo == lo and uhi == hi)
                    assert ok, f"{fn['name']}: block {v} overlaps {u} at {i}"
                    live.remove(u)
                    in_place += 1
            live.append(v)
        if inst:
            live = [u for u in live
                    if (side_until[u] if u in side_until
                        else end.get(u, n)) != i]
    total = sum(nbytes(values[v]) for v in range(count)
                if offsets[v] >= 0 and v not in whole_of)
    total += sum(entry[2] for entry in side)
    print(f"{fn['name']}: arena {plan['arena_bytes']} bytes, {in_place} "
          f"results in place, reuse saves {total - plan['arena_bytes']} of "
          f"{total} bytes; {len(side)} side buffers ({len(copied)} copies), "
          f"largest {max((e[2] for e in side), default=0)} bytes; "
          f"{len(views)} views in {len(set(whole_of.values()))} groups")
