"""`graphpipe.export`: a PyTorch module to the ONNX file graphpipe imports, exported so that it trains
exactly as the module does, with the parameters' PyTorch names (and true ties) recorded in the file.

The settings are those of the project's own fixtures (tests/fixtures/onnx/export_fixtures.py; why in
docs/shared-params.md): the TorchScript exporter (`dynamo=False`) at opset 17, training mode (Dropout
and BatchNorm as in training), no constant folding (folding merges equal initializers, e.g. two
LayerNorms' all-ones weights, into one), parameters stored in the file, dim 0 of every input and
output a dynamic batch axis.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

METADATA_KEY = "graphpipe.export"
METADATA_FORMAT = "graphpipe.export/1"
OPSET = 17

Loss = Optional[str]  # None (what the importer decides), "cross_entropy", "mse", "bce" or "own"


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What `export` wrote.

    Attributes:
        path: the ONNX file.
        input_names: the graph's data inputs, in the order of ``example_inputs``: the names
            ``graphpipe train --data DIR`` looks for (``DIR/<name>.npy``).
        output_names: the graph's outputs.
        losses: per output, the loss graphpipe's importer appends: ``"bce"`` (binary cross-entropy
            with logits) against a float ``target`` [B, 1] for a [B, 1] output, ``"cross_entropy"``
            against an int64 ``label`` input of shape [B] for a [B, C] output, else ``"mse"`` against a float
            ``target`` input of the output's shape (``label_k`` / ``target_k`` with several outputs).
            A scalar output is the module's own loss (``"own"``: e.g. ``F.cross_entropy(logits.view(-1,
            V), targets.view(-1))``, its targets a forward argument); then the other outputs get
            none (``"none"``).
        label_names: per output, the name of that loss's target input (``label`` or ``target``...;
            ``""`` where none is appended).
        parameters: per initializer that is a trainable parameter, every PyTorch name bound to it
            (``named_parameters(remove_duplicate=False)``); two or more names are a true tie.
        num_parameters: PyTorch's count, ``sum(p.numel() for p in module.parameters())``.
        unmatched: trainable parameters (their first name) that no initializer carries: unused by
            ``forward``, or renamed by the exporter.
    """

    path: str
    input_names: Tuple[str, ...]
    output_names: Tuple[str, ...]
    losses: Tuple[str, ...]
    label_names: Tuple[str, ...]
    parameters: Dict[str, List[str]]
    num_parameters: int
    unmatched: Tuple[str, ...]

    @property
    def ties(self) -> List[List[str]]:
        """The truly tied parameters: the name lists with two or more PyTorch names."""
        return [names for names in self.parameters.values() if len(names) >= 2]


def _as_tuple(example_inputs) -> tuple:
    import torch

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in example_inputs):
        return tuple(example_inputs)
    raise TypeError("example_inputs must be a tensor or a tuple of tensors (one per forward argument), got "
                    f"{type(example_inputs).__name__}")


