#!/usr/bin/env python3
"""Starts N copies of a command as the ranks of one multi-process run, the way
torchrun or an MPI launcher would (their variables, a free MASTER_PORT on
127.0.0.1), waits for them, and prints each rank's output in rank order,
then how each ended and after how many seconds.

  launch-ranks.py [--launcher torchrun|openmpi|pmi] [--only R,...]
                  [--local-rank-zero] [--kill R@SECONDS] N -- COMMAND...

--only starts just those ranks (a rank that never comes); --local-rank-zero
gives every rank LOCAL_RANK 0 (several ranks on one GPU); --kill sends
SIGKILL to rank R that many seconds after the start (a rank that dies
mid-run). Exits with the largest exit status of the ranks not killed.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(launcher, rank, size, local_rank, port):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if launcher == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE=str(size),
                   LOCAL_RANK=str(local_rank))
    elif launcher == "openmpi":
        env.update(OMPI_COMM_WORLD_RANK=str(rank),
                   OMPI_COMM_WORLD_SIZE=str(size),
                   OMPI_COMM_WORLD_LOCAL_RANK=str(local_rank))
    else:
        env.update(PMI_RANK=str(rank), PMI_SIZE=str(size),
                   MPI_LOCALRANKID=str(local_rank))
    return env


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", default="torchrun",
                        choices=["torchrun", "openmpi", "pmi"])
    parser.add_argument("--only", default="")
    parser.add_argument("--local-rank-zero", action="store_true")
    parser.add_argument("--kill", default="")
    parser.add_argument("size", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    ranks = ([int(r) for r in args.only.split(",")] if args.only
             else list(range(args.size)))
    kill_rank, kill_after = (None, None)
    if args.kill:
        r, s = args.kill.split("@")
        kill_rank, kill_after = int(r), float(s)
    port = free_port()
    start = time.monotonic()
    procs = {}
    for r in ranks:
        out = tempfile.TemporaryFile()
        env = rank_environment(args.launcher, r, args.size,
                               0 if args.local_rank_zero else r, port)
        procs[r] = (subprocess.Popen(command, env=env, stdout=out,
                                     stderr=subprocess.STDOUT), out)
    ended = {}
    killed = set()
    while len(ended) < len(procs):
        now = time.monotonic() - start
        if kill_rank in procs and kill_rank not in killed and now >= kill_after:
            procs[kill_rank][0].send_signal(signal.SIGKILL)
            killed.add(kill_rank)
        for r, (p, _) in procs.items():
            if r not in ended and p.poll() is not None:
                ended[r] = (p.returncode, now)
        time.sleep(0.05)
    status = 0
    for r in ranks:
        p, out = procs[r]
        out.seek(0)
        text = out.read().decode(errors="replace")
        for line in text.splitlines():
            print(f"[rank {r}] {line}")
        code, seconds = ended[r]
        how = "killed" if r in killed else f"exit {code}"
        print(f"[rank {r}] ended: {how} after {seconds:.1f} s")
        if r not in killed:
            status = max(status, code)
    sys.exit(status)


if __name__ == "__main__":
    main()
