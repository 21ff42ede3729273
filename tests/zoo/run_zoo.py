#!/usr/bin/env python3
"""Runs graphpipe on every exported zoo cell (family x export) and says how each one fares.

export_zoo.py wrote, per family, three ONNX files (dynamo, legacy, graphpipe), NumPy training data
and PyTorch's own per-step losses. For each cell this script runs the graphpipe binary as a user
would and compares with PyTorch:

  a. `model info --model F.onnx`: exit 2 is a refusal (the first error line is kept);
  b. `train --single --model F.onnx --batch B --steps N --data NAME/train` with the reference's
     optimizer (SGD, lr, momentum): every step's loss must equal PyTorch's within 1e-5 relative +
     1e-5 absolute ("exact");
  c. if (b) is exact: `plan --cluster cpu --devices 3 --no-data-parallel --micro-batch 2` (then 4
     devices, then the same on the h200 preset, until a plan has 3 or more stages: the cpu preset
     finds one stage fastest for most models this small; --micro-batch B for models with BatchNorm,
     whose batch statistics need the whole mini-batch in one micro-batch) and `train --plan`,
     compared the same way.

Each cell ends in one result (the class in brackets is what expected.json records):

    exact (single + N-stage plan)       [exact]        both runs equal PyTorch's losses
    exact single; plan: <why>           [exact-single] the plan could not be made or trained (a
                                                       refusal, not a wrong number)
    refused: <first error line>         [refused]      graphpipe said no, with a message (exit 2)
    export failed: <exception>          [export-failed] the exporter itself raised (torch's side)
    DIFFERS by X (...)                  [differs]      graphpipe trained and its losses are not
                                                       PyTorch's, without an error: the worst outcome
    crash: <exit code or signal>        [crash]        anything else: exit 1, a signal, a timeout,
                                                       a missing log

With --expect FILE (tests/zoo/expected.json) the classes are compared with the recorded ones and the
exit status is 1 on a regression: a cell expected exact (or exact-single) that is now worse, or ANY
cell that DIFFERS or crashes (never allowed, whatever was recorded). A better cell prints
"improved: update expected.json" and does not fail. --write-expect FILE records the classes.
GRAPHPIPE_CALIBRATION is set to "off" (the cpu preset's fixed figures) unless already set, so that
plans, and so the stage counts, do not depend on the machine's timings.

Usage:
    python3 tests/zoo/run_zoo.py --graphpipe build/graphpipe OUTDIR [--only NAME[,NAME]]
        [--exports dynamo,legacy,graphpipe] [--table out.md] [--expect tests/zoo/expected.json]
        [--write-expect FILE] [--no-plan] [--plan-only NAME[,NAME]] [--timeout 300] [--export]
(--export runs export_zoo.py into OUTDIR first: what ctest model_zoo does, tests/zoo/CMAKE_SNIPPET.txt.)
Files per cell: OUTDIR/NAME/<export>/ (single.jsonl, plan*.json, pipe.jsonl, each command's output
in *.log); all results in OUTDIR/results.json.
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTS = ("dynamo", "legacy", "graphpipe")
RTOL = ATOL = 1e-5
# How good a class is: a regression is a drop from exact / exact-single; differs and crash always fail.
RANK = {"exact": 5, "exact-single": 4, "refused": 3, "export-failed": 2, "crash": 0, "differs": 0}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Cmd:
    """One finished subprocess: exit status, output, and the first error line graphpipe printed."""

    def __init__(self, argv, rc, out, err, secs, timed_out=False):
        self.argv, self.rc, self.out, self.err, self.secs, self.timed_out = argv, rc, out, err, secs, timed_out

    def error_line(self):
        """graphpipe's one-line error (`graphpipe: error: ...` / `failed: ...`), else stderr's last line."""
        lines = [ln.strip() for ln in self.err.splitlines() if ln.strip()]
        for ln in lines:
            for prefix in ("graphpipe: error: ", "graphpipe: failed: "):
                if ln.startswith(prefix):
                    return ln[len(prefix):]
        return lines[-1] if lines else "(no message)"

    def crash_text(self):
        if self.timed_out:
            return f"timeout after {self.secs:.1f} s"
        if self.rc < 0:
            try:
                return f"signal {signal.Signals(-self.rc).name}"
            except ValueError:
                return f"signal {-self.rc}"
        return f"exit {self.rc}: {self.error_line()}"


def run(argv, log_path, timeout, env):
    """Runs argv in its own process group (a timed-out `train --plan` takes its workers with it),
    writes the command and its output to log_path."""
    for attempt in range(20):
        t0 = time.time()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    start_new_session=True)
            break
        except OSError as e:  # the binary is being relinked (a build in another shell): wait for it
            if attempt == 19:
                raise
            print(f"  cannot start {argv[0]} ({e.strerror}): retrying in 15 s", flush=True)
            time.sleep(15)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    cmd = Cmd(argv, proc.returncode, out, err, time.time() - t0, timed_out)
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.write(f"# exit {cmd.rc}{' (timeout)' if timed_out else ''}, {cmd.secs:.1f} s\n")
        f.write("--- stdout\n" + out + "--- stderr\n" + err)
    return cmd


def read_losses(path):
    losses = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    losses.append(float(json.loads(line)["loss"]))
    return losses


def compare(losses, ref):
    """(exact?, worst |diff|, its step, that step's relative diff) of graphpipe's vs PyTorch's losses."""
    worst, at = 0.0, -1
    exact = True
    for k, (a, b) in enumerate(zip(losses, ref)):
        d = abs(a - b)
        if not d <= ATOL + RTOL * abs(b):  # also catches nan
            exact = False
        if d > worst or d != d:
            worst, at = d, k
    rel = worst / abs(ref[at]) if at >= 0 and ref[at] else 0.0
    return exact, worst, at, rel


def optimizer_args(ref):
    return ["--optimizer", ref["optimizer"], "--lr", repr(ref["lr"]), "--momentum", repr(ref["momentum"])]


def run_training(gp, what, argv_head, ref, steps, folder, name, timeout, env):
    """Trains (single or a plan) and compares; returns (class or None when exact, text, detail)."""
    log = os.path.join(folder, name + ".jsonl")
    if os.path.exists(log):
        os.remove(log)
    cmd = run(argv_head + ["--steps", str(steps), "--data", os.path.join(folder, "..", "train"), "--log", log]
              + optimizer_args(ref), os.path.join(folder, name + ".log"), timeout, env)
    detail = {"seconds": round(cmd.secs, 2), "rc": cmd.rc}
    if cmd.rc == 2:
        return "refused", f"{what} refused: {cmd.error_line()}", detail
    if cmd.rc != 0 or cmd.timed_out:
        return "crash", f"{what}: {cmd.crash_text()}", detail
    losses = read_losses(log)
    detail["losses"] = losses
    if len(losses) != steps:
        return "crash", f"{what}: exit 0 but the log has {len(losses)} of {steps} losses", detail
    exact, worst, at, rel = compare(losses, ref["losses"][:steps])
    detail.update(max_abs_diff=worst, worst_step=at)
    if not exact:
        return ("differs", f"DIFFERS by {worst:.3g} ({rel:.2g} relative) at step {at} ({what}: "
                f"{losses[at]:.6f} vs PyTorch {ref['losses'][at]:.6f})", detail)
    return None, "exact", detail


MICRO_BATCH = 2  # 4 micro-batches of the mini-batch of 8 per stage: 1F1B with gradient accumulation


def plan_attempts(ref, batch):
    """The plan commands tried in turn until one has 3+ stages (else the deepest is trained).

    A pipeline, not the whole model on one device (--no-data-parallel), with micro-batches of 2;
    models with BatchNorm keep the whole mini-batch in one micro-batch (their batch statistics are
    the mini-batch's). For models this small the cpu preset predicts one stage fastest even then,
    so after 3 and 4 cpu devices the h200 preset is tried (python/tests plan small models on it
    too): a plan is a plan whatever it was made for, and `train --plan` runs it on CPU workers.
    """
    micro = str(batch if ref.get("batchnorm") else MICRO_BATCH)
    return [["--cluster", cluster, "--devices", devices, "--no-data-parallel", "--micro-batch", micro]
            for cluster in ("cpu", "h200") for devices in ("3", "4")]


def run_cell(gp, outdir, fam, how, ref, steps, do_plan, timeout, env):
    """One family x export; returns the cell's record {class, text, ...}."""
    exp = ref["exports"].get(how)
    if exp is None:
        return {"class": "export-failed", "text": "export failed: not exported (run export_zoo.py)"}
    if exp["status"] != "ok":
        return {"class": "export-failed", "text": ANSI.sub("", exp["status"])}
    model = os.path.join(outdir, fam, how + ".onnx")
    folder = os.path.join(outdir, fam, how)
    os.makedirs(folder, exist_ok=True)
    cell = {"loss": ref["loss"]}

    info = run([gp, "model", "info", "--model", model, "--json"], os.path.join(folder, "info.log"), timeout, env)
    if info.rc == 2:
        return {**cell, "class": "refused", "text": "refused: " + info.error_line()}
    if info.rc != 0 or info.timed_out:
        return {**cell, "class": "crash", "text": "crash: model info: " + info.crash_text()}
    try:
        cell["params"] = json.loads(info.out)["params"]
    except (ValueError, KeyError):
        pass
    cell["warnings"] = [ln for ln in info.err.splitlines() if ln.strip()]
    if cell.get("params") is not None and cell["params"] != ref["parameters"]:
        cell["params_note"] = f"graphpipe counts {cell['params']:,} parameters, PyTorch {ref['parameters']:,}"

    batch = ref["batch"]
    klass, text, detail = run_training(gp, "single", [gp, "train", "--single", "--model", model, "--batch", str(batch)],
                                       ref, steps, folder, "single", timeout, env)
    cell["single"] = detail
    if klass is not None:
        if klass == "refused":
            text = "refused: " + text[len("single refused: "):]
        elif klass == "crash":
            text = "crash: " + text
        return {**cell, "class": klass, "text": text}
    if not do_plan:  # expected "exact" still holds: what was run is exact
        return {**cell, "class": "exact-single", "text": "exact single; plan: not run", "plan_skipped": True}

    # c. a plan of 3+ stages, trained, compared.
    best = None  # (stages, plan path, attempt)
    why = None
    for k, attempt in enumerate(plan_attempts(ref, batch)):
        path = os.path.join(folder, f"plan{k}.json")
        argv = [gp, "plan", "--model", model, "--batch", str(batch), "--optimizer",
                ref["optimizer"], "--out", path] + attempt
        p = run(argv, os.path.join(folder, f"plan{k}.log"), timeout, env)
        if p.rc != 0 or p.timed_out:
            why = ("plan refused: " + p.error_line()) if p.rc == 2 else ("plan " + p.crash_text())
            if p.rc != 2:
                return {**cell, "class": "crash", "text": "crash: " + why}
            continue
        with open(path) as f:
            stages = len(json.load(f)["stages"])
        if best is None or stages > best[0]:
            best = (stages, path, " ".join(attempt))
        if stages >= 3:
            break
    if best is None:
        return {**cell, "class": "exact-single", "text": f"exact single; {why}"}
    stages, path, attempt = best
    cell["plan"] = {"stages": stages, "flags": attempt}
    klass, text, detail = run_training(gp, f"{stages}-stage plan", [gp, "train", "--plan", path], ref, steps,
                                       folder, "pipe", timeout, env)
    cell["pipe"] = detail
    if klass is None:
        return {**cell, "class": "exact", "text": f"exact (single + {stages}-stage plan)"}
    if klass == "refused":
        return {**cell, "class": "exact-single", "text": f"exact single; plan: {text}"}
    if klass == "crash":
        return {**cell, "class": "crash", "text": f"crash: exact single, then {text}"}
    return {**cell, "class": "differs", "text": f"{text}; single exact"}


def loss_label(ref):
    """"cross_entropy on [B, 2]", "mse on [B, 8, 32]", or each output's, summed."""
    shapes = ref.get("output_shapes") or [None] * len(ref["loss"])
    parts = ["its own loss (a scalar output)" if kind == "own" else
             kind + (" on [" + ", ".join(["B"] + [str(d) for d in shape]) + "]" if shape is not None else "")
             for (kind, _), shape in zip(ref["loss"], shapes)]
    return parts[0] if len(parts) == 1 else " + ".join(parts) + " (summed)"


def shorten(text):
    """A cell's gist for the table: no file name or boilerplate ahead of the reason; for an export
    that torch wrapped, the underlying error."""
    text = re.sub(r"^refused: \S+\.onnx: ", "refused: ", text)
    text = text.replace("cannot import the ONNX model (nothing was imported): ", "")
    text = text.replace("unsupported uses: ", "")
    m = re.match(r"export failed: .*\(cause: (.*)\)$", text)
    return "export failed: " + m.group(1) if m else text


def write_table(path, results, refs, hows):
    """Rows: families; columns: parameters, loss, one per export. Long messages go to notes below."""
    notes = []

    def cell_text(c):
        text = c["text"]
        if len(text) <= 90:
            return text
        notes.append(text)
        short = shorten(text)
        return f"{short[:87].rstrip() + '...' if len(short) > 90 else short} [{len(notes)}]"

    lines = ["| family | params | loss graphpipe appends | " + " | ".join(hows) + " |",
             "|---|---:|---|" + "---|" * len(hows)]
    for fam, cells in results.items():
        ref = refs[fam]
        row = [fam, f"{ref['parameters']:,}", loss_label(ref)]
        row += [cell_text(cells[h]).replace("|", "\\|") if h in cells else "-" for h in hows]
        lines.append("| " + " | ".join(row) + " |")
    if notes:
        lines.append("")
        lines += [f"[{k}] {t}" for k, t in enumerate(notes, 1)]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def check_expected(path, results):
    """Prints every change against the recorded classes; returns the number of regressions."""
    with open(path) as f:
        expected = json.load(f)["cells"]
    bad = 0
    for fam, cells in results.items():
        for how, c in cells.items():
            got, want = c["class"], expected.get(fam, {}).get(how)
            where = f"{fam}/{how}"
            if got == "exact-single" and want == "exact" and c.get("plan_skipped"):
                continue  # the plan was not run this time (--no-plan / --plan-only)
            if got in ("differs", "crash"):
                print(f"REGRESSION {where}: {c['text']} (never allowed; expected {want})")
                bad += 1
            elif want is None:
                print(f"new cell {where}: {got}: add it to expected.json")
            elif want in ("exact", "exact-single") and RANK[got] < RANK[want]:
                print(f"REGRESSION {where}: expected {want}, got {got}: {c['text']}")
                bad += 1
            elif RANK[got] > RANK.get(want, 0):
                print(f"improved {where}: {want} -> {got}: update expected.json")
            elif got != want:
                print(f"changed {where}: {want} -> {got} (not a regression): update expected.json")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--graphpipe", required=True, help="the graphpipe binary")
    ap.add_argument("--only", help="comma-separated family names (default: every family in OUTDIR)")
    ap.add_argument("--exports", default=",".join(EXPORTS))
    ap.add_argument("--steps", type=int, help="steps to train (default: the reference's)")
    ap.add_argument("--no-plan", action="store_true", help="stop after --single (exact cells are exact-single)")
    ap.add_argument("--plan-only", help="comma-separated families that get step c (default: all)")
    ap.add_argument("--export", action="store_true",
                    help="first run export_zoo.py OUTDIR (same --only and --exports): one command for ctest")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per command (default %(default)s)")
    ap.add_argument("--table", help="write the markdown result table here")
    ap.add_argument("--expect", help="expected.json: exit 1 on a regression")
    ap.add_argument("--write-expect", help="record the classes found here")
    a = ap.parse_args()
    gp = os.path.abspath(a.graphpipe)
    env = dict(os.environ)
    env.setdefault("GRAPHPIPE_CALIBRATION", "off")
    hows = [h for h in a.exports.split(",") if h]
    if a.export:
        argv = [sys.executable, os.path.join(HERE, "export_zoo.py"), a.outdir, "--exports", ",".join(hows)]
        if a.only:
            argv += ["--only", a.only]
        t0 = time.time()
        rc = subprocess.call(argv, env=env)
        print(f"export_zoo.py: {time.time() - t0:.1f} s", flush=True)
        if rc != 0:
            print(f"export_zoo.py failed (exit {rc})")
            return 1
    if a.only:
        fams = a.only.split(",")
    else:
        sys.path.insert(0, HERE)
        from families import FAMILIES  # the zoo's order
        fams = [f.name for f in FAMILIES if os.path.exists(os.path.join(a.outdir, f.name, "reference.json"))]
    plan_only = set(a.plan_only.split(",")) if a.plan_only else None
    refs, results = {}, {}
    t_all = time.time()
    total, done = len(fams) * len(hows), 0
    for fam in fams:
        with open(os.path.join(a.outdir, fam, "reference.json")) as f:
            refs[fam] = json.load(f)
        steps = a.steps or refs[fam]["steps"]
        if steps > len(refs[fam]["losses"]):
            ap.error(f"{fam}: --steps {steps} but the reference has {len(refs[fam]['losses'])} losses")
        results[fam] = {}
        for how in hows:
            t0 = time.time()
            do_plan = not a.no_plan and (plan_only is None or fam in plan_only)
            cell = run_cell(gp, a.outdir, fam, how, refs[fam], steps, do_plan, a.timeout, env)
            # graphpipe names the file as given; the table should not depend on where OUTDIR is.
            cell["text"] = cell["text"].replace(os.path.join(a.outdir, fam, how + ".onnx"), f"{fam}/{how}.onnx")
            cell["seconds"] = round(time.time() - t0, 1)
            results[fam][how] = cell
            done += 1
            print(f"[{done}/{total}] {fam}/{how}: {cell['text']} ({cell['seconds']:.1f} s)", flush=True)
    elapsed = time.time() - t_all
    with open(os.path.join(a.outdir, "results.json"), "w") as f:
        json.dump({"seconds": round(elapsed, 1), "cells": results}, f, indent=2, sort_keys=True)
        f.write("\n")
    counts = {}
    for cells in results.values():
        for c in cells.values():
            counts[c["class"]] = counts.get(c["class"], 0) + 1
    print(f"{total} cells in {elapsed:.1f} s: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if a.table:
        write_table(a.table, results, refs, hows)
        print("wrote", a.table)
    if a.write_expect:
        with open(a.write_expect, "w") as f:
            json.dump({"comment": "run_zoo.py's class per family and export (tests/zoo); exact, exact-single, "
                                  "refused, export-failed (differs and crash are never allowed)",
                       "cells": {fam: {h: c["class"] for h, c in cells.items()} for fam, cells in results.items()}},
                      f, indent=2)
            f.write("\n")
        print("wrote", a.write_expect)
    if a.expect:
        bad = check_expected(a.expect, results)
        if bad:
            print(f"{bad} regression(s) against {a.expect}")
            return 1
        print(f"no regression against {a.expect}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
