"""GraphPipe from Python: export a PyTorch module, plan it onto devices as a graph of pipeline stages,
simulate the schedule, and train it with the `graphpipe` engine.

A thin, pure-Python layer over the `graphpipe` command-line tool (built by `make cli`; found through
`$GRAPHPIPE_BIN`, the checkout the package was installed from, or `PATH`)::

    import graphpipe
    plan = graphpipe.plan(module, example_inputs, cluster="h200", devices=4, batch=64)
    print(plan)                               # stages, devices, micro-batch sizes, predicted time
    graphpipe.simulate(plan).svg("timeline.svg")
    print(graphpipe.train(plan, steps=5).losses)

Every failing command raises `GraphPipeError` with the CLI's one-line message and exit code.
"""
from ._cli import BinaryNotFoundError, GraphPipeError, find_binary
from .export import ExportInfo, export
from .pipeline import (Plan, Simulation, Stage, TimelineEvent, TrainResult, model_info, plan, simulate,
                       train)

__version__ = "0.5.0"

__all__ = [
    "BinaryNotFoundError", "ExportInfo", "GraphPipeError", "Plan", "Simulation", "Stage", "TimelineEvent",
    "TrainResult", "export", "find_binary", "model_info", "plan", "simulate", "train",
]
