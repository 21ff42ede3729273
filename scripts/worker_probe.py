#!/usr/bin/env python3
"""Where a training step's wall time goes on this machine: CPU work, waiting, or the hypervisor (steal).

For each plan, ROUNDS rounds in turn: `graphpipe train --plan P` runs long; after --warmup-s seconds the
probe reads every worker thread's CPU time (/proc/PID/task/TID/stat) and every core's running, stolen
and idle ticks (/proc/stat), again --measure-s seconds later, and counts the steps the log gained in
between. It prints per run: wall ms a step, each worker's main-thread CPU ms a step, the other threads'
CPU ms a step (per worker: Gloo's, the all-reduce's), and the steal share of the cores in use
(fidelity_rank.steal_share). With --twin, 1-worker plans also run once more per round with a copy of
themselves on the other core (both pinned with taskset): does a busy neighbouring core slow a worker?

Usage: worker_probe.py GRAPHPIPE PLAN.json [PLAN.json ...] [--rounds R] [--warmup-s W] [--measure-s M] [--twin]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fidelity_rank import core_ticks, steal_share  # noqa: E402

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_ticks(launcher):
    """{(worker pid, tid): user + system ticks} of the workers' threads: the launcher's children, or
    the launcher itself where it trains in-process (a 1-worker plan)."""
    out = {}
    kids = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()
    for pid in kids or [str(launcher)]:
        try:
            tids = os.listdir("/proc/%s/task" % pid)
        except OSError:
            continue
        for tid in tids:
            try:
                with open("/proc/%s/task/%s/stat" % (pid, tid)) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[(pid, tid)] = int(fields[11]) + int(fields[12])
    return out


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def stop(p):
    subprocess.run(["pkill", "-P", str(p.pid)], capture_output=True)
    p.kill()
    p.wait()


def probe(gp, plan, a, log, pin=None):
    cmd = [gp, "train", "--plan", plan, "--steps", "1000000", "--seed", "1", "--log", log]
    if pin is not None:
        cmd = ["taskset", "-c", str(pin)] + cmd + ["--pin-cores", "off"]
    if os.path.exists(log):  # the previous run's: counted before this run's train truncated it, its lines went missing
        os.remove(log)
    err = open(log + ".stderr", "w+")  # a file, not a pipe: a full pipe would stall the run
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        time.sleep(a.warmup_s)
        if p.poll() is not None:
            err.seek(0)
            sys.exit("worker_probe: %s exited %d: %s" % (" ".join(cmd), p.returncode, err.read().strip()[-400:]))
        c1, t1, n1 = core_ticks(), thread_ticks(p.pid), lines(log)
        time.sleep(a.measure_s)
        c2, t2, n2 = core_ticks(), thread_ticks(p.pid), lines(log)
    finally:
        stop(p)
        err.close()
    steps = n2 - n1
    if steps <= 0:
        sys.exit("worker_probe: %s took no step in %.1f s" % (plan, a.measure_s))
    per = TICK_S * 1e3 / steps  # ms a step per tick
    mains = [(t2[k] - t1.get(k, 0)) * per for k in sorted(t2) if k[0] == k[1]]
    workers = max(1, len(mains))
    others = sum(t2[k] - t1.get(k, 0) for k in t2 if k[0] != k[1]) * per / workers
    return ("wall %.2f ms a step | main thread CPU %s ms a step | other threads %.2f ms a step per worker | "
            "steal %.0f%%" % (a.measure_s * 1e3 / steps, ", ".join("%.2f" % m for m in mains), others,
                              100 * steal_share(c1, c2)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gp")
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=4.0, help="seconds of training before the measurement")
    ap.add_argument("--measure-s", type=float, default=5.0, help="seconds measured")
    ap.add_argument("--twin", action="store_true",
                    help="1-worker plans: also a run beside a copy of itself on the other core")
    a = ap.parse_args()
    workers = {}
    for plan in a.plans:  # a bad file is one line naming it, exit 2, before anything runs
        try:
            with open(plan) as f:
                workers[plan] = len({d for s in json.load(f)["stages"] for d in s["devices"]})
        except KeyError as e:
            print("worker_probe: %s: not a plan (no field %s)" % (plan, e), file=sys.stderr)
            sys.exit(2)
        except (OSError, ValueError, TypeError) as e:
            print("worker_probe: %s: not a readable plan (%s)" % (plan, e), file=sys.stderr)
            sys.exit(2)
    log = os.path.join(tempfile.mkdtemp(prefix="gp-probe-"), "log.jsonl")
    for r in range(a.rounds):
        for plan in a.plans:
            name = os.path.basename(plan)
            print("round %d/%d  %-24s %s" % (r + 1, a.rounds, name, probe(a.gp, plan, a, log)), flush=True)
            if a.twin and workers[plan] == 1 and os.cpu_count() >= 2:
                twin_log = log + ".twin"
                twin = subprocess.Popen(["taskset", "-c", "1", a.gp, "train", "--plan", plan, "--steps", "1000000",
                                         "--seed", "1", "--pin-cores", "off", "--log", twin_log],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    print("round %d/%d  %-24s %s" % (r + 1, a.rounds, name + " + twin",
                                                     probe(a.gp, plan, a, log, pin=0)), flush=True)
                finally:
                    stop(twin)


if __name__ == "__main__":
    main()
