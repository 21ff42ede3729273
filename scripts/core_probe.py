#!/usr/bin/env python3
"""Do this machine's cores slow down, alone or together? A probe of the host beneath the cost model.

Two processes, pinned to CPU 0 and CPU 1, wake on a shared wall-clock tick (TICK ms apart) and time a
fixed piece of work each: a chain of float adds in a 256 KB array (compute) or a pass over 32 MB
(memory), in turn. The ticks cycle through CPU 0 alone, CPU 1 alone and both at once, so each window of
about ten seconds gives every core's pace alone and together. Per window it prints the mean times, both
together over alone (does a busy neighbour slow a core?), and the lockstep figure, the mean over cycles of
the slower core's time together over the mean of the two alone (what two workers that wait for each other
pay; the calibration's `lockstep` factor measures the same on GEMMs in one block of ~10 s).

On the 2-core VM (2026-12-04 19:28 UTC, 5 minutes, idle): together over alone 0.98-1.02 (compute) and
0.99-1.13 (memory); lockstep 0.99-1.15 per window: one core at a time ran 10-30% slow for 10-30 s, its
CPU time as slow as its wall time (so the hypervisor's steal shows nothing).

Usage: core_probe.py [--seconds S] [--tick-ms T] [--window-s W]   (needs a C compiler and 2+ cores)
"""
import argparse
import collections
import os
import statistics as st
import subprocess
import sys
import tempfile
import time

SOURCE = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  int core = atoi(argv[1]); double start = atof(argv[2]), dur = atof(argv[3]), tick = atof(argv[4]) / 1000;
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(core, &s);
  if (sched_setaffinity(0, sizeof s, &s)) { perror("sched_setaffinity"); return 2; }
  int n = 1 << 16; float* a = malloc(n * 4); for (int i = 0; i < n; i++) a[i] = 1.0f + i * 1e-7f;
  long m = 8 << 20; float* b = malloc(m * 4); for (long i = 0; i < m; i++) b[i] = 1;
  volatile float sink = 0;
  for (long i = 0;; i++) {
    double t = start + i * tick;
    if (t > start + dur) break;
    struct timespec ts; ts.tv_sec = (time_t)t; ts.tv_nsec = (long)((t - (time_t)t) * 1e9);
    clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, 0);
    int who = (i / 2) % 3, mem = i % 2;  /* who: 0 = CPU 0 alone, 1 = CPU 1 alone, 2 = both */
    if (!(who == 2 || who == core)) continue;
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    float acc = 0;
    if (!mem) { for (int r = 0; r < 400; r++) for (int j = 0; j < n; j++) acc += a[j] * 1.0001f; }
    else { for (int r = 0; r < 2; r++) for (long j = 0; j < m; j += 4) acc += b[j]; }
    sink += acc;
    printf("%ld %d %d %d %.6f %.6f\n", i, core, who, mem, now(CLOCK_MONOTONIC) - w0, now(CLOCK_THREAD_CPUTIME_ID) - c0);
  }
  return 0;
}
"""


def die(msg):
    print("core_probe: " + msg, file=sys.stderr)
    sys.exit(2)


def run_probes(seconds, tick_ms):
    """Compiles the probe in a temporary folder (removed after) and runs it on CPU 0 and 1 at once."""
    with tempfile.TemporaryDirectory(prefix="gp-core-probe-") as tmp:
        src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(SOURCE)
        cc = os.environ.get("CC", "cc")
        r = subprocess.run([cc, "-O2", "-o", exe, src], capture_output=True, text=True)
        if r.returncode != 0:
            die("%s could not compile the probe: %s" % (cc, r.stderr.strip()[-400:]))
        start = int(time.time()) + 2
        procs = [subprocess.Popen([exe, str(c), str(start), str(seconds), str(tick_ms)], stdout=subprocess.PIPE,
                                  text=True) for c in (0, 1)]
        outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        die("the probe failed (exit %s)" % [p.returncode for p in procs])
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--tick-ms", type=float, default=100, help="one timed piece per tick (each takes 6-15 ms)")
    ap.add_argument("--window-s", type=float, default=9.6, help="seconds per printed window")
    a = ap.parse_args()
    if a.seconds <= 0 or a.tick_ms <= 20 or a.window_s <= 0:
        die("--seconds and --window-s must be > 0 and --tick-ms > 20 (each piece takes up to 15 ms)")
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        die("needs CPUs 0 and 1 (this process may run on %s)" % sorted(os.sched_getaffinity(0)))
    print("core_probe: %.0f s, a tick every %.0f ms, windows of %.1f s (load %s)" % (
        a.seconds, a.tick_ms, a.window_s, open("/proc/loadavg").read().split()[0]), flush=True)
    outs = run_probes(a.seconds, a.tick_ms)
    wall = collections.defaultdict(dict)
    cpu = collections.defaultdict(dict)
    per_group = 6  # CPU 0 alone, CPU 1 alone, both; compute and memory each
    for text in outs:
        for line in text.split("\n"):
            if not line.strip():
                continue
            i, core, who, mem, w, c = line.split()
            key = (int(core), int(who), int(mem))
            wall[int(i) // per_group][key] = float(w)
            cpu[int(i) // per_group][key] = float(c)
    groups = sorted(wall)
    win = max(1, round(a.window_s / (per_group * a.tick_ms / 1000)))
    print("%7s  %-7s %7s %7s %7s %7s  %12s  %8s  %9s" % ("from s", "work", "alone0", "alone1", "both0", "both1",
                                                       "both/alone", "lockstep", "cpu/wall"))
    summary = collections.defaultdict(list)
    for w0 in range(0, len(groups), win):
        for mem in (0, 1):
            k = [(0, 0, mem), (1, 1, mem), (0, 2, mem), (1, 2, mem)]
            rows = [(wall[g], cpu[g]) for g in groups[w0:w0 + win] if all(x in wall[g] for x in k)]
            if not rows:
                continue
            col = [[r[0][x] for r in rows] for x in k]
            alone = st.mean(col[0]) + st.mean(col[1])
            both = (st.mean(col[2]) + st.mean(col[3])) / alone
            lock = st.mean(max(r[0][k[2]], r[0][k[3]]) for r in rows) / (alone / 2)
            cw = st.mean((r[1][k[2]] + r[1][k[3]]) / (r[0][k[2]] + r[0][k[3]]) for r in rows)
            summary[mem].append((both, lock))
            print("%7.1f  %-7s %7.2f %7.2f %7.2f %7.2f  %12.3f  %8.3f  %9.3f" % (
                w0 * per_group * a.tick_ms / 1000, "memory" if mem else "compute",
                *(st.mean(c) * 1e3 for c in col), both, lock, cw))
    for mem in (0, 1):
        v = summary[mem]
        if v:
            print("%s: both/alone %.3f (windows %.3f-%.3f); lockstep %.3f (windows %.3f-%.3f)" % (
                "memory" if mem else "compute", st.median(x for x, _ in v), min(x for x, _ in v),
                max(x for x, _ in v), st.median(y for _, y in v), min(y for _, y in v), max(y for _, y in v)))


if __name__ == "__main__":
    main()
