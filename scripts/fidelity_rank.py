#!/usr/bin/env python3
"""make fidelity's ranking table: does the cost model rank plans for this machine right?

For one model and mini-batch it makes 5 plans for this machine (--cluster cpu): 1 device; 2 devices
with GraphPipe, with PipeDream, data-parallel (the 1-device plan's stage on both workers), and
GraphPipe at a fixed small micro-batch (--micro-batch: one or more, comma-separated). On a machine of
one device (a GPU box: --devices 1 --cluster h200 --profile P --device cuda) the plans are the
planner's 1-device plan and one at each --micro-batch, the planner's first. Each plan's prediction is
`graphpipe simulate`'s iteration time (the same simulator the planner scores plans with). The plans
are then trained interleaved: ROUNDS rounds, every plan in turn per round in a balanced order (each
plan in each slot, and right after each other plan, equally often over a full set of rounds: the
default), STEPS steps each; a plan's time in a round is the median of its steps after WARMUP. For
every pair (a, b): measured ratio = median over the rounds of t_a / t_b in that round (both measured
minutes apart at most), predicted ratio = pred_a / pred_b, and their quotient (1.00 = the model
ranks and spaces the two exactly as the machine does).

The noise floor: where two of the plans are the same plan (the same stages, devices and micro-batch
sizes on the same cluster, hence the same prediction: planners often agree), their measured ratio is
what the machine's noise alone makes of a pair whose predicted ratio is 1.00; where none are, the
planner's choice is trained a second time every round as a control (--control auto; on: always; off:
never). A line under the tables gives it; a control is not one of the plans the pairs count.

On a machine shared with other jobs the wall clock measures the contention too, and 2 workers in
lockstep lose more to it than 1. A second figure is robust to it: the CPU time of the training
processes per step (a run of STEPS steps minus one of 2 steps, so start-up cancels) divided by the
cores in use (min(workers with a stage, cores)): the iteration time of an otherwise idle machine if no
core waits (a lower bound where a pipeline leaves cores idle in its bubbles). The pairs are given on
both clocks.

Steal: on a VM the hypervisor gives a vCPU's time to other guests now and then (/proc/stat's steal:
0-3% of a busy core's time on the 2-core VM usually, 30% in bursts of seconds). Plans whose workers
run in lockstep lose the most stalled core's share, a single worker only its own, so a burst skews
a pair. Each run records the largest steal share of the cores it used; a run over --max-steal (10%)
is trained again, up to --steal-retries (2) times, and the tables give each plan's steal.

With --calibrate, `graphpipe calibrate` measures this machine again first (its cache is replaced), so
that the predictions are of the machine as it is while the plans train: on a shared VM the figures
of a calibration hours old moved 1.4-2.6x.

Usage: fidelity_rank.py GRAPHPIPE MODEL BATCH OUT.md [--rounds R] [--steps S] [--min-round-s T] [--warmup W]
       [--micro-batch M[,M...]] [--devices N] [--cluster C] [--profile P] [--device cpu|cuda]
       [--control auto|on|off] [--max-steal F] [--steal-retries N] [--calibrate] [--label TEXT]
Prints the tables and appends them (markdown) to OUT.md.
"""
import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("fidelity_rank: %s failed (exit %d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()[-400:]))
    return r.stdout


def core_ticks():
    """Per CPU: (running, stolen, idle) clock ticks so far, from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = [int(x) for x in line.split()[1:]]
                steal = v[7] if len(v) > 7 else 0
                out[line.split()[0]] = (v[0] + v[1] + v[2] + v[5] + v[6], steal, v[3] + v[4])
    return out


def steal_share(before, after):
    """The largest share of the time a core in use (running or stolen for over half the run) wanted
    that the hypervisor gave to someone else (steal): a worker stalled that long, and the workers of a
    plan in lockstep wait for the most stalled one. 0 without /proc/stat's steal column."""
    worst = 0.0
    for c, (run_t, steal, idle) in after.items():
        b = before.get(c, (0, 0, 0))
        r, s, i = run_t - b[0], steal - b[1], idle - b[2]
        if r + s > 0 and (r + s) > (r + s + i) / 2:
            worst = max(worst, s / (r + s))
    return worst


def cpu_of(cmd):
    """CPU seconds (user + system) of the child processes `cmd` starts (train's workers included), and
    the steal share of the cores it used (steal_share)."""
    before, ticks = resource.getrusage(resource.RUSAGE_CHILDREN), core_ticks()
    run(cmd)
    after, ticks_after = resource.getrusage(resource.RUSAGE_CHILDREN), core_ticks()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, steal_share(ticks, ticks_after)


def balanced_orders(n):
    """The order the plans train in, round by round: a Williams design. Over its rounds every plan
    trains once in every position and right after every other plan equally often (once for an even
    count; twice, in n rounds and their mirror, for an odd one), so neither a slot in the round nor
    the plan before it can favour one plan of a pair (in one run of a fixed order the same plan ran
    0.78-0.88x as fast in one slot as in the next, all three rounds)."""
    first = [0]
    lo, hi = 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def shape(plan):
    return "%d stage(s): %s" % (len(plan["stages"]), ", ".join(
        "%s mb %d" % ("+".join(map(str, s["devices"])), s["micro_batch_size"]) for s in plan["stages"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gp")
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of training every plan once (default: one full balanced order, the plan "
                         "count's rounds if even, twice it if odd)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--min-round-s", type=float, default=1.0,
                    help="more steps per plan and round where the fastest plan's predicted steps would run "
                         "shorter than this (a 12 ms step's median of 10 moved 0.6-1.3x between rounds)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--micro-batch", default="2",
                    help="the fixed micro-batch size(s) of the small-micro-batch plan(s), comma-separated")
    ap.add_argument("--devices", type=int, default=2,
                    help="the pipelines' devices; 1: a machine of one device (a GPU box), ranked on 1-device "
                         "plans alone: the planner's and one at each --micro-batch")
    ap.add_argument("--cluster", default="cpu", help="the cluster the plans are made for (plan --cluster)")
    ap.add_argument("--profile", default=None, help="op times measured on that machine (plan --profile)")
    ap.add_argument("--device", default="cpu",
                    help="train --device; with cuda the CPU-time clock is not measured (a GPU's time is not "
                         "the host processes' CPU time)")
    ap.add_argument("--control", choices=["auto", "on", "off"], default="auto",
                    help="train the planner's choice twice per round, as a noise floor: auto = where no two "
                         "plans are the same plan")
    ap.add_argument("--calibrate", action="store_true",
                    help="run `graphpipe calibrate` first (replaces this machine's cached calibration)")
    ap.add_argument("--max-steal", type=float, default=0.10,
                    help="train a plan's round again (up to --steal-retries times) where the hypervisor took "
                         "more than this share of a core it used (/proc/stat's steal; on this VM 0-3%% "
                         "usually, 30%% in bursts, which slows plans in lockstep most)")
    ap.add_argument("--steal-retries", type=int, default=2)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    gp, n = a.gp, a.devices
    mbs = [int(m) for m in a.micro_batch.split(",")]
    if a.calibrate and a.cluster != "cpu":
        sys.exit("fidelity_rank: --calibrate measures this machine for --cluster cpu, not %s" % a.cluster)
    tmp = tempfile.mkdtemp(prefix="gp-rank-")
    calibrated = ""
    if a.calibrate:
        print("-- graphpipe calibrate", flush=True)
        calibrated = run([gp, "calibrate"]).strip().splitlines()
        calibrated = ", calibrated just before: " + "; ".join(l.strip() for l in calibrated[1:3])
    base = [gp, "plan", "--model", a.model, "--cluster", a.cluster, "--batch", str(a.batch)]
    base += ["--profile", a.profile] if a.profile else []
    specs = [("1 device", base + ["--devices", "1"])]
    if n > 1:
        specs += [
            ("%d dev GraphPipe" % n, base + ["--devices", str(n)]),
            ("%d dev PipeDream" % n, base + ["--devices", str(n), "--planner", "pipedream"]),
            ("%d dev data-parallel" % n, None),
        ]
    small = "1 device" if n == 1 else "%d dev GraphPipe" % n
    specs += [("%s mb %d" % (small, m), base + ["--devices", str(n), "--micro-batch", str(m)]) for m in mbs]
    first_i = 0 if n == 1 else 1  # the planner's own plan for this machine (all its devices)
    plans = []  # (name, path, plan, predicted)
    for i, (name, cmd) in enumerate(specs):
        path = os.path.join(tmp, "p%d.json" % i)
        if cmd is None:
            # data parallel: the 1-device plan (one stage, the whole model) on workers 0..n-1
            p = json.load(open(plans[0][1]))
            two = json.load(open(plans[1][1]))  # the n-worker cluster and costs, the 1-device plan's stage
            p["cluster"], p["costs"] = two["cluster"], two["costs"]
            p["stages"][0]["devices"] = list(range(n))
            p["planner"] = "data-parallel (by hand)"
            json.dump(p, open(path, "w"))
        else:
            run(cmd + ["--out", path])
        sim = json.loads(run([gp, "simulate", "--plan", path, "--json"]))
        p = json.load(open(path))
        plans.append((name, path, p, sim["iteration_time_s"]))
    # The same plan: the same stages, devices and micro-batch sizes on the same cluster, so the same
    # prediction (a 1-device plan and a 2-worker plan that leaves one worker idle are not).
    def identical(x, y):
        return shape(x[2]) == shape(y[2]) and abs(x[3] / y[3] - 1) < 1e-9

    same = [(x, y) for x, y in itertools.combinations(plans, 2) if identical(x, y)]
    control = None
    if a.control == "on" or (a.control == "auto" and not same):
        control = (plans[first_i][0] + ", again (control)",) + plans[first_i][1:]
    trained = plans + ([control] if control else [])
    # Short steps: enough of them that each round of the fastest plan lasts min_round_s.
    a.steps = max(a.steps, a.warmup + math.ceil(a.min_round_s / min(pred for *_, pred in plans)))
    meas = {name: [] for name, *_ in trained}
    cpus = {name: [] for name, *_ in trained}
    steals = {name: [] for name, *_ in trained}
    retried = 0
    orders = balanced_orders(len(trained))
    if a.rounds is None:
        a.rounds = len(orders)
    for r in range(a.rounds):
        for k in orders[r % len(orders)]:
            name, path, _, pred = trained[k]
            log = os.path.join(tmp, "log.jsonl")
            for attempt in range(a.steal_retries + 1):
                c, st = cpu_of([gp, "train", "--plan", path, "--steps", str(a.steps), "--seed", "1",
                                "--device", a.device, "--log", log])
                t = [json.loads(l)["step_time_s"] for l in open(log) if l.strip()][a.warmup:]
                load = open("/proc/loadavg").read().split()[0]
                again = st > a.max_steal and attempt < a.steal_retries
                print("   round %d/%d, %-24s measured %.4f s, predicted %.4f s, load %s, steal %.0f%%%s" % (
                    r + 1, a.rounds, name, statistics.median(t), pred, load, 100 * st,
                    " (over --max-steal: again)" if again else ""), flush=True)
                if not again:
                    break
                retried += 1
            cpus[name].append(c)
            steals[name].append(st)
            meas[name].append(statistics.median(t))
    cpu = {}  # CPU seconds per step / cores in use
    for name, path, p, _ in plans:
        if a.device != "cpu":
            cpu[name] = None
            continue
        short = cpu_of([gp, "train", "--plan", path, "--steps", "2", "--seed", "1"])[0]
        used = len({d for s in p["stages"] for d in s["devices"]})
        c = (statistics.median(cpus[name]) - short) / (a.steps - 2) / min(used, os.cpu_count()) if a.steps > 2 else 0
        cpu[name] = c if c > 0 else None  # too few steps to rise above the start-up's noise: no figure
    lines = []
    full = ("a full balanced order" if a.rounds % len(orders) == 0
            else "not a whole balanced order of %d" % len(orders))
    lines.append("**%s** `%s`, mini-batch %d, %d rounds (%s) of %d steps (first %d left out; %d run(s) trained "
                 "again for steal over %.0f%%), %d cores, load after %s%s" % (
                     a.label or "model", a.model, a.batch, a.rounds, full, a.steps, a.warmup, retried,
                     100 * a.max_steal, os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3]),
                     calibrated))
    lines.append("")
    lines.append("| plan | shape | predicted s | measured s (median of rounds) | measured / predicted | CPU s per step / cores in use | CPU / predicted | steal, median (max) |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _, p, pred in trained:
        m = statistics.median(meas[name])
        c_txt = "%.4f | %.2f" % (cpu[name], cpu[name] / pred) if cpu.get(name) else "- | -"
        lines.append("| %s | %s | %.4f | %.4f | %.2f | %s | %.0f%% (%.0f%%) |" % (
            name, shape(p), pred, m, m / pred, c_txt, 100 * statistics.median(steals[name]),
            100 * max(steals[name])))
    lines.append("")
    lines.append("| a vs b | predicted t_a/t_b | measured t_a/t_b (rounds' range) | measured / predicted | within 0.85-1.15 | CPU-time t_a/t_b | CPU / predicted | within |")
    lines.append("| --- | ---: | ---: | ---: | :---: | ---: | ---: | :---: |")
    worst, ok, cworst, cok, cpairs = 1.0, 0, 1.0, 0, 0
    pairs = list(itertools.combinations(plans, 2))
    for x, y in pairs:
        (na, _, _, pa), (nb, _, _, pb) = x, y
        rs = [u / v for u, v in zip(meas[na], meas[nb])]
        mr, pr = statistics.median(rs), pa / pb
        q = mr / pr
        worst = max(worst, q, 1 / q)
        good = 0.85 <= q <= 1.15
        ok += good
        if cpu[na] and cpu[nb]:
            cr = cpu[na] / cpu[nb]
            cq = cr / pr
            cworst = max(cworst, cq, 1 / cq)
            cgood = 0.85 <= cq <= 1.15
            cok += cgood
            cpairs += 1
            c_txt = "%.2f | %.2f | %s" % (cr, cq, "yes" if cgood else "NO")
        else:
            c_txt = "- | - | -"
        lines.append("| %s vs %s%s | %.2f | %.2f (%.2f-%.2f) | %.2f | %s | %s |" % (
            na, nb, " (the same plan)" if identical(x, y) else "", pr, mr, min(rs), max(rs), q,
            "yes" if good else "NO", c_txt))
    # The noise floor: what the machine makes of the same plan trained twice a round (predicted 1.00).
    first = plans[first_i]
    noise = [(x[0], y[0]) for x, y in same] + ([(first[0], control[0])] if control else [])
    if control:
        rs = [x / y for x, y in zip(meas[first[0]], meas[control[0]])]
        lines.append("| %s vs %s | 1.00 | %.2f (%.2f-%.2f) | %.2f | not counted | - | - | - |" % (
            first[0], control[0], statistics.median(rs), min(rs), max(rs), statistics.median(rs)))
    # Identical plans are one plan trained more than once: their rounds pooled (the control's too), so
    # the planner's choice is not "slower than the fastest" when the fastest is itself, by noise.
    def runs(x):
        same_as = [y for y in plans if y is x or identical(x, y)] + ([control] if control and x is first else [])
        return [m for y in same_as for m in meas[y[0]]]

    fastest = min(plans, key=lambda x: statistics.median(runs(x)))
    slow = statistics.median(runs(first)) / statistics.median(runs(fastest))
    itself = fastest is not first and identical(fastest, first)
    predicted_best = min(plans, key=lambda x: x[3])
    lines.append("")
    timed = [x for x in plans if cpu[x[0]]]
    cfastest = min(timed, key=lambda x: cpu[x[0]]) if timed else None
    lines.append("Wall clock: pairs within 0.85-1.15: %d of %d (worst off by %.2fx). Predicted fastest: %s; measured "
                 "fastest: %s%s; the planner's choice (%s) is %.2fx the fastest's time (identical plans' rounds "
                 "pooled; target: within 1.05)." % (
                     ok, len(pairs), worst, predicted_best[0], fastest[0],
                     " (the same plan as the planner's choice)" if itself else "", first[0], slow))
    lines.append("")
    if noise:
        per_pair = [[x / y for x, y in zip(meas[na], meas[nb])] for na, nb in noise]
        meds = [statistics.median(rs) for rs in per_pair]
        every = [r for rs in per_pair for r in rs]
        span = lambda lo, hi: "%.2f" % lo if "%.2f" % lo == "%.2f" % hi else "%.2f-%.2f" % (lo, hi)
        lines.append("Noise floor, the same plan trained twice a round (%s): measured ratio %s (median of the "
                     "rounds), single rounds %s. A pair off by less than this is within what the machine's noise "
                     "alone makes of two identical plans." % (
                         "; ".join("%s vs %s" % p for p in noise), span(min(meds), max(meds)),
                         span(min(every), max(every))))
        lines.append("")
    choice = ("the planner's choice is %.2fx the fastest's" % (cpu[first[0]] / cpu[cfastest[0]])
              if cfastest and cpu[first[0]] else "no figure for the planner's choice")
    if a.device != "cpu":
        lines.append("CPU time / cores in use: not measured (--device %s)." % a.device)
    else:
        lines.append("CPU time / cores in use: pairs within 0.85-1.15: %d of %d with a figure (worst off by %.2fx); "
                     "fastest: %s; %s." % (cok, cpairs, cworst, cfastest[0] if cfastest else "-", choice))
    lines.append("")
    text = "\n".join(lines)
    print(text)
    with open(a.out, "a") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
