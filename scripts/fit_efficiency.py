#!/usr/bin/env python3
"""Fit the cost model's efficiency curves to DeepBench's V100 training kernels.

    e(N; S) = Emax * N / (N + N0(S)),   N0(S) = N0_ref * (clamp(S, S_lo, S_hi) / 2^20) ** -gamma

N is the work per call in rows (a GEMM's batch dimension: DeepBench's N; a convolution's implicit-
GEMM rows: batch x output pixels), S the size of the "weight" operand (GEMM: M x K; convolution:
out channels x in channels x filter height x width). e is the fraction of the datasheet peak reached
(15.7 TFLOP/s fp32, 125 TFLOP/s fp16 tensor cores on the V100-SXM2 of DeepBench's DGX-1).
gamma = 0 is the plain e(N) curve; gamma > 0 lets small weight matrices need more rows to fill the
GPU (DeepBench: N0 ~ 22 rows at 8448 x 2816, ~ 140 rows at 1024 x 512, fp32).

Fit: least squares on log(e), i.e. on the log of the time ratio predicted / measured (a relative
error that treats 2x too slow and 2x too fast alike). For fixed (N0_ref, gamma), log Emax is the
mean residual; (N0_ref, gamma) by a coarse grid refined three times. Standard library only.

Usage (from the repository root):
  scripts/fit_efficiency.py extract [/work/shared/data/deepbench]
      -> tests/fixtures/deepbench/v100_kernels.csv (the subset the fit uses, one row per kernel)
  scripts/fit_efficiency.py fit [--header src/cost/efficiency_v100.inc]
      -> prints the table (and the gamma = 0 fit for comparison); writes the C++ constants.

Source: Baidu Research DeepBench (github.com/baidu-research/DeepBench, Apache-2.0),
results/train/DeepBench_NV_V100.xlsx at commit da81ba7, sheets converted to CSV unchanged.
"""
import csv
import math
import os
import sys

FIXTURE = "tests/fixtures/deepbench/v100_kernels.csv"
HEADER = "src/cost/efficiency_v100.inc"
PEAK = {"fp32": 15.7e12, "fp16": 125e12}
FILES = {"fp32": "v100_train_fp32.csv", "fp16": "v100_train_fp16_mixed.csv"}
REF_ELEMS = 2.0 ** 20  # N0_ref is N0 for a 1024 x 1024 weight matrix
COLUMNS = ["precision", "class", "app", "rows", "weight_elems", "flops", "time_s", "shape"]


def num(x):
    try:
        return float(x)
    except ValueError:
        return None


def sections(path):
    """(section, row) for every data row of one DeepBench sheet."""
    sec = None
    for r in csv.reader(open(path, newline="")):
        if not r or all(not x.strip() for x in r):
            continue
        head = r[0].strip()
        if head.startswith("Dense Matrix"):
            sec = "gemm"
            continue
        if head == "Convolution":
            sec = "conv-header"
            continue
        if head.startswith("Recurrent") or head.startswith("All-Reduce") or head.startswith("*"):
            sec = None
            continue
        if sec == "conv-header":  # the column names under the "Convolution" title
            sec = "conv"
            continue
        if sec:
            yield sec, (r[1:] if r[0] == "" else r)  # some rows are shifted right by one cell


def extract_gemms(path, precision):
    """Dense GEMMs with M, K >= 512 and K <= 16384. Left out: M = 35 (a 35-wide output is not a
    layer the planner sees) and K = 500000 (vocabulary-sized reductions). The sheet's time column
    sits at different offsets (an empty cell, a comment cell): the time is the first number after
    the transpose flags, and the FLOP rate is recomputed from it (some rows lack it)."""
    seen = set()
    for sec, r in sections(path):
        if sec != "gemm":
            continue
        m, n, k = int(r[1]), int(r[2]), int(r[3])
        key = (m, n, k, r[4], r[5])
        if key in seen or m < 512 or k < 512 or k > 16384:
            continue
        seen.add(key)
        t = [v for v in (num(x) for x in r[6:]) if v is not None][0] * 1e-3
        yield {"precision": precision, "class": "gemm", "app": r[0], "rows": n, "weight_elems": m * k,
               "flops": 2.0 * m * n * k, "time_s": t, "shape": f"M={m} N={n} K={k} {r[4]}{r[5]}"}


def extract_convs(path, precision):
    """Forward convolutions that cuDNN ran as an implicit GEMM (the sheet's algorithm column: fp16
    always; fp32 also picks Winograd/FFT, whose direct-convolution FLOP rate reaches 2.4x the peak
    and says nothing about a GEMM's efficiency) with at least 16 input channels (the 1- and
    3-channel input layers are limited by their tiny reduction, not by rows)."""
    for sec, r in sections(path):
        if sec != "conv" or len(r) < 22 or num(r[1]) is None:
            continue
        w, h, c, n, k, s, rr = (int(x) for x in r[1:8])
        p, q = int(r[15]), int(r[16])
        alg = r[21].strip()
        if "GEMM" not in alg or c < 16:
            continue
        yield {"precision": precision, "class": "conv", "app": r[0], "rows": n * p * q,
               "weight_elems": k * c * rr * s, "flops": 2.0 * n * k * p * q * c * rr * s,
               "time_s": float(r[12]) * 1e-3,
               "shape": f"{w}x{h}x{c} N={n} K={k} {rr}x{s} -> {p}x{q} {alg}"}


