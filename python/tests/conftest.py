"""The package's tests run on the sources in python/ (no install needed) and on the binary named by
$GRAPHPIPE_BIN (ctest passes the build's), else whatever graphpipe.find_binary() finds."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import graphpipe  # noqa: E402

if os.environ.get("GRAPHPIPE_BIN"):  # tests change directory: a relative path would stop resolving
    os.environ["GRAPHPIPE_BIN"] = os.path.abspath(os.environ["GRAPHPIPE_BIN"])


@pytest.fixture(scope="session")
def gp_bin() -> str:
    return graphpipe.find_binary()


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path
