#!/usr/bin/env python3
"""Starts N copies of a command as the ranks of one multi-process run, the way
torchrun or an MPI launcher would (their variables, a free MASTER_PORT on
127.0.0.1), waits for them, and prints each rank's output in rank order,
then how each ended and after how many seconds.

  launch-ranks.py [--launcher torchrun|openmpi|pmi] [--only R,...]
                  [--local-rank-zero] [--kill R@SECONDS] [--stop R@SECONDS]
                  [--timeout SECONDS] N -- COMMAND...

--only starts just those ranks (a rank that never comes); --local-rank-zero
gives every rank LOCAL_RANK 0 (several ranks on one GPU); --kill sends
SIGKILL to rank R that many seconds after the start (a rank that dies
mid-run); --stop sends it SIGSTOP instead (a rank that hangs), and SIGKILL
once every other rank has ended; --timeout sends SIGKILL to every rank still
running that many seconds after the start. Exits with the largest exit
status of the ranks neither killed nor stopped (137 where --timeout ended
one).
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
    parser.add_argument("--stop", default="")
    parser.add_argument("--timeout", type=float, default=0)
    parser.add_argument("size", type=int)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    ranks = ([int(r) for r in args.only.split(",")] if args.only
             else list(range(args.size)))
    def rank_at(text):
        if not text:
            return None, None
        r, s = text.split("@")
        return int(r), float(s)
    kill_rank, kill_after = rank_at(args.kill)
    stop_rank, stop_after = rank_at(args.stop)
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
    how = {}
    while len(ended) < len(procs):
        now = time.monotonic() - start
        if kill_rank in procs and kill_rank not in how and now >= kill_after:
            procs[kill_rank][0].send_signal(signal.SIGKILL)
            how[kill_rank] = "killed"
        if stop_rank in procs and stop_rank not in how and now >= stop_after:
            procs[stop_rank][0].send_signal(signal.SIGSTOP)
            how[stop_rank] = f"stopped at {now:.1f} s, then killed"
        if (stop_rank in how and stop_rank not in ended and
                all(r in ended for r in procs if r != stop_rank)):
            procs[stop_rank][0].send_signal(signal.SIGKILL)
        if args.timeout and now >= args.timeout:
            for r, (p, _) in procs.items():
                if r not in ended and p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    how.setdefault(r, f"killed by --timeout {args.timeout:g}")
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
        print(f"[rank {r}] ended: {how.get(r, f'exit {code}')} after "
              f"{seconds:.1f} s")
        if r not in how:
            status = max(status, code)
        elif how[r].startswith("killed by --timeout"):
            status = max(status, 137)
    sys.exit(status)


if __name__ == "__main__":
    main()
