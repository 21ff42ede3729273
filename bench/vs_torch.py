#!/usr/bin/env python3
"""graphpipe train vs PyTorch's torch.distributed.pipelining, side by side, on this machine (issue 38).

Same models, same initial weights, same data in the same order, same optimizer (SGD, momentum 0.9),
the same mini-batch, 2 CPU processes with 1 intra-op thread each on both sides:

  graphpipe   `graphpipe plan --cluster cpu --devices 2` picks the stages (a DAG: branches may run
              side by side), `graphpipe train --plan` runs them (1F1B by default, Gloo).
  graphpipe cut  `graphpipe train` on a hand-written plan with torch's 2-stage cut and micro-batch
              count (1F1B): the same stages as "torch 1f1b", so the two runtimes are compared alone.
  graphpipe --single, torch 1 process   the whole model in one process (the reference; --no-single
              leaves them out of the timing).
  torch       torch.distributed.pipelining over Gloo, the model cut by hand into a chain of stages
              (2 stages for ScheduleGPipe / Schedule1F1B: the balanced cut points are tried and the
              fastest kept; 4 stages, 2 per rank, for ScheduleInterleavedZeroBubble).
              Micro-batches: the graphpipe plan's count (mini-batch / smallest stage micro-batch), or
              4 when the plan has a single micro-batch.

With --no-pipelines only the two 1-process engines run. With --device cuda they run on the GPU:
plain PyTorch (the model on the GPU, each step's rows copied there from page-locked memory) and
`graphpipe train --single --device cuda` (the same rows through its pinned upload), same weights,
data, steps and optimizer; the parity check and the timing rounds as below. The pipelines need a
GPU per rank (NCCL) and are left out.

Each model is defined here as a list of "units" (a module reading named values and writing one);
its ONNX export for graphpipe is the whole model, and the torch stages are contiguous runs of units
that pass on the values later units still need (a chain pipeline has to forward the inputs of the
towers of a later stage through the earlier ones; graphpipe reads each input where it is used).

Steps:
  1. export every model (torch.onnx.export, TorchScript exporter, training mode, weights included),
     check that `graphpipe model info` imports it with PyTorch's parameter count; write the data set
     (<input>.npy per graph input, label.npy) and the weights (state_dict) for the torch workers;
  2. plan it with graphpipe; time each unit (forward + backward) in this process to find the
     balanced chain cuts; search the torch 2-stage cut (Schedule1F1B, a few steps per candidate);
  3. parity: plain PyTorch in one process (the reference), `graphpipe train --single`, and the first
     --parity-steps steps of every pipelined engine (from round 1) must agree to --tolerance
     relative on every step's loss (exit 1 otherwise);
  4. timing: --rounds rounds, each running every engine once for --steps steps (engines interleaved,
     the order alternating per round); per engine the median step time over all rounds, leaving out
     the first --skip steps of each run.

A step's time is, on both sides, the latest end minus the earliest start of that step over the two
ranks (graphpipe's step_time_s; for torch: zero_grad, schedule.step, optimizer.step, with
time.monotonic() on each rank).

    python3 bench/vs_torch.py --graphpipe build/graphpipe --out build/vs-torch.json
    python3 bench/vs_torch.py --help        # sizes, steps, rounds, models, schedules

Exit status: 0 done, 1 a parity check failed (or an engine failed to run), 2 graphpipe or torch is
missing or unusable.
"""
import argparse
import datetime
import itertools
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:  # reported by main() with exit 2
    torch = None
    nn = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

FORMAT = "graphpipe.vs-torch/1"
LR_DEFAULT = {"chain": 0.05, "uno": 0.01, "towers": 0.01}
BATCH_DEFAULT = {"chain": 32, "uno": 128, "towers": 256}
T0 = time.monotonic()


