"""plan -> save/load -> simulate -> train through the package, checked against the CLI's own files."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import graphpipe

BATCH, MICRO = 16, 4


@pytest.fixture(scope="module")
def two_branch(repo):
    return str(repo / "tests" / "fixtures" / "onnx" / "two_branch.onnx")


@pytest.fixture(scope="module")
def plan(two_branch):
    return graphpipe.plan(two_branch, cluster="h200", devices=4, batch=BATCH, micro_batch=MICRO)


def test_plan_fields_are_the_cli_plan(plan, two_branch):
    assert plan.data["format"] == "graphpipe.plan/1" and plan.model_spec == two_branch
    assert plan.num_devices == 4 and plan.mini_batch_size == BATCH and plan.planner == "graphpipe"
    assert plan.micro_batch_sizes == [MICRO] * len(plan.stages)
    assert len(plan.stages) >= 2
    assert sorted(d for s in plan.stages for d in s.devices) == list(range(plan.num_devices))
    ops = [op for s in plan.stages for op in s.ops]
    assert len(ops) == len(set(ops)) == plan.data["model"]["num_ops"]
    assert plan.predicted_iteration_time_s > 0 and len(plan.predicted_peak_memory_bytes) == 4
    for s in plan.stages:  # the DAG's edges agree in both directions
        for t in s.outputs_to:
            assert s.id in plan.stages[t].inputs_from
    assert str(plan).startswith("graphpipe plan for two_branch") and str(plan).splitlines()[-1].startswith("search time")
    assert plan.explain().startswith(str(plan)) and "micro-batch" in plan.explain()[len(str(plan)):]
    dot = plan.to_dot()
    assert dot.startswith("digraph") and all(f"s{s.id} [" in dot for s in plan.stages)


def test_save_load_simulate_train(plan, tmp_path, gp_bin):
    saved = plan.save(tmp_path / "plan.json")
    loaded = graphpipe.Plan.load(saved)
    assert loaded.stages == plan.stages and loaded.data == plan.data
    with pytest.raises(graphpipe.GraphPipeError, match="no explanation"):
        loaded.explain()

    sim = graphpipe.simulate(plan)
    again = graphpipe.simulate(saved)  # a path works as well as a Plan
    assert sim.data == again.data and sim.iteration_time_s == again.iteration_time_s > 0
    assert sim.data["format"] == "graphpipe.sim/1" and 0 <= sim.bubble_fraction < 1
    # The timeline: every stage runs forward and backward once per micro-batch, within the iteration.
    for s in plan.stages:
        fwd = [e for e in sim.timeline if e.stage == s.id and e.kind == "forward"]
        bwd = [e for e in sim.timeline if e.stage == s.id and e.kind == "backward"]
        assert sorted(e.micro_batch for e in fwd) == sorted(e.micro_batch for e in bwd) == list(range(BATCH // MICRO))
        assert {e.device for e in fwd} == set(s.devices)
    assert max(e.end_s for e in sim.timeline) == pytest.approx(sim.iteration_time_s, rel=1e-6)
    assert min(e.start_s for e in sim.timeline) == 0
    svg = sim.svg(tmp_path / "t.svg")
    assert (tmp_path / "t.svg").read_text() == svg and "</svg>" in svg
    sim.save_trace(tmp_path / "trace.json")
    assert json.loads((tmp_path / "trace.json").read_text())["otherData"]["source"] == "simulator"

    piped = graphpipe.train(saved, steps=3)  # from the saved file, as torchrun's workers would
    single = graphpipe.train(plan, steps=3, single=True)
    assert len(piped.losses) == 3
    assert all(math.isfinite(v) for v in piped.losses)
    np.testing.assert_allclose(piped.losses, single.losses, rtol=0, atol=1e-5)
    assert piped.data["format"] == "graphpipe.train/1" and piped.final_loss == piped.losses[-1]
    assert sorted(r["rank"] for r in piped.ranks) == [0, 1, 2, 3]
    assert piped.predicted_iteration_time_s == pytest.approx(plan.predicted_iteration_time_s)

    # Data from arrays: the CLI reads what the package wrote (other losses than the synthetic data's).
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((32, 32)).astype(np.float32), "label": rng.integers(0, 10, 32)}
    on_data = graphpipe.train(plan, data, steps=3, single=True)
    assert len(on_data.losses) == 3 and on_data.losses != single.losses

    cmd = graphpipe.train(saved, steps=7, optimizer="sgd", launcher="torchrun")
    assert cmd.startswith(f"torchrun --standalone --nproc-per-node 4 --no-python {gp_bin} train --plan {saved}")
    assert "--steps 7" in cmd and "--optimizer sgd" in cmd and "--log " not in cmd
    two = graphpipe.train(saved, steps=7, launcher="torchrun", nnodes=2, master_addr="node0")
    assert "--nnodes 2 --nproc-per-node 2" in two and "--master-addr node0" in two and "$NODE_RANK" in two


def test_torchrun_needs_a_saved_plan(two_branch):
    fresh = graphpipe.plan(two_branch, cluster="h200", devices=2, batch=8)
    with pytest.raises(ValueError, match="save the plan first"):
        graphpipe.train(fresh, steps=1, launcher="torchrun")


def test_python_m_graphpipe_is_the_cli(gp_bin, repo):
    env = {"PYTHONPATH": str(repo / "python"), "GRAPHPIPE_BIN": gp_bin, "PATH": "/usr/bin:/bin"}
    ours = subprocess.run([sys.executable, "-m", "graphpipe", "--help"], capture_output=True, text=True, env=env)
    cli = subprocess.run([gp_bin, "--help"], capture_output=True, text=True)
    assert ours.returncode == cli.returncode == 0
    assert ours.stdout == cli.stdout and "Subcommands:" in ours.stdout
    bad = subprocess.run([sys.executable, "-m", "graphpipe", "plan", "--model", "nope", "--devices", "1",
                          "--batch", "1"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith('graphpipe: error: unknown model "nope"')