def extract(src):
    out = []
    for prec, f in FILES.items():
        path = os.path.join(src, f)
        out += list(extract_gemms(path, prec)) + list(extract_convs(path, prec))
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    with open(FIXTURE, "w", newline="") as fh:
        fh.write("# DeepBench V100 training kernels (github.com/baidu-research/DeepBench, Apache-2.0,\n"
                 "# results/train/DeepBench_NV_V100.xlsx @ da81ba7), the subset scripts/fit_efficiency.py\n"
                 "# fits; rows = work per call, weight_elems = GEMM M*K / conv K*C*R*S, flops = 2*M*N*K or\n"
                 "# 2*N*K*P*Q*C*R*S, time_s = DeepBench's measured time (forward for convolutions).\n")
        wr = csv.DictWriter(fh, COLUMNS, lineterminator="\n")
        wr.writeheader()
        for row in out:
            wr.writerow({**row, "flops": "%.0f" % row["flops"], "time_s": "%.6g" % row["time_s"]})
    print(f"wrote {FIXTURE}: {len(out)} kernels")


def load(path=FIXTURE):
    with open(path, newline="") as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    pts = []
    for r in csv.DictReader(lines):
        e = float(r["flops"]) / float(r["time_s"]) / PEAK[r["precision"]]
        pts.append((r["precision"], r["class"], float(r["rows"]), float(r["weight_elems"]), e))
    return pts


def n0_at(n0_ref, gamma, s, lo, hi):
    return n0_ref * (min(max(s, lo), hi) / REF_ELEMS) ** -gamma


def sse(pts, n0_ref, gamma, lo, hi):
    res = [math.log(e) - math.log(n / (n + n0_at(n0_ref, gamma, s, lo, hi))) for n, s, e in pts]
    mean = sum(res) / len(res)
    return sum((x - mean) ** 2 for x in res), math.exp(mean)


def fit(pts, with_shape=True):
    """(emax, n0_ref, gamma, s_lo, s_hi) minimising the squared log error."""
    lo, hi = min(s for _, s, _ in pts), max(s for _, s, _ in pts)
    log_n0, gamma = math.log(50.0), 0.5
    step_n0, step_g = 2.0, 0.5
    best = None
    for _ in range(4):  # coarse grid, then three refinements around the best point
        for i in range(-20, 21):
            ln0 = log_n0 + step_n0 * i / 20
            for j in (range(-20, 21) if with_shape else [None]):
                g = 0.0 if j is None else max(0.0, gamma + step_g * j / 20)
                err, emax = sse(pts, math.exp(ln0), g, lo, hi)
                if best is None or err < best[0]:
                    best = (err, emax, ln0, g)
        _, _, log_n0, gamma = best
        step_n0, step_g = step_n0 / 8, step_g / 8
    _, emax, ln0, g = best
    return emax, math.exp(ln0), g, lo, hi


def errors(pts, curve):
    """RMS and max of |t_predicted / t_measured - 1| (t = flops / (peak e))."""
    emax, n0_ref, g, lo, hi = curve
    rel = [e / (emax * n / (n + n0_at(n0_ref, g, s, lo, hi))) - 1 for n, s, e in pts]
    return math.sqrt(sum(x * x for x in rel) / len(rel)), max(abs(x) for x in rel)


def run_fit(header):
    pts = load()
    results = {}
    print("class precision points | Emax  N0_ref(1024x1024) gamma  rms  max | plain e(N): Emax  N0  rms  max")
    for cls in ("gemm", "conv"):
        for prec in ("fp32", "fp16"):
            sel = [(n, s, e) for p, c, n, s, e in pts if p == prec and c == cls]
            curve = fit(sel)
            plain = fit(sel, with_shape=False)
            rms, mx = errors(sel, curve)
            prms, pmx = errors(sel, plain)
            results[(cls, prec)] = (curve, rms, mx, len(sel))
            print(f"{cls:5} {prec} {len(sel):4} | {curve[0]:.3f} {curve[1]:7.1f} {curve[2]:.3f}"
                  f"  {rms:.3f} {mx:.3f} | {plain[0]:.3f} {plain[1]:7.1f}  {prms:.3f} {pmx:.3f}")
    if header:
        write_header(header, results)
        print(f"wrote {header}")


def write_header(path, results):
    lines = ["// Generated by scripts/fit_efficiency.py from tests/fixtures/deepbench/v100_kernels.csv",
             "// (DeepBench V100 training kernels, github.com/baidu-research/DeepBench, Apache-2.0,",
             "// results/train/DeepBench_NV_V100.xlsx @ da81ba7). Do not edit by hand: rerun the script.",
             "// e(N; S) = emax * N / (N + n0_rows * (clamp(S, min, max) / 2^20)^-shape_exponent), fitted by",
             "// least squares on log(time). Errors: |t_fit / t_measured - 1| over the fitted kernels.",
             "// {emax, n0_rows, shape_exponent, ref_weight_elems, min_weight_elems, max_weight_elems}"]
    for (cls, prec), (c, rms, mx, n) in results.items():
        name = f"kV100{cls.capitalize()}{prec.upper()}"
        lines.append(f"// {cls} {prec}: {n} kernels, rms error {rms:.3f}, max {mx:.3f}")
        lines.append(f"constexpr EfficiencyCurve {name}{{{c[0]:.4f}, {c[1]:.2f}, {c[2]:.4f}, "
                     f"{REF_ELEMS:.0f}, {c[3]:.0f}, {c[4]:.0f}}};")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def main(argv):
    if len(argv) >= 2 and argv[1] == "extract":
        extract(argv[2] if len(argv) > 2 else "/work/shared/data/deepbench")
    elif len(argv) >= 2 and argv[1] == "fit":
        run_fit(argv[argv.index("--header") + 1] if "--header" in argv else None)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
