"""README.md's "Python" quickstart, run exactly as written (the first ```python block of the section)."""
import math
import re
from pathlib import Path

import pytest

import graphpipe


def quickstart_code(repo: Path) -> str:
    readme = (repo / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)
    assert len(section) == 2, "README.md has no '## Python' section"
    m = re.search(r"```python\n(.*?)```", section[1], re.S)
    assert m, "the Python section has no ```python block"
    return m.group(1)


def test_quickstart_runs_as_written(repo, in_tmp, capsys):
    code = quickstart_code(repo)
    assert len(code.strip().splitlines()) <= 14, "the quickstart should stay short"
    scope: dict = {"__name__": "__quickstart__"}
    exec(compile(code, "README.md (Python quickstart)", "exec"), scope)
    out = capsys.readouterr().out

    plan = scope["plan"]
    assert isinstance(plan, graphpipe.Plan)
    assert plan.num_devices == 4 and plan.mini_batch_size == 64
    # The two branches are planned onto different stages that run side by side: a graph pipeline.
    stage_of = {op: s.id for s in plan.stages for op in s.ops}
    branch_a = {stage_of[op] for op in stage_of if op.startswith("/a/")}
    branch_b = {stage_of[op] for op in stage_of if op.startswith("/b/")}
    assert branch_a and branch_b and not (branch_a & branch_b), plan
    assert "graphpipe plan for TwoBranch" in out  # print(plan) is the CLI's summary

    svg = (in_tmp / "timeline.svg").read_text()
    assert svg.lstrip().startswith(("<svg", "<?xml")) and "</svg>" in svg
    sim = scope["sim"]
    assert {e.kind for e in sim.timeline} >= {"forward", "backward"}
    assert max(e.end_s for e in sim.timeline) == pytest.approx(sim.iteration_time_s, rel=1e-6)

    losses = [float(x) for x in out.strip().splitlines()[-1].strip("[]").split(",")]
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses)
    # Cross-entropy over 10 classes from a fresh model starts near ln(10).
    assert abs(losses[0] - math.log(10)) < 0.5
