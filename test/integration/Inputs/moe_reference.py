#!/usr/bin/env python3
"""Checks the MoE router, its capacity dropping and its auxiliary losses
against a float64 reference written from Megatron-LM's definitions
(moe-reference.test).

Usage: moe_reference.py MODE OUTPUT.txt

OUTPUT.txt is `mtrt-run --fp64` printing a function's outputs: the router
logits [T, E], then mt.moe_route's weights and indices, then
mt.moe_aux_loss and mt.moe_z_loss. MODE is
score,normalize,topk,capacity_factor,drop_policy,aux_coeff,z_coeff
(capacity_factor 0: dropless), optionally followed by ,groups=G:K
(group-limited routing: G groups, the top-k within the best K), ,seq=S
(the sequence-level aux loss over sequences of S consecutive tokens) and
,bias=1 (aux-loss-free balancing: the function also returns the expert
bias [E] that the top-k adds to the sigmoids, then mt.moe_tokens_per_expert
of the indices, which must be each expert's kept slots).
Recomputes everything in pure Python from the printed logits and exits 1
unless the indices are equal and the weights and losses agree to 1e-12
relative. With groups or a bias it also counts the tokens whose experts
differ from the plain top-k's (the case tests nothing when none do).
"""
import math
import sys


def read_outputs(path):
    outputs, current = [], None
    for line in open(path):
        line = line.strip()
        if line.startswith("output "):
            shape = line.split(": ", 1)[1].split("]")[0].lstrip("[")
            current = {"shape": [int(d) for d in shape.split(",") if d.strip()],
                       "values": []}
            outputs.append(current)
        elif line and current is not None:
            current["values"].append(float(line))
    return outputs


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def topk(row, k):
    order = sorted(range(len(row)), key=lambda j: (-row[j], j))
    return order[:k]


