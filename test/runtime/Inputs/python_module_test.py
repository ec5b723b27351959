"""The mtrt Python module over the C API on the host: errors as mtrt.Error,
batches from NumPy (DLPack, copied or bound), from the buffer protocol and
as int64, parameters out through DLPack without copies, get/set, metrics,
checkpoints, two in-process ranks on Python threads, and fp16 loss scaling
through the session's keyword arguments.

Usage: python_module_test.py GPT.mtb LLAMA.mtb LLAMA-TP2.mtb LLAMA-DP2.mtb
       CORPUS SCRATCH GPT-FP16.mtb
"""
import array
import sys
import threading

import numpy as np

import mtrt

gpt_path, llama_path, tp2_path, dp2_path, corpus_path, scratch, fp16_path = \
    sys.argv[1:8]
corpus = np.frombuffer(open(corpus_path, "rb").read(), dtype=np.uint8)


def batch(k, shape, dtype=np.int32):
    rows, cols = shape
    start = k * rows * cols
    tokens = corpus[start:start + rows * cols].astype(dtype).reshape(shape)
    labels = corpus[start + 1:start + 1 + rows * cols].astype(dtype).reshape(shape)
    return tokens, labels


print("version", mtrt.__version__, mtrt.version() == mtrt.HEADER_VERSION)
try:
    mtrt.Bundle(scratch + "/missing.mtb")
except mtrt.Error as e:
    print("missing bundle:", e.code)

bundle = mtrt.Bundle(gpt_path)
session = mtrt.Session(bundle, lr=1e-3, threads=2)
print("batch", session.batch_shape, session.batch_dtype, "ranks", bundle.rank_count)
tokens, labels = batch(0, session.batch_shape)
session.set_batch(tokens, labels)
loss = session.eval_step()
print("eval loss near ln 256:", abs(loss - np.log(256)) < 0.1)

flat = array.array("i", tokens.ravel().tolist())
session.set_batch(memoryview(flat).cast("B").cast("i", list(tokens.shape)), labels)
print("buffer protocol batch, same loss:", session.eval_step() == loss)
session.set_batch(*batch(0, session.batch_shape, np.int64))
print("int64 batch, same loss:", session.eval_step() == loss)
bound_tokens, bound_labels = batch(0, session.batch_shape)
session.set_batch(bound_tokens, bound_labels, copy=False)
print("bound batch, same loss:", session.eval_step() == loss)
bound_tokens[0, 0] = 300  # outside the vocabulary: the step reads it
try:
    session.eval_step()
except mtrt.Error as e:
    print("bound batch is read at the step:", e.code)

for label, (t, l) in [("shape", (tokens[:, :64].copy(), labels)),
                      ("dtype", (tokens.astype(np.float32), labels)),
                      ("strided", (tokens[:, ::2], labels))]:
    try:
        session.set_batch(t, l)
    except (mtrt.Error, ValueError) as e:
        print(f"bad {label}:", type(e).__name__, str(e).split(":")[0])
try:
    session.set_batch("tokens", labels)
except ValueError as e:
    print("not a tensor:", e)

session.set_batch(tokens, labels)
metrics = session.train_step()
print("train_step", metrics["iteration"], metrics["micro_batches"],
      abs(metrics["loss"] - loss) < 0.05, metrics["learning_rate"] == 1e-3,
      session.metrics == metrics)
first = session.accumulate()
second = session.accumulate()
applied = session.apply()
print("accumulate x2 + apply: mean loss", applied["loss"] == (first + second) / 2,
      applied["micro_batches"])
try:
    session.apply()
except mtrt.Error as e:
    print("apply without accumulate:", e.code)

name = "transformer.ln_f.bias"
view = np.from_dlpack(session.parameter(name))
copy = np.empty(session.parameter_shape(name), np.float32)
session.get_parameter(name, copy)
print("view", view.shape, "equals get:", np.array_equal(view, copy))
session.set_parameter(name, np.arange(128, dtype=np.float32))
print("set is seen through the view:", view[-1] == 127.0)
try:
    session.parameter("nope")
except mtrt.Error as e:
    print("unknown parameter:", e.code)

session.save_checkpoint(scratch + "/checkpoint")
restored = mtrt.Session(bundle, lr=1e-3, threads=2)
restored.load_checkpoint(scratch + "/checkpoint")
same = all(np.array_equal(np.from_dlpack(session.parameter(n)),
                          np.from_dlpack(restored.parameter(n)))
           for n in session.parameter_names())
print("checkpoint restores all", len(session.parameter_names()), "parameters:", same)
del session
print("a view outlives its session:", view[-1] == 127.0)