def progress(msg):
    print(f"[vs-torch {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Models: a list of units; unit i reads named values (graph inputs or earlier units' outputs) and
# writes one named value. The last unit writes the logits.
# ------------------------------------------------------------------------------------------------

if nn is not None:

    class Unit(nn.Module):
        def __init__(self, reads, writes, body):
            super().__init__()
            self.reads, self.writes, self.body = list(reads), writes, body

        def forward(self, *xs):
            return self.body(*xs)

    class UnitModel(nn.Module):
        """A model as a sequence of units over a dictionary of named values."""

        def __init__(self, inputs, units):
            super().__init__()
            self.input_names = list(inputs)  # [(name, per-sample shape, dtype)]
            self.units = nn.ModuleList(units)

        def forward(self, *xs):
            env = dict(zip([n for n, _, _ in self.input_names], xs))
            for u in self.units:
                env[u.writes] = u(*[env[r] for r in u.reads])
            return env[self.units[-1].writes]

        def live_after(self, i):
            """Names defined after unit i (-1: before any) that a unit after i still reads."""
            defined = [n for n, _, _ in self.input_names] + [u.writes for u in self.units[:i + 1]]
            later = set(r for u in self.units[i + 1:] for r in u.reads)
            if i == len(self.units) - 1:
                return [self.units[-1].writes]
            return [n for n in defined if n in later]

    class ContiguousGrad(torch.autograd.Function):
        """Identity whose backward makes the gradient contiguous. The zero-bubble schedules compute a
        stage's input gradients with torch.autograd.grad, which returns the gradient of a concat's
        operand as a non-contiguous view, and Gloo's isend then fails ("input tensor has to be
        contiguous"); the other schedules accumulate into .grad, which copies. Wrapping every received
        stage input costs at most that copy and changes no value."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g.contiguous()

    class StageModule(nn.Module):
        """Units [a, b) of a UnitModel: takes live_after(a - 1), returns live_after(b - 1)."""

        def __init__(self, model, a, b, split_backward=False):
            super().__init__()
            self.split_backward = split_backward
            self.units = nn.ModuleList(model.units[a:b])
            self.in_names = model.live_after(a - 1) if a > 0 else [n for n, _, _ in model.input_names]
            self.out_names = model.live_after(b - 1)

        def forward(self, *xs):
            raw = dict(zip(self.in_names, xs))  # passed on as they are (a view must not be an output)
            env = {n: ContiguousGrad.apply(x) if x.requires_grad else x for n, x in raw.items()}
            for u in self.units:
                env[u.writes] = u(*[env[r] for r in u.reads])
            outs = tuple(raw[n] if n in raw else env[n] for n in self.out_names)
            if self.split_backward:  # see run_torch_config
                outs = tuple(o if n not in raw or not o.is_floating_point()
                             else o.clone() if o.requires_grad else o.detach().requires_grad_(True)
                             for n, o in zip(self.out_names, outs))
            return outs[0] if len(outs) == 1 else outs

    class Block(nn.Module):
        """Pre-norm MLP block with a residual: x + W2 gelu(W1 LN(x))."""

        def __init__(self, d, ffn):
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, ffn)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(ffn, d)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(self.ln(x))))

    class Embed(nn.Module):
        def __init__(self, vocab, seq, d):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)

        def forward(self, ids):
            return self.tok(ids) + self.pos

    class MeanHead(nn.Module):
        def __init__(self, d, classes):
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.fc = nn.Linear(d, classes)

        def forward(self, h):
            return self.fc(self.ln(h).mean(dim=1))

    class ConcatHead(nn.Module):
        def __init__(self, d_in, hidden, classes):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))

        def forward(self, *towers):
            return self.mlp(torch.cat(towers, dim=1))


def mlp(d_in, width, depth, act):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), act()]
        d = width
    return nn.Sequential(*layers)


def build_chain(a):
    """GPT-like block stack without attention: ids -> embedding + positions -> N pre-norm MLP
    blocks with residuals -> LayerNorm -> mean over the sequence -> classifier."""
    units = [Unit(["ids"], "h0", Embed(a.vocab, a.seq, a.d_model))]
    for i in range(a.layers):
        units.append(Unit([f"h{i}"], f"h{i + 1}", Block(a.d_model, a.ffn)))
    units.append(Unit([f"h{a.layers}"], "logits", MeanHead(a.d_model, a.classes)))
    return UnitModel([("ids", (a.seq,), "int64")], units)


def build_uno(a):
    """CANDLE-Uno-like: one MLP tower per input (different input widths), concat, MLP head."""
    dims = a.uno_inputs
    inputs = [(f"x{t}", (d,), "float32") for t, d in enumerate(dims)]
    units = [Unit([f"x{t}"], f"t{t}", mlp(d, a.uno_hidden, a.uno_depth, nn.ReLU)) for t, d in enumerate(dims)]
    units.append(Unit([f"t{t}" for t in range(len(dims))], "logits",
                      ConcatHead(len(dims) * a.uno_hidden, a.uno_hidden, a.classes)))
    return UnitModel(inputs, units)


def build_towers(a):
    """Towers of different depth and activation over the same input, concat, MLP head (a wider
    two_branch fixture)."""
    acts = [nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid]
    depths = a.tower_depths
    units = [Unit(["x"], f"t{t}", mlp(a.tower_input, a.tower_width, d, acts[t % len(acts)]))
             for t, d in enumerate(depths)]
    units.append(Unit([f"t{t}" for t in range(len(depths))], "logits",
                      ConcatHead(len(depths) * a.tower_width, a.tower_width, a.classes)))
    return UnitModel([("x", (a.tower_input,), "float32")], units)


MODELS = {
    "chain": (build_chain, "chain: embedding + {layers} x [LayerNorm, Linear {d_model}->{ffn}, GELU, "
              "Linear {ffn}->{d_model}, residual] + mean + classifier, seq {seq}"),
    "uno": (build_uno, "4-branch (CANDLE-Uno-like): one {uno_depth}-layer ReLU MLP tower of width "
            "{uno_hidden} per input (inputs {uno_inputs}), concat, 2-layer head"),
    "towers": (build_towers, "multi-branch, one input: {ntowers} MLP towers of width {tower_width} and "
               "depths {tower_depths} (ReLU, Tanh, GELU, Sigmoid) over x[{tower_input}], concat, 2-layer head"),
}


def describe(name, a):
    d = dict(vars(a))
    d["ntowers"] = len(a.tower_depths)
    return MODELS[name][1].format(**d)


def make_model(name, a, seed):
    torch.manual_seed(seed)
    m = MODELS[name][0](a)
    m.train()
    return m


# ------------------------------------------------------------------------------------------------
# Data: features normal(0, 1) (token ids uniform), labels the argmax of a fixed random linear map
# of the features (for ids: the mean over the sequence of a random vector per token).
# ------------------------------------------------------------------------------------------------

def make_data(model, n, classes, vocab, seed):
    rng = np.random.default_rng(seed)
    arrays, feats = {}, []
    for name, shape, dtype in model.input_names:
        if dtype == "int64":
            ids = rng.integers(0, vocab, size=(n,) + tuple(shape), dtype=np.int64)
            table = rng.standard_normal((vocab, 16))
            arrays[name] = ids
            feats.append(table[ids].mean(axis=1))
        else:
            x = rng.standard_normal((n,) + tuple(shape)).astype(np.float32)
            arrays[name] = x
            feats.append(x.reshape(n, -1)[:, :256].astype(np.float64))
    f = np.concatenate(feats, axis=1)
    teacher = rng.standard_normal((f.shape[1], classes))
    arrays["label"] = np.argmax(f @ teacher, axis=1).astype(np.int64)
    return arrays


def rows(step, batch, n):
    """graphpipe train --data without --shuffle: step k reads rows [kB, (k+1)B) modulo N."""
    return np.array([(step * batch + j) % n for j in range(batch)], dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# torch.distributed.pipelining workers (spawned: 2 processes, Gloo, 1 intra-op thread each)
# ------------------------------------------------------------------------------------------------

SCHEDULES = {  # name -> (class name in torch.distributed.pipelining, stages per rank, placement)
    "gpipe": ("ScheduleGPipe", 1, "loop"),
    "1f1b": ("Schedule1F1B", 1, "loop"),
    "izb": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "zbv": ("ScheduleZBVZeroBubble", 2, "v"),
    "i1f1b": ("ScheduleInterleaved1F1B", 2, "loop"),
}


def stage_ids(rank, world, per_rank, placement):
    if per_rank == 1:
        return [rank]
    if placement == "v":  # rank r holds stages r and 2W - 1 - r
        return [rank, 2 * world - 1 - rank]
    return [rank + k * world for k in range(per_rank)]


def run_torch_config(rank, world, job, cfg, model_args, state, data):
    import torch.distributed as dist
    from torch.distributed import pipelining as pp

    model = make_model(job["model"], model_args, 0)
    model.load_state_dict(state)
    bounds = [0] + list(cfg["cuts"]) + [len(model.units)]
    n_stages = len(bounds) - 1
    cls_name, per_rank, placement = SCHEDULES[cfg["schedule"]]
    if n_stages != per_rank * world:
        raise ValueError(f"{cfg['schedule']} needs {per_rank * world} stages, the cut gives {n_stages}")
    mine = stage_ids(rank, world, per_rank, placement)
    # The zero-bubble schedules split the backward (torch.autograd.grad for the input gradients, then
    # detach_() of every stage output), which breaks on values a stage only passes on: a received
    # tensor passed on as it is gets detached in place (it is the reusable receive buffer, so the next
    # micro-batch's backward fails with "element 0 of tensors does not require grad"), and a graph
    # input the first stage passes on does not require grad at all. With these schedules a stage
    # passes on a copy (clone) of a received tensor and a fresh leaf for a graph input.
    split_bwd = "ZeroBubble" in cls_name
    mods = [StageModule(model, bounds[s], bounds[s + 1], split_backward=split_bwd) for s in mine]
    stages = [pp.PipelineStage(m, s, n_stages, torch.device("cpu")) for m, s in zip(mods, mine)]
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=job["lr"], momentum=job["momentum"])
    loss_fn = nn.CrossEntropyLoss()  # mean over the micro-batch; scale_grads divides by their count
    cls = getattr(pp, cls_name)
    sched = cls(stages[0] if per_rank == 1 else stages, n_microbatches=cfg["micro_batches"], loss_fn=loss_fn,
                scale_grads=True)
    first, last = 0 in mine, (n_stages - 1) in mine
    names = [n for n, _, _ in model.input_names]
    B, N = job["batch"], len(data["label"])
    starts, ends, losses = [], [], []
    for k in range(cfg["steps"]):
        t0 = time.monotonic()
        idx = rows(k, B, N)
        opt.zero_grad(set_to_none=True)
        args = tuple(torch.from_numpy(data[n][idx]) for n in names) if first else ()
        kw = {}
        mb_losses = []
        if last:
            kw = {"target": torch.from_numpy(data["label"][idx]), "losses": mb_losses}
        sched.step(*args, return_outputs=False, **kw)
        opt.step()
        t1 = time.monotonic()
        starts.append(t0)
        ends.append(t1)
        if last:
            losses.append(float(torch.stack([l.detach() for l in mb_losses]).mean()))
    # step k: latest end minus earliest start over the ranks
    t = torch.tensor([[-s for s in starts], ends], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    step_times = (t[1] + t[0]).tolist()
    lt = torch.tensor(losses if last else [0.0] * cfg["steps"], dtype=torch.float64)
    dist.all_reduce(lt, op=dist.ReduceOp.SUM)
    return {"losses": lt.tolist(), "step_times_s": step_times}


def torch_worker(rank, world, port, job_path, result_path):
    import datetime as _dt
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    with open(job_path) as f:
        job = json.load(f)
    model_args = argparse.Namespace(**job["model_args"])
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=_dt.timedelta(seconds=job["timeout_s"]))
    state = torch.load(job["state"], weights_only=True)
    data = {k: np.load(os.path.join(job["data"], k + ".npy")) for k in job["arrays"]}
    results = []
    for cfg in job["configs"]:
        try:
            r = run_torch_config(rank, world, job, cfg, model_args, state, data)
            r.update(ok=True)
        except Exception as e:  # construction errors are the same on both ranks
            r = {"ok": False, "error": f"{type(e).__name__}: {e}".strip()[:600]}
            print(f"[torch rank {rank}] {cfg['schedule']} failed:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        r["config"] = cfg
        results.append(r)
        with open(f"{result_path}.{rank}", "w") as f:  # before the barrier: survives a hang of the peer
            json.dump(results, f)
        dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_torch(ctx, model_name, configs, timeout_s):
    """Runs configs (schedule, cuts, micro_batches, steps) one after another in one 2-process launch."""
    import torch.multiprocessing as mp

    job = dict(ctx["jobs"][model_name], configs=configs, timeout_s=max(30, int(timeout_s)))
    tag = "%s_%d" % (model_name, int(time.monotonic() * 1000))
    job_path = os.path.join(ctx["work"], f"job_{tag}.json")
    result_path = os.path.join(ctx["work"], f"result_{tag}.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    err = None
    pc = mp.start_processes(torch_worker, args=(2, free_port(), job_path, result_path), nprocs=2, join=False,
                            start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not pc.join(timeout=1):
            if time.monotonic() > deadline:
                err = f"timed out after {timeout_s:.0f} s"
                break
    except Exception as e:  # a worker died
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    if err:
        for p in pc.processes:
            if p.is_alive():
                p.kill()
        for p in pc.processes:
            p.join(5)
    per_rank = []
    for rank in range(2):
        path = f"{result_path}.{rank}"
        if os.path.exists(path):
            with open(path) as f:
                per_rank.append(json.load(f))
        else:
            per_rank.append([])
    results = []
    for i, cfg in enumerate(configs):
        mine = [rr[i] for rr in per_rank if i < len(rr)]
        bad = [r for r in mine if not r["ok"]]
        if bad:  # the rank that raised says why; its peer then hangs until the timeout
            results.append(bad[0])
        elif len(mine) == 2:
            results.append(mine[0])
        else:
            results.append({"ok": False, "error": err or "no result", "config": cfg})
    return results


# ------------------------------------------------------------------------------------------------
# graphpipe side
# ------------------------------------------------------------------------------------------------

def gp_run(ctx, argv, what, timeout_s=300):
    cmd = [ctx["graphpipe"]] + argv
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: timed out after {timeout_s} s: {' '.join(cmd)}")
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"{what}: exit {p.returncode}: {' '.join(cmd)}\n  " + "\n  ".join(tail))
    return p.stdout


def read_log(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r["loss"] for r in recs], [r["step_time_s"] for r in recs]


def gp_train(ctx, m, steps, tag, single=False, plan_path=None):
    log = os.path.join(m["dir"], f"steps_{tag}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    common = ["--steps", str(steps), "--data", m["data"], "--optimizer", "sgd", "--lr", str(m["lr"]),
              "--momentum", str(m["momentum"]), "--log", log]
    if single:
        argv = ["train", "--single", "--model", m["onnx"], "--batch", str(m["batch"]), "--device", ctx["device"]] + common
    else:
        argv = ["train", "--plan", plan_path or m["plan_path"]] + common + ctx["gp_extra"]
    gp_run(ctx, argv, f"graphpipe train ({m['name']}, {tag})", timeout_s=ctx["run_timeout_s"])
    losses, times = read_log(log)
    return {"ok": True, "losses": losses, "step_times_s": times}


def write_cut_plan(m, cuts, micro):
    """A graphpipe plan with torch's chain cut: stage i = units [cuts[i-1], cuts[i]) on device i, the
    same micro-batches, in-flight counts by graphpipe's 1F1B rule (n - i). The planner's plan gives
    the imported op names; an op belongs to the unit its name starts with (/units.K/), the appended
    loss to the last unit."""
    plan = json.loads(json.dumps(m["plan"]))
    n_units = len(m["unit_names"])
    bounds = [0] + list(cuts) + [n_units]
    n = len(bounds) - 1
    ops = [o for s in plan["stages"] for o in s["ops"]]
    stages = [[] for _ in range(n)]
    for o in ops:
        mt = re.match(r"^/units\.(\d+)/", o)
        if mt:
            u = int(mt.group(1))
        elif o == "loss":
            u = n_units - 1
        else:
            raise RuntimeError(f"{m['name']}: op {o!r} of the plan belongs to no unit")
        stages[max(i for i in range(n) if bounds[i] <= u)].append(o)
    # keep the planner's op order (topological) within each stage
    plan["stages"] = [{"id": i, "ops": stages[i], "devices": [i], "micro_batch_size": m["batch"] // micro,
                       "in_flight": n - i, "inputs_from": [i - 1] if i else [],
                       "outputs_to": [i + 1] if i < n - 1 else []} for i in range(n)]
    for k in ("predicted", "search", "search_time_s"):
        plan.pop(k, None)
    plan["planner"] = "graphpipe"
    path = os.path.join(m["dir"], "plan_cut.json")
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)
    return path


# ------------------------------------------------------------------------------------------------
# setup of one model: export, import check, data, plan, unit timing, cut candidates
# ------------------------------------------------------------------------------------------------

def export_onnx(model, path, batch_example=2):
    import warnings
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    xs, names, dyn = [], [], {}
    for name, shape, dtype in model.input_names:
        if dtype == "int64":
            xs.append(torch.zeros((batch_example,) + tuple(shape), dtype=torch.int64))
        else:
            xs.append(torch.zeros((batch_example,) + tuple(shape)))
        names.append(name)
        dyn[name] = {0: "batch"}
    dyn["logits"] = {0: "batch"}
    torch.onnx.export(model, tuple(xs), path, dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, export_params=True,
                      input_names=names, output_names=["logits"], dynamic_axes=dyn)


def time_units(model, data, micro_batch, reps=3):
    """Forward + backward seconds of each unit on one micro-batch, 1 thread (for the cut search)."""
    idx = np.arange(micro_batch) % len(data["label"])
    env = {n: torch.from_numpy(data[n][idx]) for n, _, _ in model.input_names}
    with torch.no_grad():
        for u in model.units:
            env[u.writes] = u(*[env[r] for r in u.reads])
    costs = []
    for u in model.units:
        best = float("inf")
        for _ in range(reps):
            ins = [env[r].detach().requires_grad_(env[r].is_floating_point()) for r in u.reads]
            t0 = time.perf_counter()
            out = u(*ins)
            out.sum().backward()
            best = min(best, time.perf_counter() - t0)
        costs.append(best)
    model.zero_grad(set_to_none=True)
    return costs


def cut_candidates(costs, parts, keep):
    """Contiguous cuts of the units into `parts` stages, the most balanced (lowest max stage cost) first."""
    n = len(costs)
    cands = []
    for cuts in itertools.combinations(range(1, n), parts - 1):
        b = [0] + list(cuts) + [n]
        cands.append((max(sum(costs[b[i]:b[i + 1]]) for i in range(parts)), list(cuts)))
    cands.sort()
    return [c for _, c in cands[:keep]]


def reference_losses(model_name, a, state, data, batch, steps, lr, momentum):
    """Plain PyTorch, one process, one thread: the ground truth for the parity check. With --device
    cuda the model is on the GPU and each step's rows are copied there from page-locked memory without
    blocking (as a DataLoader with pin_memory=True); a step's time ends when the GPU has finished it."""
    dev = torch.device(a.device)
    model = make_model(model_name, a, 0)
    model.load_state_dict(state)
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    names = [n for n, _, _ in model.input_names]
    N = len(data["label"])
    cuda = dev.type == "cuda"

    def to_dev(x):
        t = torch.from_numpy(x)
        return t.pin_memory().to(dev, non_blocking=True) if cuda else t

    losses, times = [], []
    for k in range(steps):
        t0 = time.monotonic()
        idx = rows(k, batch, N)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(*[to_dev(data[n][idx]) for n in names]), to_dev(data["label"][idx]))
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize(dev)
        times.append(time.monotonic() - t0)
        losses.append(loss.item())
    return losses, times