def group_limited_topk(scores, k, groups, group_topk):
    """Megatron-LM's group_limited_topk for one token: each group scored by
    the sum of its k // group_topk highest scores, the group_topk best groups
    kept, the top-k of the scores with the other groups' masked to -inf."""
    size = len(scores) // groups
    group_scores = [sum(sorted(scores[g * size:(g + 1) * size],
                               reverse=True)[:k // group_topk])
                    for g in range(groups)]
    kept = topk(group_scores, group_topk)
    masked = [v if j // size in kept else -math.inf
              for j, v in enumerate(scores)]
    return topk(masked, k)


def route(logits, score, normalize, k, capacity_factor, policy, groups=0,
          group_topk=0, bias=None):
    """Megatron-LM's topk_softmax_with_capacity, for one layout of ties."""
    tokens, experts = len(logits), len(logits[0])
    probs, indices = [], []
    for row in logits:
        if bias:
            # scores_for_routing: the sigmoids plus the expert bias, for the
            # top-k (and the groups' scores) only.
            scores = [sigmoid(v) + b for v, b in zip(row, bias)]
            chosen = (group_limited_topk(scores, k, groups, group_topk)
                      if groups else topk(scores, k))
        elif groups:
            # The scores the top-k is taken over: the logits where the
            # weights are the softmax over the chosen, else the softmax over
            # all experts (pre-softmax) or the sigmoids.
            if score == "sigmoid":
                scores = [sigmoid(v) for v in row]
            else:
                scores = list(row) if normalize else softmax(row)
            chosen = group_limited_topk(scores, k, groups, group_topk)
        else:
            chosen = topk(row, k)
        if score == "softmax":
            if normalize:  # softmax over the top-k logits
                weights = softmax([row[j] for j in chosen])
            else:  # pre-softmax: the chosen entries of the full softmax
                full = softmax(row)
                weights = [full[j] for j in chosen]
        else:
            weights = [sigmoid(row[j]) for j in chosen]
            if normalize:
                total = sum(weights) + 1e-20
                weights = [w / total for w in weights]
        probs.append(weights)
        indices.append(chosen)
    if capacity_factor > 0:
        capacity = math.ceil(tokens * k / experts * capacity_factor)
        for e in range(experts):
            slots = [(t, i) for t in range(tokens) for i in range(k)
                     if indices[t][i] == e]
            if policy == "probs":
                slots.sort(key=lambda s: -probs[s[0]][s[1]])  # stable
            for t, i in slots[capacity:]:
                indices[t][i] = -1
                probs[t][i] = 0.0
    return probs, indices


def seq_aux_loss(logits, score, k, coeff, seq):
    """sequence_load_balancing_loss_func: over each sequence's tokens,
    sum_e (f_e / (S k / E)) * mean_s P_e, times coeff, averaged over the
    sequences (the rows of sequence b are b S to b S + S - 1)."""
    tokens, experts = len(logits), len(logits[0])
    losses = []
    for b in range(tokens // seq):
        rows = logits[b * seq:(b + 1) * seq]
        counts = [0] * experts
        mean_scores = [0.0] * experts
        for row in rows:
            for j in topk(row, k):
                counts[j] += 1
            for j, v in enumerate(scores_for_aux(row, score)):
                mean_scores[j] += v / seq
        losses.append(sum(c / (seq * k / experts) * p
                          for c, p in zip(counts, mean_scores)))
    return coeff * sum(losses) / len(losses)


def scores_for_aux(row, score):
    if score == "softmax":
        return softmax(row)
    sig = [sigmoid(v) for v in row]
    total = sum(sig) + 1e-20
    return [s / total for s in sig]


def aux_loss(logits, score, k, coeff):
    """switch_load_balancing_loss_func: coeff * E / (k T^2) sum_e f_e P_e."""
    tokens, experts = len(logits), len(logits[0])
    counts = [0] * experts
    per_expert = [0.0] * experts
    for row in logits:
        for j in topk(row, k):
            counts[j] += 1
        scores = scores_for_aux(row, score)
        for j in range(experts):
            per_expert[j] += scores[j]
    return (sum(p * c for p, c in zip(per_expert, counts)) * experts * coeff
            / (k * tokens * tokens))


def z_loss(logits, coeff):
    total = 0.0
    for row in logits:
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        total += lse * lse
    return coeff * total / len(logits)


def close(a, b, tol=1e-12):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    fields = mode.split(",")
    score, normalize, k, factor, policy, aux_coeff, z_coeff = fields[:7]
    options = dict(f.split("=", 1) for f in fields[7:])
    groups, group_topk = (int(v) for v in options.get("groups", "0:0").split(":"))
    seq = int(options.get("seq", "0"))
    has_bias = options.get("bias", "0") == "1"
    normalize, k = normalize == "1", int(k)
    factor, aux_coeff, z_coeff = float(factor), float(aux_coeff), float(z_coeff)
    outputs = read_outputs(path)
    logits_out, probs_out, indices_out, aux_out, z_out = outputs[:5]
    bias = outputs[5]["values"] if has_bias else None
    counts = outputs[6]["values"] if has_bias else None
    tokens, experts = logits_out["shape"]
    flat = logits_out["values"]
    logits = [flat[t * experts:(t + 1) * experts] for t in range(tokens)]
    probs, indices = route(logits, score, normalize, k, factor, policy,
                           groups, group_topk, bias)
    ok = True
    got_indices = [int(v) for v in indices_out["values"]]
    want_indices = [j for row in indices for j in row]
    dropped = want_indices.count(-1)
    if got_indices != want_indices:
        print("indices differ: mtrt-run %s, reference %s"
              % (got_indices, want_indices))
        ok = False
    if counts is not None:
        want_counts = [float(want_indices.count(e)) for e in range(experts)]
        if counts != want_counts:
            print("tokens per expert differ: mtrt-run %s, reference %s"
                  % (counts, want_counts))
            ok = False
    want_probs = [p for row in probs for p in row]
    worst = max(abs(a - b) for a, b in zip(probs_out["values"], want_probs))
    if not all(close(a, b) for a, b in zip(probs_out["values"], want_probs)):
        ok = False
    aux = (seq_aux_loss(logits, score, k, aux_coeff, seq) if seq
           else aux_loss(logits, score, k, aux_coeff))
    z = z_loss(logits, z_coeff)
    ok &= close(aux_out["values"][0], aux) and close(z_out["values"][0], z)
    limited = ""
    if groups or bias:
        plain = route(logits, score, normalize, k, factor, policy)[1]
        moved = sum(a != b for a, b in zip(indices, plain))
        limited = ", %d tokens routed unlike the plain top-k" % moved
    print("%s: %d tokens, %d experts, top-%d, %d slots dropped%s; weights max "
          "difference %.1e; aux loss %.12g (reference %.12g); z-loss %.12g "
          "(reference %.12g): %s"
          % (mode, tokens, experts, k, dropped, limited, worst,
             aux_out["values"][0], aux, z_out["values"][0], z,
             "agree" if ok else "DIFFER"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