# Two ranks of a tensor-parallel Llama on two Python threads equal one rank.
llama = mtrt.Bundle(llama_path)
one = mtrt.Session(llama, lr=1e-3, threads=1)
one.set_batch(*batch(0, one.batch_shape))
reference = one.train_step()["loss"]
tp2 = mtrt.Bundle(tp2_path)
world = mtrt.in_process_world(2)
losses = [None, None]


def rank_main(communicator):
    s = mtrt.Session(tp2, lr=1e-3, threads=1, communicator=communicator)
    s.set_batch(*batch(0, s.batch_shape))
    losses[communicator.rank] = s.train_step()["loss"]


threads = [threading.Thread(target=rank_main, args=(c,)) for c in world]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("tp2 on threads:", [c.size for c in world],
      "losses equal one rank's within 1e-5:",
      all(abs(x - reference) <= 1e-5 for x in losses))
# Two data-parallel ranks with the distributed optimizer, each fed its half
# of the batch, take the one-rank steps; their checkpoint (moments gathered)
# reshards into one rank, which continues as the one-rank run does.
name = "model.layers.0.mlp.up_proj.weight"
one = mtrt.Session(llama, lr=1e-3, threads=1)
full = batch(0, one.batch_shape)
for _ in range(2):
    one.set_batch(*full)
    reference = one.train_step()
dp2 = mtrt.Bundle(dp2_path)
world = mtrt.in_process_world(2)
results = [None, None]


def data_rank_main(communicator):
    r = communicator.rank
    s = mtrt.Session(dp2, lr=1e-3, threads=1, communicator=communicator)
    rows = s.batch_shape[0]
    for _ in range(2):
        s.set_batch(full[0][r * rows:(r + 1) * rows].copy(),
                    full[1][r * rows:(r + 1) * rows].copy())
        metrics = s.train_step()
    results[r] = (metrics, np.from_dlpack(s.parameter(name)).copy())
    s.save_checkpoint(scratch + "/dp2")


threads = [threading.Thread(target=data_rank_main, args=(c,)) for c in world]
for t in threads:
    t.start()
for t in threads:
    t.join()
expected = np.from_dlpack(one.parameter(name))
print("dp2 with the distributed optimizer: losses equal one rank's within 1e-5:",
      all(abs(m["loss"] - reference["loss"]) <= 1e-5 for m, _ in results),
      "parameters within 1e-5:",
      all(np.abs(p - expected).max() <= 1e-5 for _, p in results))
resumed = mtrt.Session(llama, lr=1e-3, threads=1)
resumed.load_checkpoint(scratch + "/dp2")
one.set_batch(*full)
resumed.set_batch(*full)
print("its checkpoint resumed on one rank continues within 1e-5:",
      abs(resumed.train_step()["loss"] - one.train_step()["loss"]) <= 1e-5)

# fp16 loss scaling from the keyword arguments (mtrt_session_options_t's
# fields): the scale and skip of each step, as log2 of the scale.
fp16 = mtrt.Bundle(fp16_path)


def scaled_steps(steps, **options):
    s = mtrt.Session(fp16, lr=1e-3, threads=2, **options)
    out = []
    for k in range(steps):
        s.set_batch(*batch(k, s.batch_shape))
        m = s.train_step()
        out.append((int(np.log2(m["loss_scale"])), m["skipped"]))
    return s, out


print("fp16 defaults:", scaled_steps(2)[1])
static, steps = scaled_steps(3, loss_scale=2.0**200)
initial = mtrt.Session(fp16, lr=1e-3, threads=2)
print("static loss_scale 2^200:", steps, "parameters as initialized:",
      all(np.array_equal(np.from_dlpack(static.parameter(n)),
                         np.from_dlpack(initial.parameter(n)))
          for n in static.parameter_names()))
print("dynamic from 2^130, window 2, hysteresis 1:",
      scaled_steps(6, initial_loss_scale=2.0**130, loss_scale_window=2,
                   hysteresis=1)[1])
print("min_loss_scale 2^129:",
      scaled_steps(3, initial_loss_scale=2.0**130, hysteresis=1,
                   min_loss_scale=2.0**129)[1])
try:
    mtrt.Session(fp16, hysteresis=0)
except mtrt.Error as e:
    print("hysteresis 0:", e.code, str(e).split(": ")[2])
try:
    mtrt.Session(bundle, loss_scale_window=4)
except mtrt.Error as e:
    print("loss_scale_window on an fp32 bundle:", e.code,
          "apply to fp16 bundles only" in str(e))
print("python_module_test: done")