def setup_model(ctx, name, a):
    d = os.path.join(ctx["work"], name)
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    model = make_model(name, a, a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    onnx_path = os.path.join(d, f"{name}.onnx")
    export_onnx(model, onnx_path)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state_path = os.path.join(d, "state.pt")
    torch.save(state, state_path)

    info = json.loads(gp_run(ctx, ["model", "info", "--model", onnx_path, "--json"], f"graphpipe model info ({name})"))
    if info["params"] != n_params:
        raise RuntimeError(f"{name}: graphpipe model info counts {info['params']} parameters, PyTorch {n_params}")
    progress(f"{name}: exported {onnx_path} ({n_params:,} parameters; graphpipe imports {info['num_ops']} ops, "
             f"the same parameter count)")

    batch = a.batch[name]
    data = make_data(model, a.samples_per_batch * batch, a.classes, a.vocab, a.seed + 1)
    data_dir = os.path.join(d, "data")
    for k, v in data.items():
        np.save(os.path.join(data_dir, k + ".npy"), v)

    arrays = [n for n, _, _ in model.input_names] + ["label"]
    ctx["jobs"][name] = {"model": name, "model_args": {k: v for k, v in vars(a).items() if k != "batch"},
                         "state": state_path, "data": data_dir, "arrays": arrays, "batch": batch, "lr": a.lr[name],
                         "momentum": a.momentum}
    m = {"name": name, "dir": d, "onnx": onnx_path, "data": data_dir, "batch": batch, "lr": a.lr[name],
         "momentum": a.momentum, "params": n_params, "description": describe(name, a), "state": state,
         "data_arrays": data}
    if not a.pipelines:
        return m

    plan_path = os.path.join(d, "plan.json")
    plan_out = gp_run(ctx, ["plan", "--model", onnx_path, "--cluster", a.cluster, "--devices", "2", "--batch",
                            str(batch), "--optimizer", "sgd", "--out", plan_path], f"graphpipe plan ({name})",
                      timeout_s=600)
    with open(plan_path) as f:
        plan = json.load(f)
    stages = plan["stages"]
    plan_desc = []
    for s in stages:
        plan_desc.append({"stage": s["id"], "ops": len(s["ops"]), "devices": s["devices"],
                          "micro_batch_size": s["micro_batch_size"], "in_flight": s["in_flight"],
                          "inputs_from": s["inputs_from"], "first_op": s["ops"][0], "last_op": s["ops"][-1]})
    devices_used = sorted(set(dv for s in stages for dv in s["devices"]))
    plan_micro = batch // min(s["micro_batch_size"] for s in stages)
    progress(f"{name}: graphpipe plan: {len(stages)} stage(s) on devices {devices_used}, micro-batches "
             + ", ".join(str(s["micro_batch_size"]) for s in stages) + f" of mini-batch {batch}; "
             + plan_out.strip().splitlines()[-3 if len(plan_out.strip().splitlines()) >= 3 else -1].strip())

    if a.micro_batches:
        micro = a.micro_batches
        micro_why = "--micro-batches"
    elif plan_micro >= 2:
        micro = plan_micro
        micro_why = "the graphpipe plan's"
    else:
        micro = 4
        micro_why = "4 (the graphpipe plan has 1 micro-batch per step, no pipelining)"
    if batch % micro:
        raise RuntimeError(f"{name}: mini-batch {batch} is not divisible by {micro} micro-batches")

    torch.set_num_threads(1)
    costs = time_units(model, data, batch // micro)
    cuts2 = cut_candidates(costs, 2, a.cut_candidates)
    cuts4 = cut_candidates(costs, 4, 1)[0] if len(costs) >= 4 else []
    progress(f"{name}: unit fwd+bwd ms per micro-batch of {batch // micro}: "
             + " ".join("%.1f" % (c * 1e3) for c in costs) + f"; 2-stage cut candidates {cuts2}, 4-stage {cuts4}")

    m.update({"plan_path": plan_path, "plan": plan, "plan_stages": plan_desc,
              "plan_devices_used": len(devices_used), "plan_micro_batches": plan_micro, "micro_batches": micro,
              "micro_batches_why": micro_why, "unit_costs_s": costs, "unit_names": [u.writes for u in model.units],
              "cuts2": cuts2, "cuts4": cuts4})
    return m


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--graphpipe", default="build/graphpipe", help="the graphpipe binary")
    p.add_argument("--out", default="build/vs-torch.json", help="JSON results (graphpipe.vs-torch/1)")
    p.add_argument("--work", default=None, help="keep models, data, plans and logs here (default: a temporary dir)")
    p.add_argument("--models", default="chain,uno,towers", help="comma-separated: " + ",".join(MODELS))
    p.add_argument("--schedules", default="gpipe,1f1b,izb",
                   help="torch schedules, comma-separated: " + ",".join(SCHEDULES) + " (izb, zbv, i1f1b: 2 stages per rank)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed run")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (every engine once per round)")
    p.add_argument("--skip", type=int, default=2, help="leading steps of each run left out of the timing")
    p.add_argument("--parity-steps", type=int, default=10, help="steps whose losses must agree")
    p.add_argument("--tolerance", type=float, default=1e-4, help="relative loss tolerance of the parity check")
    p.add_argument("--search-steps", type=int, default=6, help="steps per candidate cut in the torch cut search")
    p.add_argument("--cut-candidates", type=int, default=3, help="most balanced 2-stage cuts the torch search tries")
    p.add_argument("--micro-batches", type=int, default=0,
                   help="torch micro-batches per step (0: the graphpipe plan's count, or 4 if it has one)")
    p.add_argument("--cluster", default="cpu", help="graphpipe plan --cluster")
    p.add_argument("--no-single", dest="single", action="store_false",
                   help="leave the 1-process engines (graphpipe --single, plain PyTorch) out of the timing rounds")
    p.add_argument("--no-same-cut", dest="same_cut", action="store_false",
                   help="leave out the 'graphpipe cut' engine (graphpipe train on a hand plan with torch's "
                        "2-stage cut and micro-batches)")
    p.add_argument("--no-pipelines", dest="pipelines", action="store_false",
                   help="the 1-process engines only (plain PyTorch and graphpipe train --single): no plan, no cut "
                        "search, no pipelined engine")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the 1-process engines only (--no-pipelines), on the GPU: plain PyTorch and graphpipe "
                        "train --single --device cuda, same weights, data and steps (the pipelines, torch's over "
                        "NCCL and graphpipe's plans of several GPUs, need one GPU per rank)")
    p.add_argument("--gp-args", default="", help="extra arguments for graphpipe train --plan (space-separated)")
    p.add_argument("--run-timeout", type=float, default=240, help="seconds one engine run may take")
    p.add_argument("--seed", type=int, default=38, help="seed of the weights and the data")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--lr", default="", help="SGD learning rate: one value, or per model (chain=0.05,uno=0.01); "
                   "defaults " + ",".join(f"{k}={v}" for k, v in LR_DEFAULT.items()))
    p.add_argument("--batch", default="", help="mini-batch: one value, or per model; defaults "
                   + ",".join(f"{k}={v}" for k, v in BATCH_DEFAULT.items()))
    p.add_argument("--samples-per-batch", type=int, default=4, help="data set size in mini-batches (then it wraps)")
    p.add_argument("--classes", type=int, default=10, help="classes of every model")
    g = p.add_argument_group("chain model")
    g.add_argument("--vocab", type=int, default=512, help="token vocabulary")
    g.add_argument("--seq", type=int, default=32, help="sequence length")
    g.add_argument("--d-model", type=int, default=128, help="width")
    g.add_argument("--ffn", type=int, default=512, help="hidden width of each block")
    g.add_argument("--layers", type=int, default=8, help="blocks")
    g = p.add_argument_group("uno model")
    g.add_argument("--uno-inputs", default="512,256,384,128", help="input width of each tower")
    g.add_argument("--uno-hidden", type=int, default=512, help="tower and head width")
    g.add_argument("--uno-depth", type=int, default=3, help="layers of each tower")
    g = p.add_argument_group("towers model")
    g.add_argument("--tower-input", type=int, default=256, help="input width")
    g.add_argument("--tower-width", type=int, default=384, help="tower and head width")
    g.add_argument("--tower-depths", default="2,3,4", help="layers of each tower")
    a = p.parse_args(argv)
    a.uno_inputs = [int(x) for x in a.uno_inputs.split(",")]
    a.tower_depths = [int(x) for x in a.tower_depths.split(",")]
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r} (have {', '.join(MODELS)})")
    a.models = models
    a.schedules = [s.strip() for s in a.schedules.split(",") if s.strip()]
    for s in a.schedules:
        if s not in SCHEDULES:
            p.error(f"unknown schedule {s!r} (have {', '.join(SCHEDULES)})")

    def per_model(text, conv, default):
        d = dict(default)
        for item in text.split(","):
            if "=" in item:
                k, v = item.split("=", 1)
                if k.strip() not in MODELS:
                    p.error(f"unknown model {k.strip()!r} in {text!r}")
                d[k.strip()] = conv(v)
            elif item.strip():
                d = {m: conv(item) for m in MODELS}
        return d

    a.lr = per_model(a.lr, float, LR_DEFAULT)
    a.batch = per_model(a.batch, int, BATCH_DEFAULT)
    if a.steps < a.parity_steps:
        p.error(f"--steps {a.steps} is less than --parity-steps {a.parity_steps}")
    if a.steps <= a.skip:
        p.error("--steps must exceed --skip")
    a.pipelines = a.pipelines and a.device == "cpu"
    if not a.pipelines and not a.single:
        p.error("--no-single leaves nothing to run with --no-pipelines or --device cuda (only the 1-process "
                "engines run then)")
    return a


