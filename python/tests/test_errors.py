"""CLI failures become GraphPipeError with the one-line message and exit code; a missing binary
says every place it looked."""
import subprocess
import sys

import pytest

import graphpipe
from graphpipe import _cli


def test_bad_input_is_exit_2_with_the_cli_message():
    with pytest.raises(graphpipe.GraphPipeError) as e:
        graphpipe.plan("nope", devices=2, batch=8)
    assert e.value.returncode == 2
    assert e.value.message.startswith('unknown model "nope" (builtin models: mmt,')
    assert "graphpipe: error:" not in e.value.message and "(exit code 2)" in str(e.value)
    assert e.value.command[1:3] == ["plan", "--model"]

    with pytest.raises(graphpipe.GraphPipeError) as e:
        graphpipe.plan("mmt:layers=1", devices=0, batch=8)
    assert e.value.returncode == 2 and e.value.message == "--devices: need at least 1 device, got 0"


@pytest.fixture(scope="module")
def small_plan(repo):
    return graphpipe.plan(str(repo / "tests" / "fixtures" / "onnx" / "two_branch.onnx"), cluster="h200",
                          devices=2, batch=8)


def test_bad_data_is_refused_before_training(small_plan, tmp_path):
    with pytest.raises(graphpipe.GraphPipeError) as e:
        graphpipe.train(small_plan, tmp_path, steps=2)
    assert e.value.returncode == 2
    assert e.value.message == f'--data {tmp_path}: missing input.npy for model input "input" (the directory has: no .npy files)'


def test_a_failing_run_is_exit_1():
    with pytest.raises(graphpipe.GraphPipeError) as e:
        graphpipe.train(graphpipe.plan("mmt:branches=2,layers=1,seq=4,hidden=16,heads=2,ffn=16", cluster="h200",
                                       devices=2, batch=4), steps=3, optimizer="sgd", lr=1e30)
    assert e.value.returncode == 1 and "non-finite loss" in e.value.message


def test_unreadable_plan_file(tmp_path):
    with pytest.raises(graphpipe.GraphPipeError) as e:
        graphpipe.Plan.load(tmp_path / "none.json")
    assert e.value.returncode == 2 and str(tmp_path / "none.json") in e.value.message


def test_wrong_graphpipe_bin_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHPIPE_BIN", str(tmp_path / "gp"))
    with pytest.raises(graphpipe.BinaryNotFoundError, match=f"GRAPHPIPE_BIN={tmp_path / 'gp'} \\(not an executable"):
        graphpipe.find_binary()


def test_missing_binary_lists_every_place_tried(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPHPIPE_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "python" / "graphpipe").mkdir(parents=True)  # the package's place in a checkout
    (tmp_path / "CMakeLists.txt").write_text("")
    monkeypatch.setattr(_cli, "__file__", str(tmp_path / "python" / "graphpipe" / "_cli.py"))
    monkeypatch.setattr(_cli, "_recorded_source_dir", lambda: tmp_path / "checkout")
    with pytest.raises(graphpipe.BinaryNotFoundError) as e:
        graphpipe.find_binary()
    msg = e.value.message
    for place in ["GRAPHPIPE_BIN (unset)", f"{tmp_path}/checkout/build/graphpipe (missing)",
                  f"{tmp_path}/build/graphpipe (missing)", "PATH (no graphpipe on it)"]:
        assert place in msg, msg
    assert "make cli" in msg
    # And the package's own calls raise it (a GraphPipeError like any other CLI failure).
    with pytest.raises(graphpipe.GraphPipeError):
        graphpipe.plan("mmt", devices=1, batch=1)


def test_python_m_graphpipe_without_a_binary(tmp_path, repo):
    env = {"PYTHONPATH": str(repo / "python"), "GRAPHPIPE_BIN": str(tmp_path / "gp"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "graphpipe", "--help"], capture_output=True, text=True, env=env)
    assert r.returncode == 127 and "graphpipe binary was not found" in r.stderr and str(tmp_path / "gp") in r.stderr
