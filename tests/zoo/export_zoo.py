#!/usr/bin/env python3
"""Exports every zoo family (families.py) the three ways users export, with its data and PyTorch's losses.

Users hand graphpipe ONNX files written by one of three calls, and the zoo checks all three:

    dynamo     torch.onnx.export(model, args, f, dynamo=True, dynamic_shapes=...): torch 2.x's default
               exporter (torch.export + onnxscript's optimizer, opset 18+), a dynamic batch
               `torch.export.Dim("batch")` on dim 0 of every input, everything else default
    legacy     torch.onnx.export(model, args, f, dynamo=False, input_names=..., dynamic_axes=...):
               the TorchScript exporter with its defaults (eval mode, constant folding), a dynamic
               batch on every input
    graphpipe  graphpipe.export(model, args, f) (python/graphpipe): TorchScript, training mode, no
               folding, parameter names recorded (exact import)

An export that raises is recorded, not fatal: `export failed: <exception type>: <first line>` (with
the first line of its cause when torch wraps the real error). Every export starts from a fresh
`family.build()` (seeded), so the file's initializers are the module's initial weights, the weights
the reference starts from: `graphpipe train` starts an imported model from the file's initializers.

Writes, per family, OUTDIR/NAME/:
    dynamo.onnx (+ dynamo.onnx.data when the exporter writes external weights), legacy.onnx,
    graphpipe.onnx                 the three exports (absent when that export failed)
    train/<input>.npy              N_TRAIN rows per forward argument (float32, or int64 ids)
    train/label.npy | target.npy   the appended loss's target (label_k / target_k for several outputs)
    reference.json                 PyTorch's per-step training losses (training mode, SGD with
                                   momentum, step k on rows [k*B, (k+1)*B) mod N, graphpipe's loss),
                                   the hyper-parameters, the loss used, the parameter count, and
                                   each export's outcome ("ok" or "export failed: ...") and the ONNX
                                   graph's input names

Usage:
    python3 tests/zoo/export_zoo.py OUTDIR [--only NAME[,NAME...]] [--exports dynamo,legacy,graphpipe]
        [--steps N]
Needs torch, onnx and onnxscript (scripts/install-deps.sh). run_zoo.py runs graphpipe on the result.
"""
import argparse
import contextlib
import json
import os
import re
import sys
import time
import warnings

import numpy as np
import onnx
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import families  # noqa: E402
from families import BATCH, FAMILIES, N_TRAIN, OPTIMIZER, STEPS  # noqa: E402

EXPORTS = ("dynamo", "legacy", "graphpipe")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torch colours its export errors


def first_line(exc: BaseException) -> str:
    """`Type: first line` of an exception, plus its cause's (torch wraps the real error)."""
    def one(e):
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    text = one(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        text += f" (cause: {one(cause)})"
    return text


def export_dynamo(fam, path):
    model, args = fam.build(), fam.example_inputs()
    batch = torch.export.Dim("batch")
    torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=tuple({0: batch} for _ in args))


def export_legacy(fam, path):
    model, args = fam.build(), fam.example_inputs()
    names = fam.input_names()
    torch.onnx.export(model, args, path, dynamo=False, input_names=names,
                      dynamic_axes={n: {0: "batch"} for n in names})


def export_graphpipe(fam, path):
    import graphpipe
    graphpipe.export(fam.build(), fam.example_inputs(), path, input_names=fam.input_names())


EXPORTERS = {"dynamo": export_dynamo, "legacy": export_legacy, "graphpipe": export_graphpipe}


def remove_export(path):
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.remove(p)


@contextlib.contextmanager
def quiet(log):
    """Sends everything written to stdout and stderr, by Python or by C++ (torch.export's logging,
    the TorchScript exporter's graph dumps), to the file `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_export(fam, how, path, log):
    """One export; returns ("ok" | "export failed: ...", graph input names or None, seconds).
    The exporters' chatter (dynamo prints its progress) goes to `log`."""
    remove_export(path)
    t0 = time.time()
    try:
        with quiet(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            EXPORTERS[how](fam, path)
        status = "ok"
        inputs = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
        inits = {t.name for t in onnx.load(path, load_external_data=False).graph.initializer}
        inputs = [n for n in inputs if n not in inits]
    except Exception as e:  # noqa: BLE001: any exporter error is a result to record
        status = "export failed: " + ANSI.sub("", first_line(e))
        inputs = None
        remove_export(path)
    return status, inputs, time.time() - t0


def write_data(fam, folder):
    os.makedirs(folder, exist_ok=True)
    for name, arr in {**fam.data(), **fam.targets()}.items():
        np.save(os.path.join(folder, name + ".npy"), arr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--only", help="comma-separated family names (default: all)")
    ap.add_argument("--exports", default=",".join(EXPORTS), help="comma-separated subset of " + ",".join(EXPORTS))
    ap.add_argument("--steps", type=int, default=STEPS, help="reference steps (default %(default)s)")
    a = ap.parse_args()
    fams = [families.by_name(n) for n in a.only.split(",")] if a.only else FAMILIES
    hows = [h for h in a.exports.split(",") if h]
    bad = [h for h in hows if h not in EXPORTS]
    if bad:
        ap.error(f"unknown export {bad[0]!r}; choose from {','.join(EXPORTS)}")
    torch.set_num_threads(1)  # deterministic, and polite on a shared 2-core machine
    # nn.TransformerEncoder's note that norm_first disables the nested-tensor fast path (Whisper's):
    # PyTorch's default behaviour, nothing to act on.
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
    t_all = time.time()
    for fam in fams:
        folder = os.path.join(a.outdir, fam.name)
        os.makedirs(folder, exist_ok=True)
        write_data(fam, os.path.join(folder, "train"))
        ref_path = os.path.join(folder, "reference.json")
        ref = {}
        if os.path.exists(ref_path):  # keep the other exports' outcomes when only some are redone
            with open(ref_path) as f:
                ref = json.load(f)
        t0 = time.time()
        ref.update({
            "family": fam.name, "summary": fam.summary, "torch": torch.__version__,
            "parameters": fam.num_parameters(), "inputs": fam.input_names(),
            "loss": families.loss_kinds(fam.output_shapes()), "output_shapes": fam.output_shapes(),
            "batchnorm": fam.batchnorm,
            "n_train": N_TRAIN, "batch": BATCH, "steps": a.steps, **OPTIMIZER,
            "losses": families.reference_losses(fam, steps=a.steps),
        })
        t_ref = time.time() - t0
        exports = ref.get("exports", {})
        for how in hows:
            status, inputs, secs = run_export(fam, how, os.path.join(folder, how + ".onnx"),
                                              os.path.join(folder, how + ".export.log"))
            exports[how] = {"status": status, "graph_inputs": inputs, "seconds": round(secs, 2)}
            if inputs is not None and inputs != fam.input_names():
                print(f"  note: {fam.name}/{how}: graph inputs {inputs} are not the forward's {fam.input_names()}")
        ref["exports"] = exports
        with open(ref_path, "w") as f:
            json.dump(ref, f, indent=2, sort_keys=True)
            f.write("\n")
        summary = ", ".join(f"{h} {exports[h]['status'][:70]} ({exports[h]['seconds']:.1f} s)" for h in hows)
        print(f"{fam.name}: {ref['parameters']} params, reference {t_ref:.1f} s; {summary}", flush=True)
    print(f"exported {len(fams)} families in {time.time() - t_all:.1f} s")


if __name__ == "__main__":
    main()
