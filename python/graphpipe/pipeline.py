"""`plan`, `simulate`, `train` and `model_info`: the CLI's planning, simulation and training as Python
values. Each call runs one `graphpipe` command and reads its JSON (formats in ../shared/CONTRACT.md:
graphpipe.plan/1, graphpipe.sim/1, graphpipe.train/1, graphpipe.model_info/1); nothing is computed here.

A module given to `plan` is exported (`graphpipe.export`) into a private scratch directory that lives
as long as the `Plan`; `Plan.save` copies the ONNX file next to the saved plan so the file stays usable.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _cli
from .export import ExportInfo, Loss, export

PathLike = Union[str, "os.PathLike[str]"]


class _Scratch:
    """A temporary directory removed when its owner is garbage-collected (or at exit)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="graphpipe-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.dir), True)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One pipeline stage of a plan: its ops, the devices it is replicated on (data parallel within
    the stage), its micro-batch size, how many micro-batches it keeps in flight, and its neighbours."""

    id: int
    ops: Tuple[str, ...]
    devices: Tuple[int, ...]
    micro_batch_size: int
    in_flight: int
    inputs_from: Tuple[int, ...]
    outputs_to: Tuple[int, ...]
    memory_bytes: Optional[float] = None


class Plan:
    """A pipeline plan (graphpipe.plan/1), as `graphpipe plan` wrote it.

    Attributes:
        data: the plan JSON itself (every field the CLI wrote).
        stages: the stages, in the file's order.
        path: the file the plan was loaded from or last saved to (None for a fresh, unsaved plan).
        export_info: for a plan made from a module, what `graphpipe.export` wrote (input and label
            names for `train(data=...)`); None otherwise.
    """

    def __init__(self, data: Dict[str, Any], *, path: Optional[PathLike] = None, summary: str = "",
                 explanation: Optional[str] = None, dot: Optional[str] = None,
                 export_info: Optional[ExportInfo] = None, scratch: Optional[_Scratch] = None):
        if data.get("format") != "graphpipe.plan/1":
            raise ValueError(f"not a graphpipe.plan/1 document (format {data.get('format')!r})")
        self.data = data
        self.path: Optional[Path] = Path(path) if path is not None else None
        self.export_info = export_info
        self._summary = summary
        self._explanation = explanation
        self._dot = dot
        self._scratch = scratch
        self.stages: Tuple[Stage, ...] = tuple(
            Stage(id=int(s["id"]), ops=tuple(s["ops"]), devices=tuple(int(d) for d in s["devices"]),
                  micro_batch_size=int(s["micro_batch_size"]), in_flight=int(s.get("in_flight", 1)),
                  inputs_from=tuple(s.get("inputs_from", [])), outputs_to=tuple(s.get("outputs_to", [])),
                  memory_bytes=s.get("memory_bytes"))
            for s in data["stages"])

    # --- what the plan says -------------------------------------------------------------------
    @property
    def planner(self) -> str:
        return str(self.data["planner"])

    @property
    def model_name(self) -> str:
        return str(self.data["model"]["name"])

    @property
    def model_spec(self) -> str:
        """The model the CLI re-reads to simulate and train (a builtin spec or a file path)."""
        return str(self.data["model"].get("spec", ""))

    @property
    def num_devices(self) -> int:
        return int(self.data["cluster"]["num_devices"])

    @property
    def mini_batch_size(self) -> int:
        return int(self.data["mini_batch_size"])

    @property
    def micro_batch_sizes(self) -> List[int]:
        """Per stage, its micro-batch size."""
        return [s.micro_batch_size for s in self.stages]

    @property
    def predicted_iteration_time_s(self) -> float:
        return float(self.data["predicted"]["iteration_time_s"])

    @property
    def predicted_throughput(self) -> float:
        """Samples per second, as the planner's cost model predicts."""
        return float(self.data["predicted"]["throughput_samples_per_s"])

    @property
    def predicted_peak_memory_bytes(self) -> List[float]:
        """Per device, the predicted peak memory."""
        return [float(b) for b in self.data["predicted"]["peak_memory_bytes"]]

    @property
    def search_time_s(self) -> float:
        return float(self.data.get("search_time_s", 0.0))

    # --- the CLI's views of it -----------------------------------------------------------------
    def explain(self) -> str:
        """The CLI's `plan --explain` output: the summary table, then why each stage got its devices
        and micro-batch size and how the search chose. Available for plans made by `graphpipe.plan`
        (the explanation is written while planning, not stored in the plan file)."""
        if self._explanation is None:
            raise _cli.GraphPipeError(
                f"{self.path}: a loaded plan has no explanation (graphpipe writes it while planning); "
                "make the plan with graphpipe.plan(...) to get one", returncode=2)
        return self._explanation

    def to_dot(self, path: Optional[PathLike] = None) -> str:
        """The stage graph as Graphviz text (the CLI's `plan --dot`); also written to ``path`` if given.
        Available for plans made by `graphpipe.plan`, as `explain`."""
        if self._dot is None:
            raise _cli.GraphPipeError(
                f"{self.path}: a loaded plan has no stage graph (graphpipe writes it while planning); "
                "make the plan with graphpipe.plan(...) to get one", returncode=2)
        if path is not None:
            Path(path).write_text(self._dot)
        return self._dot

    def save(self, path: PathLike) -> Path:
        """Writes the plan (graphpipe.plan/1) to ``path``, usable by the CLI
        (`graphpipe simulate --plan PATH`, `graphpipe train --plan PATH`, torchrun). A model exported
        from a module is copied next to it (``<stem>.onnx``) and the plan's ``model.spec`` names that
        copy, since the scratch export goes away with this object."""
        path = Path(path).resolve()
        data = json.loads(json.dumps(self.data))
        spec = self.model_spec
        if self._scratch is not None and spec and Path(spec).parent == self._scratch.dir:
            model_copy = path.with_suffix(".onnx")
            shutil.copyfile(spec, model_copy)
            data["model"]["spec"] = str(model_copy)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        self.data = data
        self.path = path
        return path

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        """Reads a graphpipe.plan/1 file (from `graphpipe plan --out` or `Plan.save`)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise _cli.GraphPipeError(f"{path}: cannot read the plan: {e}", returncode=2) from None
        return cls(data, path=path)

    def _file(self) -> Path:
        """A plan file the CLI can read: the saved one, else one in the scratch directory."""
        if self.path is not None and self.path.is_file():
            return self.path
        if self._scratch is None:
            self._scratch = _Scratch()
        f = self._scratch.dir / "plan.json"
        f.write_text(json.dumps(self.data))
        return f

    def __str__(self) -> str:
        if self._summary:
            return self._summary
        lines = [f"graphpipe plan for {self.model_name} on {self.num_devices} devices, mini-batch "
                 f"{self.mini_batch_size} ({self.planner})"]
        for s in self.stages:
            lines.append(f"stage {s.id}: {len(s.ops)} ops, devices {list(s.devices)}, micro-batch "
                         f"{s.micro_batch_size}, in-flight {s.in_flight}")
        lines.append(f"predicted: iteration {self.predicted_iteration_time_s:.6g} s, "
                     f"throughput {self.predicted_throughput:.1f} samples/s")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Plan(model={self.model_name!r}, planner={self.planner!r}, stages={len(self.stages)}, "
                f"devices={self.num_devices}, mini_batch={self.mini_batch_size}, "
                f"predicted_iteration_time_s={self.predicted_iteration_time_s:.6g})")


def _model_spec(module_or_path, example_inputs, scratch: _Scratch, loss: Loss) -> Tuple[str, Optional[ExportInfo]]:
    if isinstance(module_or_path, (str, os.PathLike)):
        if example_inputs is not None:
            raise ValueError("example_inputs are for a module; a model file or builtin spec carries its shapes")
        return os.fspath(module_or_path), None
    if example_inputs is None:
        raise ValueError("plan(module, example_inputs): a module needs example inputs to be exported")
    # The file's stem becomes the model's name in the CLI's output: the module's class name.
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in type(module_or_path).__name__) or "model"
    info = export(module_or_path, example_inputs, scratch.dir / f"{stem}.onnx", loss=loss)
    return info.path, info


def plan(module_or_path, example_inputs=None, *, cluster: str = "cpu", devices: int = 4, batch: int = 32,
         planner: str = "graphpipe", micro_batch: Optional[int] = None, optimizer: str = "adam",
         memory_limit_gb: Optional[float] = None, profile: Optional[PathLike] = None, loss: Loss = None,
         extra_args: Sequence[str] = ()) -> Plan:
    """Plans a model onto devices as a graph of pipeline stages (`graphpipe plan`).

    Args:
        module_or_path: a ``torch.nn.Module`` (exported with `graphpipe.export` first), a model file
            (``.onnx``, ``.json`` graphpipe.model/1) or a builtin spec such as ``"mmt:layers=2"``.
        example_inputs: for a module: one tensor or a tuple (one per forward argument), batch in dim 0.
        cluster: a preset (``cpu``, ``h200``, ``dgx-h100``, ``dgx-a100``, ``summit``) or a
            graphpipe.cluster/1 file.
        devices: how many devices of the cluster to use.
        batch: the mini-batch size (samples per iteration).
        planner: ``graphpipe``, or the baselines ``pipedream`` / ``piper``.
        micro_batch: fix every stage's micro-batch size (default: searched).
        optimizer: ``adam`` or ``sgd`` (its state counts toward memory).
        memory_limit_gb: per-device memory limit (default: the device's).
        profile: measured op costs (graphpipe.profile/1) to plan with.
        loss: for a module, the loss you expect graphpipe to append (see `graphpipe.export`).
        extra_args: further `graphpipe plan` options, passed as they are.

    Raises:
        GraphPipeError: the CLI refused (e.g. an unknown model or a model that cannot fit the devices).
    """
    scratch = _Scratch()
    spec, info = _model_spec(module_or_path, example_inputs, scratch, loss)
    out, dot = scratch.dir / "plan.json", scratch.dir / "plan.dot"
    args = ["plan", "--model", spec, "--cluster", cluster, "--devices", devices, "--batch", batch,
            "--planner", planner, "--optimizer", optimizer, "--out", out, "--explain", "--dot", dot]
    if micro_batch is not None:
        args += ["--micro-batch", micro_batch]
    if memory_limit_gb is not None:
        args += ["--memory-limit", memory_limit_gb]
    if profile is not None:
        args += ["--profile", os.fspath(profile)]
    proc = _cli.run([*args, *extra_args])
    lines = [ln for ln in proc.stdout.splitlines() if not ln.startswith("wrote ")]
    cut = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("search time:")), len(lines))
    data = json.loads(out.read_text())
    return Plan(data, summary="\n".join(lines[:cut]), explanation="\n".join(lines) + "\n",
                dot=dot.read_text(), export_info=info, scratch=scratch)


@dataclasses.dataclass(frozen=True)
class TimelineEvent:
    """One slice of the simulated timeline: a forward, backward, send, recv, all-reduce or optimizer
    step of one stage on one device."""

    device: int
    lane: str  # "compute" or "send"
    kind: str  # forward | backward | send | recv | allreduce | optimizer ...
    stage: Optional[int]
    micro_batch: Optional[int]
    name: str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def _timeline(trace: Dict[str, Any]) -> List[TimelineEvent]:
    """Chrome trace events (timestamps in microseconds) to `TimelineEvent`s, sorted by start."""
    lanes: Dict[Tuple[int, int], str] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(e["pid"], e["tid"])] = e["args"]["name"]
    events = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        events.append(TimelineEvent(
            device=int(e["pid"]), lane=lanes.get((e["pid"], e["tid"]), str(e["tid"])), kind=str(e.get("cat", "")),
            stage=args.get("stage"), micro_batch=args.get("micro_batch"), name=str(e["name"]),
            start_s=float(e["ts"]) * 1e-6, duration_s=float(e["dur"]) * 1e-6))
    events.sort(key=lambda ev: (ev.start_s, ev.device))
    return events


class Simulation:
    """One simulated training iteration of a plan (graphpipe.sim/1 plus the timeline).

    Attributes:
        data: the CLI's graphpipe.sim/1 JSON.
        timeline: every simulated slice, by start time.
        trace: the Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
    """

    def __init__(self, data: Dict[str, Any], trace: Dict[str, Any], svg: str):
        self.data = data
        self.trace = trace
        self.timeline: List[TimelineEvent] = _timeline(trace)
        self._svg = svg

    @property
    def iteration_time_s(self) -> float:
        return float(self.data["iteration_time_s"])

    @property
    def throughput_samples_per_s(self) -> float:
        return float(self.data["throughput_samples_per_s"])

    @property
    def bubble_fraction(self) -> float:
        return float(self.data["bubble_fraction"])

    @property
    def peak_memory_bytes(self) -> List[float]:
        return [float(b) for b in self.data["peak_memory_bytes"]]

    def svg(self, path: Optional[PathLike] = None) -> str:
        """The timeline picture (SVG text, the CLI's `simulate --svg`); also written to ``path``."""
        if path is not None:
            Path(path).write_text(self._svg)
        return self._svg

    def save_trace(self, path: PathLike) -> None:
        """Writes the Chrome trace-event JSON (Perfetto, chrome://tracing)."""
        Path(path).write_text(json.dumps(self.trace))

    def __repr__(self) -> str:
        return (f"Simulation(iteration_time_s={self.iteration_time_s:.6g}, throughput={self.throughput_samples_per_s:.1f}"
                f" samples/s, bubble={self.bubble_fraction:.1%}, {len(self.timeline)} timeline events)")


def simulate(plan: Union[Plan, PathLike], *, schedule: str = "1f1b", cluster: Optional[str] = None,
             profile: Optional[PathLike] = None, extra_args: Sequence[str] = ()) -> Simulation:
    """Simulates one training iteration of ``plan`` (`graphpipe simulate`).

    Args:
        plan: a `Plan` or a plan file.
        schedule: ``1f1b`` or ``gpipe`` (``zb`` where the CLI has it).
        cluster: simulate on another cluster than the plan was made for.
        profile: simulate with these measured op costs.
    """
    p = plan if isinstance(plan, Plan) else Plan.load(plan)
    with tempfile.TemporaryDirectory(prefix="graphpipe-sim-") as tmp:
        trace, svg = Path(tmp) / "trace.json", Path(tmp) / "timeline.svg"
        args = ["simulate", "--plan", p._file(), "--schedule", schedule, "--json", "--trace", trace, "--svg", svg]
        if cluster is not None:
            args += ["--cluster", cluster]
        if profile is not None:
            args += ["--profile", os.fspath(profile)]
        proc = _cli.run([*args, *extra_args])
        return Simulation(json.loads(proc.stdout), json.loads(trace.read_text()), svg.read_text())


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What `graphpipe train --json` reported (graphpipe.train/1).

    Attributes:
        losses: the training loss of every step.
        iteration_time_s: measured time per step.
        predicted_iteration_time_s: the plan's prediction (None for a ``single`` run).
        ranks: per worker: rank, stage, measured and predicted memory.
        data: the whole JSON document.
    """

    losses: List[float]
    iteration_time_s: Optional[float]
    predicted_iteration_time_s: Optional[float]
    ranks: List[Dict[str, Any]]
    data: Dict[str, Any]

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


def _data_dir(data, scratch: Path) -> Optional[str]:
    """``data`` as a directory of ``<input>.npy`` files: a directory as is, a mapping written out."""
    if data is None:
        return None
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if not isinstance(data, Mapping):
        raise TypeError("data must be a directory of <input>.npy files or a mapping {input name: array}")
    import numpy as np

    d = scratch / "data"
    d.mkdir(parents=True, exist_ok=True)
    for name, value in data.items():
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        np.save(d / f"{name}.npy", np.asarray(value))
    return str(d)


def train(plan: Union[Plan, PathLike], data: Union[None, PathLike, Mapping[str, Any]] = None, *, steps: int = 10,
          seed: int = 1, optimizer: str = "adam", lr: float = 1e-3, momentum: float = 0.9, schedule: str = "1f1b",
          shuffle: bool = False, threads: int = 1, device: str = "cpu", timeout: float = 60.0,
          single: bool = False, seeded_weights: bool = False, launcher: str = "local", nnodes: int = 1,
          master_addr: str = "127.0.0.1", master_port: int = 29500, extra_args: Sequence[str] = (),
          run_timeout: Optional[float] = None) -> Union[TrainResult, str]:
    """Trains the plan's model with real tensors (`graphpipe train`) and returns the losses.

    With ``launcher="local"`` (the default) it runs here: one worker process per device of the plan
    (or, with ``single=True``, the one-process reference: the whole model, no pipeline, the plan's
    mini-batch). With ``launcher="torchrun"`` it runs nothing: it returns (and prints) the torchrun
    command that runs the same training with one process per device, on ``nnodes`` hosts.

    Args:
        plan: a `Plan` or a plan file (for torchrun, a saved one: the workers read it).
        data: None (seeded synthetic data), a directory of ``<input>.npy`` files (``label.npy`` or
            ``target.npy`` for the appended loss; first dimension = sample), or a mapping
            ``{name: array or tensor}`` with the same names (`ExportInfo.input_names` and
            `ExportInfo.label_names`). Step k uses samples [kB, (k+1)B) mod N unless ``shuffle``.
        steps: optimizer steps.
        seed: seed of weights not in the model file, synthetic data and dropout masks.
        optimizer, lr, momentum: ``adam`` or ``sgd`` (with momentum), and their settings.
        schedule: ``1f1b`` or ``gpipe``.
        single: train the one-process reference instead of the pipeline.
        seeded_weights: ignore the weights stored in an ONNX file (train from ``seed``).
        timeout: seconds a worker waits for a peer before giving up.
        run_timeout: seconds the whole command may take (None: no limit).
        extra_args: further `graphpipe train` options, passed as they are.

    Raises:
        GraphPipeError: the CLI refused the input (exit 2) or training failed (exit 1, e.g. a
            non-finite loss naming the step, stage and op).
    """
    p = plan if isinstance(plan, Plan) else Plan.load(plan)
    if launcher not in ("local", "torchrun"):
        raise ValueError(f'launcher must be "local" or "torchrun", got {launcher!r}')
    scratch = _Scratch()
    opts: List[Any] = ["--steps", steps]
    # Only what differs from the CLI's defaults, so a printed torchrun command stays readable.
    for flag, value, default in (("--seed", seed, 1), ("--optimizer", optimizer, "adam"), ("--lr", lr, 1e-3),
                                 ("--momentum", momentum, 0.9), ("--schedule", schedule, "1f1b"),
                                 ("--threads", threads, 1), ("--device", device, "cpu"), ("--timeout", timeout, 60.0)):
        if value != default:
            opts += [flag, value]
    data_dir = _data_dir(data, scratch.dir)
    if data_dir is not None:
        opts += ["--data", data_dir]
    if shuffle:
        opts.append("--shuffle")
    if seeded_weights:
        opts.append("--seeded-weights")
    opts += list(extra_args)

    if launcher == "torchrun":
        if single:
            raise ValueError("single=True is one process: there is nothing for torchrun to launch")
        if p.path is None:
            raise ValueError("save the plan first (plan.save('plan.json')): torchrun's workers read it from a file")
        if data is not None and not isinstance(data, (str, os.PathLike)):
            raise ValueError("with torchrun, pass data as a directory every host can read")
        if p.num_devices % nnodes:
            raise ValueError(f"the plan's {p.num_devices} devices do not split evenly over {nnodes} nodes")
        per_node = p.num_devices // nnodes
        if nnodes == 1:
            head = ["torchrun", "--standalone", "--nproc-per-node", per_node]
        else:
            head = ["torchrun", "--nnodes", nnodes, "--nproc-per-node", per_node, "--rdzv-backend", "static",
                    "--master-addr", master_addr, "--master-port", master_port, "--node-rank", "$NODE_RANK"]
        cmd = [*head, "--no-python", _cli.find_binary(), "train", "--plan", str(p.path.resolve()), *opts]
        text = " ".join(a if a == "$NODE_RANK" else shlex.quote(str(a)) for a in cmd)
        print(text)
        return text

    if single:
        args = ["train", "--single", "--model", p.model_spec, "--batch", p.mini_batch_size, *opts, "--json"]
    else:
        args = ["train", "--plan", p._file(), *opts, "--json"]
    proc = _cli.run(args, timeout=run_timeout)
    doc = json.loads(proc.stdout)
    return TrainResult(losses=[float(v) for v in doc["losses"]], iteration_time_s=doc.get("iteration_time_s"),
                       predicted_iteration_time_s=doc.get("predicted_iteration_time_s"),
                       ranks=list(doc.get("ranks", [])), data=doc)


def model_info(module_or_path, example_inputs=None, *, loss: Loss = None) -> Dict[str, Any]:
    """`graphpipe model info --json` (graphpipe.model_info/1): parameter count (``params``, ties
    counted once), FLOPs, ops per kind, branch structure. A module is exported first."""
    scratch = _Scratch()
    spec, _ = _model_spec(module_or_path, example_inputs, scratch, loss)
    return json.loads(_cli.run(["model", "info", "--model", spec, "--json"]).stdout)