def machine():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cpu": cpu, "system": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def rel_diff(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if _IMPORT_ERROR is not None:
        print(f"vs_torch: PyTorch/NumPy missing: {_IMPORT_ERROR} (pip install torch numpy onnx)", file=sys.stderr)
        return 2
    gp = shutil.which(a.graphpipe) if os.sep not in a.graphpipe else a.graphpipe
    if not gp or not os.path.isfile(gp) or not os.access(gp, os.X_OK):
        print(f"vs_torch: graphpipe binary not found or not executable: {a.graphpipe} "
              "(build it: make, or cmake --build build)", file=sys.stderr)
        return 2
    gp = os.path.abspath(gp)
    try:
        gp_version = subprocess.run([gp, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"vs_torch: cannot run {gp} --version: {e}", file=sys.stderr)
        return 2
    try:
        import torch.distributed as dist
        from torch.distributed import pipelining  # noqa: F401
        import onnx  # noqa: F401
        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed with Gloo is not available in this torch build")
    except ImportError as e:
        print(f"vs_torch: {e} (torch.distributed.pipelining over Gloo and the onnx package are needed; "
              f"torch {torch.__version__})", file=sys.stderr)
        return 2

    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"vs_torch: --device cuda, but torch {torch.__version__} sees no GPU here", file=sys.stderr)
        return 2

    work = a.work or tempfile.mkdtemp(prefix="gp_vs_torch.")
    os.makedirs(work, exist_ok=True)
    ctx = {"graphpipe": gp, "work": work, "jobs": {}, "gp_extra": a.gp_args.split() if a.gp_args else [],
           "run_timeout_s": a.run_timeout, "device": a.device}
    load_start = os.getloadavg()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    mach = machine()
    if a.device == "cuda":
        mach["gpu"] = torch.cuda.get_device_name(0)
    progress(f"{date}, {mach['nproc']} CPUs ({mach['cpu']}), load average {load_start[0]:.2f} "
             f"{load_start[1]:.2f} {load_start[2]:.2f}; torch {torch.__version__}; "
             f"{gp_version.splitlines()[0] if gp_version else gp}; work dir {work}"
             + (f"; {mach['gpu']}" if a.device == "cuda" else ""))
    torch.set_num_threads(1)

    failures = []
    models = []
    for name in a.models:
        models.append(setup_model(ctx, name, a))

    # --- references and the torch cut search -----------------------------------------------------
    for m in models:
        ref_losses, ref_times = reference_losses(m["name"], a, m["state"], m["data_arrays"], m["batch"],
                                                 a.parity_steps, m["lr"], m["momentum"])
        m["reference"] = {"losses": ref_losses, "step_times_s": ref_times}
        progress(f"{m['name']}: PyTorch 1 process: losses {ref_losses[0]:.5f} .. {ref_losses[-1]:.5f}, "
                 f"median step {median(ref_times[a.skip:]) * 1e3:.1f} ms")
        single = gp_train(ctx, m, a.parity_steps, "single", single=True)
        m["gp_single"] = single
        progress(f"{m['name']}: graphpipe --single: losses {single['losses'][0]:.5f} .. {single['losses'][-1]:.5f}, "
                 f"median step {median(single['step_times_s'][a.skip:]) * 1e3:.1f} ms")
        if not a.pipelines:
            continue

        configs = [{"schedule": "1f1b", "cuts": c, "micro_batches": m["micro_batches"], "steps": a.search_steps}
                   for c in m["cuts2"]]
        res = launch_torch(ctx, m["name"], configs, timeout_s=a.run_timeout)
        best, best_t = None, float("inf")
        search = []
        for r in res:
            if r["ok"]:
                t = median(r["step_times_s"][min(2, len(r["step_times_s"]) - 1):])
                search.append({"cuts": r["config"]["cuts"], "median_step_s": t})
                if t < best_t:
                    best, best_t = r["config"]["cuts"], t
            else:
                search.append({"cuts": r["config"]["cuts"], "error": r["error"]})
        m["torch_cut_search"] = search
        if best is None:
            raise RuntimeError(f"{m['name']}: no 2-stage torch cut ran: {res[0].get('error')}")
        m["torch_cut2"] = best
        m["cut_plan_path"] = write_cut_plan(m, best, m["micro_batches"])
        progress(f"{m['name']}: torch 2-stage cut search (1F1B, {a.search_steps} steps): " + ", ".join(
            (f"after unit {s['cuts'][0]} ({m['unit_names'][s['cuts'][0] - 1]}): "
             + (f"{s['median_step_s'] * 1e3:.1f} ms" if "median_step_s" in s else "failed")) for s in search)
            + f" -> keep {best}")

    # --- engines ------------------------------------------------------------------------------------
    def torch_configs(m):
        cfgs = []
        if not a.pipelines:
            return cfgs
        for s in a.schedules:
            per_rank = SCHEDULES[s][1]
            cuts = m["torch_cut2"] if per_rank == 1 else m["cuts4"]
            if per_rank == 2 and not cuts:
                continue
            cfgs.append({"schedule": s, "cuts": cuts, "micro_batches": m["micro_batches"], "steps": a.steps})
        return cfgs

    for m in models:
        m["runs"] = {}
        m["engine_errors"] = {}
    for rnd in range(a.rounds):
        for m in models:
            order = ["graphpipe", "torch"] if rnd % 2 == 0 else ["torch", "graphpipe"]
            for side in order:
                if side == "graphpipe":
                    gp_engines = []
                    if a.pipelines:
                        gp_engines.append(("graphpipe", None, "plan"))
                        if a.same_cut:
                            gp_engines.append(("graphpipe cut", m["cut_plan_path"], "cut"))
                    if a.single:
                        gp_engines.append(("graphpipe --single", None, "single"))
                    for eng, plan_path, tag in gp_engines:
                        if eng in m["engine_errors"]:
                            continue
                        try:
                            r = gp_train(ctx, m, a.steps, f"{tag}_r{rnd}", plan_path=plan_path,
                                         single=tag == "single")
                            m["runs"].setdefault(eng, []).append(r)
                            progress(f"round {rnd + 1}/{a.rounds} {m['name']}: {eng}: median step "
                                     f"{median(r['step_times_s'][a.skip:]) * 1e3:.1f} ms, loss {r['losses'][-1]:.5f}")
                        except RuntimeError as e:
                            m["engine_errors"][eng] = str(e)
                            progress(f"round {rnd + 1} {m['name']}: {eng} failed: {e}")
                else:
                    if a.single:
                        losses, times = reference_losses(m["name"], a, m["state"], m["data_arrays"], m["batch"],
                                                         a.steps, m["lr"], m["momentum"])
                        m["runs"].setdefault("torch 1 process", []).append({"losses": losses, "step_times_s": times})
                        progress(f"round {rnd + 1}/{a.rounds} {m['name']}: torch 1 process: median step "
                                 f"{median(times[a.skip:]) * 1e3:.1f} ms, loss {losses[-1]:.5f}")
                    cfgs = [c for c in torch_configs(m) if "torch " + c["schedule"] not in m["engine_errors"]]
                    if not cfgs:
                        continue
                    for r in launch_torch(ctx, m["name"], cfgs, timeout_s=a.run_timeout):
                        eng = "torch " + r["config"]["schedule"]
                        if r["ok"]:
                            m["runs"].setdefault(eng, []).append(r)
                            progress(f"round {rnd + 1}/{a.rounds} {m['name']}: {eng}: median step "
                                     f"{median(r['step_times_s'][a.skip:]) * 1e3:.1f} ms, loss {r['losses'][-1]:.5f}")
                        else:
                            m["engine_errors"][eng] = r["error"]
                            progress(f"round {rnd + 1} {m['name']}: {eng} failed: {r['error']}")

    # --- results --------------------------------------------------------------------------------------
    load_end = os.getloadavg()
    one_process = "1 thread" if a.device == "cpu" else a.device
    out_models = []
    parity_ok = True
    for m in models:
        ref = m["reference"]["losses"]
        engines = []
        parity = {}
        d = max(rel_diff(x, y) for x, y in zip(m["gp_single"]["losses"][:a.parity_steps], ref))
        parity["graphpipe --single"] = d
        for eng, runs in m["runs"].items():
            times = [t for r in runs for t in r["step_times_s"][a.skip:]]
            med = median(times)
            per_round = [median(r["step_times_s"][a.skip:]) for r in runs]
            dd = max(rel_diff(x, y) for r in runs for x, y in zip(r["losses"][:a.parity_steps], ref))
            parity[eng] = max(dd, parity.get(eng, 0.0))
            if eng == "graphpipe":
                detail = {"plan": "graphpipe plan (the planner's)", "plan_stages": len(m["plan_stages"]),
                          "plan_devices_used": m["plan_devices_used"], "micro_batches": m["plan_micro_batches"],
                          "schedule": "1f1b (graphpipe train's default)"}
            elif eng in ("graphpipe --single", "torch 1 process"):
                detail = {"plan": "1 process, whole model, " + one_process, "micro_batches": 1, "schedule": "none"}
            elif eng == "graphpipe cut":
                detail = {"plan": "hand plan: torch's 2-stage cut", "cuts_after_unit": m["torch_cut2"],
                          "stages": len(m["torch_cut2"]) + 1, "micro_batches": m["micro_batches"],
                          "schedule": "1f1b (graphpipe train's default)"}
            else:
                cfg = runs[0]["config"]
                detail = {"cuts_after_unit": cfg["cuts"], "stages": len(cfg["cuts"]) + 1,
                          "micro_batches": cfg["micro_batches"], "schedule": SCHEDULES[cfg["schedule"]][0]}
            engines.append({"engine": eng, "median_step_s": med, "samples_per_s": m["batch"] / med,
                            "per_round_median_step_s": per_round, "min_step_s": min(times),
                            "loss_first": runs[0]["losses"][0], "loss_last": runs[0]["losses"][-1],
                            "steps": a.steps, "runs": len(runs), "parity_max_rel_diff": dd, **detail})
        for eng, err in m["engine_errors"].items():
            if eng not in m["runs"]:
                engines.append({"engine": eng, "error": err})
        torch_best = min((e for e in engines if e["engine"].startswith("torch") and "median_step_s" in e
                          and e["engine"] != "torch 1 process"),
                         key=lambda e: e["median_step_s"], default=None)
        by = {e["engine"]: e for e in engines if "median_step_s" in e}
        gpe = by.get("graphpipe")
        ratio = gpe["median_step_s"] / torch_best["median_step_s"] if gpe and torch_best else None
        same_cut_ratio = (by["graphpipe cut"]["median_step_s"] / by["torch 1f1b"]["median_step_s"]
                          if "graphpipe cut" in by and "torch 1f1b" in by else None)
        single_ratio = (by["graphpipe --single"]["median_step_s"] / by["torch 1 process"]["median_step_s"]
                        if "graphpipe --single" in by and "torch 1 process" in by else None)
        bad = {k: v for k, v in parity.items() if v > a.tolerance}
        if bad:
            parity_ok = False
        for eng, err in m["engine_errors"].items():
            if eng not in m["runs"] or len(m["runs"][eng]) < a.rounds:
                failures.append(f"{m['name']}: {eng}: {err}")
        out_models.append({
            "model": m["name"], "description": m["description"], "params": m["params"], "batch": m["batch"],
            "lr": m["lr"], "momentum": m["momentum"], "onnx": m["onnx"] if a.work else os.path.basename(m["onnx"]),
            "graphpipe_plan": ({"stages": m["plan_stages"], "predicted": m["plan"].get("predicted")}
                               if a.pipelines else None),
            "torch_micro_batches": m.get("micro_batches"), "torch_micro_batches_from": m.get("micro_batches_why"),
            "unit_names": m.get("unit_names"), "unit_fwd_bwd_s": m.get("unit_costs_s"),
            "torch_cut_search": m.get("torch_cut_search"), "torch_cut4": m.get("cuts4"),
            "reference": {"engine": f"PyTorch, 1 process, {one_process} (not pipelined)",
                          "losses": ref, "median_step_s": median(m["reference"]["step_times_s"][a.skip:])},
            "graphpipe_single": {"losses": m["gp_single"]["losses"],
                                 "median_step_s": median(m["gp_single"]["step_times_s"][a.skip:])},
            "parity": {"steps": a.parity_steps, "tolerance": a.tolerance, "max_rel_diff": parity,
                       "ok": not bad},
            "engines": engines,
            "graphpipe_over_torch_best": ratio,
            "graphpipe_cut_over_torch_1f1b": same_cut_ratio,
            "graphpipe_single_over_torch_1_process": single_ratio,
            "torch_best": torch_best["engine"] if torch_best else None,
        })

    doc = {"format": FORMAT, "date": date, "machine": mach,
           "load_average": {"start": list(load_start), "end": list(load_end)},
           "device": a.device, "torch": torch.__version__, "graphpipe": gp_version, "command": " ".join([sys.executable] + sys.argv),
           "settings": {k: v for k, v in vars(a).items()}, "duration_s": time.monotonic() - T0,
           "models": out_models, "parity_ok": parity_ok, "failures": failures}
    out_dir = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")

    # --- table ----------------------------------------------------------------------------------------
    print(f"graphpipe vs {'torch.distributed.pipelining' if a.pipelines else 'PyTorch'}, {date}, {mach['nproc']} "
          f"CPUs ({mach['cpu']}), load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; "
          f"torch {torch.__version__}" + (f"; {mach['gpu']}" if "gpu" in mach else ""))
    print(f"{a.rounds} rounds x {a.steps} steps per engine, median step time without the first {a.skip} steps "
          "of each run; " + ("2 processes, 1 thread each, Gloo, SGD momentum 0.9" if a.pipelines else
                             f"1 process each ({a.device}), SGD momentum 0.9"))
    hdr = f"{'model':<8} {'engine':<18} {'stages':<24} {'mb':>3} {'step ms':>8} {'samples/s':>10} " \
          f"{'rounds ms':>11} {'loss@' + str(a.steps):>9} {'parity':>8}"
    print(hdr)
    print("-" * len(hdr))
    for om in out_models:
        for e in om["engines"]:
            if "error" in e:
                print(f"{om['model']:<8} {e['engine']:<18} failed: {e['error'][:160]}")
                continue
            if e["engine"] == "graphpipe":
                st = f"planner: {e['plan_stages']} st. on {e['plan_devices_used']} dev"
            elif e["engine"] in ("graphpipe --single", "torch 1 process"):
                st = "1 process (reference)"
            else:
                st = "chain, cut " + ",".join(str(c) for c in e["cuts_after_unit"])
            print(f"{om['model']:<8} {e['engine']:<18} {st:<24} {e['micro_batches']:>3} "
                  f"{e['median_step_s'] * 1e3:>8.1f} {e['samples_per_s']:>10.0f} "
                  f"{'%.0f-%.0f' % (min(e['per_round_median_step_s']) * 1e3, max(e['per_round_median_step_s']) * 1e3):>11} "
                  f"{e['loss_last']:>9.5f} "
                  f"{e['parity_max_rel_diff']:>8.1e}")
        r, rc, rs = (om["graphpipe_over_torch_best"], om["graphpipe_cut_over_torch_1f1b"],
                     om["graphpipe_single_over_torch_1_process"])
        if a.pipelines:
            print(f"{om['model']:<8} step time graphpipe / {om['torch_best']}: " + (f"{r:.2f}" if r else "n/a")
                  + ("" if rc is None else f"; graphpipe cut / torch 1f1b (same stages): {rc:.2f}"))
        if rs is not None:
            print(f"{om['model']:<8} step time graphpipe --single / torch 1 process: {rs:.2f}")
    print(f"parity: largest relative difference of a step's loss from 1-process PyTorch over {a.parity_steps} "
          f"steps (tolerance {a.tolerance:g})")
    for om in out_models:
        print(f"{om['model']:<8} " + ", ".join(f"{k} {v:.1e}" for k, v in om["parity"]["max_rel_diff"].items())
              + ("" if om["parity"]["ok"] else "   FAILED"))
    print(f"wrote {a.out} ({time.monotonic() - T0:.0f} s)")
    for fl in failures:
        print(f"FAILED: {fl}", file=sys.stderr)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    if not parity_ok:
        for om in out_models:
            for eng, v in om["parity"]["max_rel_diff"].items():
                if v > a.tolerance:
                    print(f"PARITY FAILED: {om['model']}: {eng}: max relative loss difference {v:.3e} > "
                          f"{a.tolerance:g} over {a.parity_steps} steps", file=sys.stderr)
        return 1
    if failures:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