def _default_input_names(module, count: int) -> List[str]:
    """The forward's own argument names (x, ids, ...), so data files read as the code does."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= count:
        return positional[:count]
    return ["input"] if count == 1 else [f"input{k}" for k in range(count)]


def _loss_names(output_shapes: Sequence[Sequence[int]]) -> Tuple[List[str], List[str]]:
    """The importer's rule (docs/onnx.md, "Loss"): a scalar output is the module's own loss ("own", no
    label input appended; then no other output gets a loss); else bce + target for [B, 1], cross_entropy
    + label for other rank-2 outputs, mse + target for the rest."""
    ranks = [len(s) for s in output_shapes]
    if any(rank == 0 for rank in ranks):
        return ["own" if rank == 0 else "none" for rank in ranks], ["" for _ in ranks]
    losses, labels = [], []
    for k, shape in enumerate(output_shapes):
        rank = len(shape)
        suffix = "" if len(ranks) == 1 else f"_{k}"
        if rank == 2 and shape[1] == 1:
            losses.append("bce")
            labels.append("target" + suffix)
        elif rank == 2:
            losses.append("cross_entropy")
            labels.append("label" + suffix)
        else:
            losses.append("mse")
            labels.append("target" + suffix)
    return losses, labels


def parameter_names(module, initializer_names: Sequence[str]) -> Tuple[Dict[str, List[str]], List[str]]:
    """Binds initializers to PyTorch parameters by tensor identity.

    Returns ({initializer name: [every PyTorch name of that tensor]}, [trainable parameters no
    initializer carries]). Only trainable parameters (``requires_grad``) are listed.
    """
    groups: Dict[int, Tuple[object, List[str]]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), (p, []))[1].append(name)
    inits = set(initializer_names)
    bound: Dict[str, List[str]] = {}
    unmatched: List[str] = []
    for p, names in groups.values():
        if not getattr(p, "requires_grad", False):
            continue
        hits = [n for n in names if n in inits]
        if not hits:
            unmatched.append(names[0])
        for h in hits:
            bound[h] = list(names)
    return dict(sorted(bound.items())), unmatched


def export(module, example_inputs, path: Union[str, "os.PathLike[str]"], *, loss: Loss = None,
           input_names: Optional[Sequence[str]] = None, output_names: Optional[Sequence[str]] = None) -> ExportInfo:
    """Writes ``module`` to ``path`` as an ONNX file that graphpipe trains exactly as PyTorch would.

    Args:
        module: a ``torch.nn.Module``. Its state is unchanged by the export (buffers such as
            BatchNorm's running statistics and the global RNG are restored after tracing).
        example_inputs: one tensor, or a tuple with one tensor per ``forward`` argument; dim 0 is the
            batch (any size: it is exported as a dynamic axis).
        path: the ONNX file to write.
        loss: the loss graphpipe should train with. graphpipe's importer appends the loss itself
            (docs/onnx.md): cross-entropy against an int64 class label for a [B, C] output, mean
            squared error against a target of the output's shape otherwise. ``None`` accepts that
            rule; ``"cross_entropy"`` or ``"mse"`` states what you expect and raises ``ValueError``
            when the module's outputs would get the other one. A module whose ``forward`` returns its
            own loss (a scalar: ``F.cross_entropy(logits.view(-1, V), targets.view(-1))`` with the
            targets a forward argument) trains on that loss as it is (``"own"``).
        input_names: names of the graph inputs (default: ``forward``'s argument names).
        output_names: names of the graph outputs (default: ``output``, or ``output0``...).

    Returns:
        An `ExportInfo` (names of inputs, outputs and the loss targets; the parameter names).

    The file carries ONNX ``metadata_props`` key ``graphpipe.export``: JSON
    ``{"format": "graphpipe.export/1", "torch": VERSION, "parameters": {INITIALIZER: [NAMES...]}}``,
    where each trainable parameter's initializer lists every PyTorch name bound to that tensor.
    """
    import onnx
    import torch

    if loss not in (None, "cross_entropy", "mse", "bce", "own"):
        raise ValueError(f'loss must be None, "cross_entropy", "mse", "bce" or "own", got {loss!r}')
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    examples = _as_tuple(example_inputs)
    names_in = list(input_names) if input_names is not None else _default_input_names(module, len(examples))
    if len(names_in) != len(examples):
        raise ValueError(f"{len(names_in)} input names for {len(examples)} example inputs")
    path = os.fspath(path)

    buffers = {k: v.detach().clone() for k, v in module.named_buffers()}
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # torch deprecates the TorchScript exporter and its `training` argument; both are what this
        # export needs (the dynamo exporter writes opset 18+, which the importer does not take yet).
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        try:
            with torch.no_grad():  # how many outputs, to name them; scalars (a loss) have no batch axis
                out = module(*examples)
            outs_list = list(out) if isinstance(out, (tuple, list)) else [out]
            count = len(outs_list)
            own_loss = any(getattr(o, "dim", lambda: 1)() == 0 for o in outs_list)
            clash = [n for n in names_in if n.startswith(("label", "target"))]
            if clash and not own_loss:
                raise ValueError(f"input name {clash[0]!r}: names starting with label/target are taken by the loss "
                                 "graphpipe appends; pass input_names=...")
            names_out = (list(output_names) if output_names is not None
                         else ["output"] if count == 1 else [f"output{k}" for k in range(count)])
            if len(names_out) != count:
                raise ValueError(f"{len(names_out)} output names for {count} outputs of forward")
            torch.onnx.export(
                module, examples, path, dynamo=False, opset_version=OPSET,
                training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, export_params=True,
                input_names=names_in, output_names=names_out,
                dynamic_axes={n: {0: "batch"} for n, o in zip(names_in + names_out, list(examples) + outs_list)
                              if getattr(o, "dim", lambda: 1)() > 0})
        finally:
            with torch.no_grad():  # tracing ran forward in training mode: undo its running statistics
                for k, b in module.named_buffers():
                    if k in buffers:
                        b.copy_(buffers[k])

    proto = onnx.load(path)
    outs = [o.name for o in proto.graph.output]
    ranks = [len(o.type.tensor_type.shape.dim) for o in proto.graph.output]
    losses, labels = _loss_names([tuple(o.shape) for o in outs_list])
    if loss is not None and any(l != loss for l in losses if l != "none"):
        k = next(i for i, l in enumerate(losses) if l != loss)
        raise ValueError(
            f"output {outs[k]!r} has rank {ranks[k]}: graphpipe appends {losses[k]} to it, not {loss} "
            "(bce for [batch, 1]; cross_entropy for other [batch, classes] logits; any other shape gets mse)")

    bound, unmatched = parameter_names(module, [t.name for t in proto.graph.initializer])
    meta = {"format": METADATA_FORMAT, "torch": torch.__version__, "parameters": bound}
    for prop in list(proto.metadata_props):
        if prop.key == METADATA_KEY:
            proto.metadata_props.remove(prop)
    entry = proto.metadata_props.add()
    entry.key = METADATA_KEY
    entry.value = json.dumps(meta, sort_keys=True)
    onnx.save(proto, path)
    return ExportInfo(path=path, input_names=tuple(names_in), output_names=tuple(outs), losses=tuple(losses),
                      label_names=tuple(labels), parameters=bound,
                      num_parameters=sum(p.numel() for p in module.parameters()), unmatched=tuple(unmatched))
