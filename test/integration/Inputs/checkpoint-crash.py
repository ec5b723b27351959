#!/usr/bin/env python3
"""Kills checkpoint saves at random points and corrupts finished checkpoints
(checkpoint-crash.test).

Usage: checkpoint-crash.py TRAIN CHECKPOINT BUNDLE CORPUS WORKDIR [--trials N]
                           [--backend host|cuda]

TRAIN and CHECKPOINT are megatron-train and megatron-checkpoint; BUNDLE is a
bundle for several ranks (trained with --in-process-ranks on --backend, the
host by default). A base run saves
iteration 2; the uninterrupted reference resumes it and saves iteration 4.

Crash trials: each resumes a copy of the base run with
MTRT_CHECKPOINT_CRASH_AFTER_BYTES=K, K drawn from [0, the bytes of the save of
iteration 4] (the first four at the edges: 0, the shards' bytes, the
directory's, all of them), so that the process
is killed (SIGKILL) while writing a shard, the manifest or the latest file,
or just before a rename. Then --load must take the last complete checkpoint:
iteration 2 if the kill came before the iteration directory was renamed into
place (K <= shards + manifest), else iteration 4; a run resumed from it must
give the reference's losses bit for bit and the reference's shards.

Corruption trials: each truncates or flips a byte of one file of a copy of
the reference's iteration 4 (a shard or the manifest); loading it must fail
with an error that names the file.

Prints one line per kind of trial; exits 1 at the first failure.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    for name in ("train", "checkpoint", "bundle", "corpus", "workdir"):
        parser.add_argument(name)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--backend", default="host")
    args = parser.parse_args()
    rng = random.Random(20261129)
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    def train(save_dir, iters, jsonl=None, crash_after=None):
        command = [args.train, args.bundle, "--in-process-ranks",
                   "--data-path", args.corpus, "--train-iters", str(iters),
                   "--lr", "1e-3", "--lr-decay-iters", "8", "--log-interval",
                   "1", "--eval-interval", "0", "--no-progress-bar",
                   "--threads", "1", "--save", save_dir, "--save-interval",
                   "2", "--load", save_dir, "--backend", args.backend]
        if jsonl:
            command += ["--log-jsonl", jsonl]
        env = dict(os.environ)
        env.pop("MTRT_CHECKPOINT_CRASH_AFTER_BYTES", None)
        if crash_after is not None:
            env["MTRT_CHECKPOINT_CRASH_AFTER_BYTES"] = str(crash_after)
        return subprocess.run(command, env=env, capture_output=True,
                              text=True, errors="replace")

    def fail(message, result=None):
        if result is not None:
            message += "\nstdout:\n%s\nstderr:\n%s" % (result.stdout,
                                                       result.stderr)
        sys.exit(message)

    def losses(path):
        with open(path) as f:
            return {r["iteration"]: r["loss"]
                    for r in map(json.loads, f) if "loss" in r}

    def loaded_iteration(result):
        for line in result.stdout.splitlines():
            if "successfully loaded checkpoint" in line:
                return int(line.split()[-1])
        return None

    base = os.path.join(work, "base")
    result = train(base, 2)
    if result.returncode != 0:
        fail("the base run failed", result)
    reference = os.path.join(work, "reference")
    shutil.copytree(base, reference)
    result = train(reference, 4, os.path.join(work, "reference.jsonl"))
    if result.returncode != 0:
        fail("the reference run failed", result)
    want = losses(os.path.join(work, "reference.jsonl"))
    iter4 = os.path.join(reference, "iter_0000004")
    files = sorted(os.listdir(iter4))
    shards = [f for f in files if f.endswith(".safetensors")]
    manifest_bytes = os.path.getsize(os.path.join(iter4, "checkpoint.json"))
    directory_bytes = sum(os.path.getsize(os.path.join(iter4, f))
                          for f in files)
    total = directory_bytes + os.path.getsize(
        os.path.join(reference, "latest_checkpointed_iteration.txt"))

    outcomes = {2: 0, 4: 0}
    for trial in range(args.trials):
        # The edges first: nothing written, the manifest not begun, all of
        # the directory but its rename, everything but the latest file's
        # rename; then random points.
        edges = [0, directory_bytes - manifest_bytes, directory_bytes, total]
        k = edges[trial] if trial < len(edges) else rng.randint(0, total)
        run_dir = os.path.join(work, "crash-%02d" % trial)
        shutil.copytree(base, run_dir)
        result = train(run_dir, 4, crash_after=k)
        if result.returncode != -signal.SIGKILL:
            fail("trial %d (K=%d): expected a SIGKILL, got exit status %d"
                 % (trial, k, result.returncode), result)
        expected = 2 if k <= directory_bytes else 4
        jsonl = os.path.join(work, "crash-%02d.jsonl" % trial)
        result = train(run_dir, 4, jsonl)
        if result.returncode != 0:
            fail("trial %d (K=%d): the resumed run failed" % (trial, k),
                 result)
        got = loaded_iteration(result)
        if got != expected:
            fail("trial %d (K=%d of %d bytes, %d before the rename): loaded "
                 "iteration %s, expected %d" % (trial, k, total,
                                                directory_bytes, got,
                                                expected), result)
        outcomes[expected] += 1
        resumed = losses(jsonl)
        for iteration, loss in resumed.items():
            if want.get(iteration) != loss:
                fail("trial %d: iteration %d: loss %r, the reference's %r"
                     % (trial, iteration, loss, want.get(iteration)))
        for shard in shards:
            with open(os.path.join(iter4, shard), "rb") as a, open(
                    os.path.join(run_dir, "iter_0000004", shard), "rb") as b:
                if a.read() != b.read():
                    fail("trial %d: %s differs from the reference's"
                         % (trial, shard))
        check = subprocess.run([args.checkpoint, "verify", run_dir],
                               capture_output=True, text=True)
        if check.returncode != 0 or "iteration 4," not in check.stdout:
            fail("trial %d: megatron-checkpoint verify failed" % trial, check)
    print("crash trials: %d, killed after 0 to %d bytes: %d before the "
          "iteration directory was complete (loaded iteration 2), %d after "
          "(loaded iteration 4); every resumed run matched the reference"
          % (args.trials, total, outcomes[2], outcomes[4]))

    kinds = {"truncated": 0, "flipped": 0}
    for trial in range(args.trials):
        run_dir = os.path.join(work, "corrupt-%02d" % trial)
        shutil.copytree(reference, run_dir)
        name = files[trial % len(files)]
        path = os.path.join(run_dir, "iter_0000004", name)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            if trial % 2 == 0:
                f.truncate(rng.randrange(size))
                kind = "truncated"
            else:
                offset = rng.randrange(size)
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
                kind = "flipped"
        result = train(run_dir, 6)
        if result.returncode != 1 or path not in result.stderr:
            fail("corruption trial %d (%s %s): expected an error naming %s"
                 % (trial, kind, name, path), result)
        kinds[kind] += 1
    print("corruption trials: %d (%d truncated, %d with a flipped bit, over "
          "%d files): every one detected, naming the file"
          % (args.trials, kinds["truncated"], kinds["flipped"], len(files)))


if __name__ == "__main__":
    main()
