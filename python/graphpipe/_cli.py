"""Finding and running the `graphpipe` command-line tool: every call of the package goes through here.

The package compiles nothing: it drives the C++ binary that `make cli` builds (`build/graphpipe`).
`find_binary()` looks, in order, at `$GRAPHPIPE_BIN`, `build/graphpipe` in the checkout the package was
installed from (recorded by setup.py at install time), in the checkout that holds this file (an
in-tree or editable use), in the current directory and its parents, and then on `PATH`.
A failing command becomes a `GraphPipeError` carrying the CLI's one-line message and exit code.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

ENV_VAR = "GRAPHPIPE_BIN"
# Bad input: "graphpipe: error: MESSAGE" (exit 2); a failure while running: "graphpipe: failed: ..." (exit 1).
_ERROR_PREFIXES = ("graphpipe: error: ", "graphpipe: failed: ")

PathLike = Union[str, "os.PathLike[str]"]


class GraphPipeError(RuntimeError):
    """A `graphpipe` command failed.

    Attributes:
        message: the CLI's one-line error (without its ``graphpipe: error:`` or ``graphpipe:
            failed:`` prefix), e.g.
            ``unknown model "nope" (builtin models: ...)``.
        returncode: the CLI's exit code: 2 for bad input (a file, field or value named in the
            message), 1 for a failure while running (e.g. a non-finite loss).
        command: the command line that failed.
        stderr: everything the command wrote to stderr.
    """

    def __init__(self, message: str, returncode: int, command: Sequence[str] = (), stderr: str = ""):
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.command = list(command)
        self.stderr = stderr

    def __str__(self) -> str:
        return f"{self.message} (exit code {self.returncode})"


class BinaryNotFoundError(GraphPipeError):
    """No `graphpipe` binary was found; the message lists every place that was tried."""

    def __init__(self, tried: Sequence[Tuple[str, str]]):
        places = "; ".join(f"{where} ({why})" for where, why in tried)
        super().__init__(
            f"the graphpipe binary was not found; tried: {places}. Build it with `make cli` in the "
            f"GraphPipe checkout, or set {ENV_VAR} to its path", returncode=127)
        self.tried = list(tried)


def _recorded_source_dir() -> Optional[Path]:
    try:
        from ._source import SOURCE_DIR  # written by setup.py when the package is installed
    except ImportError:
        return None
    return Path(SOURCE_DIR)


def _is_executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_binary() -> str:
    """The path of the `graphpipe` binary to run.

    Raises:
        BinaryNotFoundError: nothing usable was found (the message names every place tried), or
            ``$GRAPHPIPE_BIN`` is set but does not name an executable file.
    """
    tried: List[Tuple[str, str]] = []
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env)
        if _is_executable(p):
            return os.path.abspath(p)  # still right after a chdir
        # An explicit choice that is wrong is an error, not something to silently look past.
        raise BinaryNotFoundError([(f"{ENV_VAR}={env}", "not an executable file")])
    tried.append((ENV_VAR, "unset"))

    candidates: List[Tuple[str, Path]] = []
    recorded = _recorded_source_dir()
    if recorded is not None:
        candidates.append(("the checkout it was installed from", recorded / "build" / "graphpipe"))
    here = Path(__file__).resolve().parent
    if here.parent.name == "python" and (here.parent.parent / "CMakeLists.txt").is_file():
        # Used in place (PYTHONPATH=python, or an editable install): python/graphpipe in a checkout.
        candidates.append(("the checkout holding the package", here.parent.parent / "build" / "graphpipe"))
    cwd = Path.cwd().resolve()
    for d in [cwd, *cwd.parents]:
        if (d / "CMakeLists.txt").is_file() and (d / "python" / "graphpipe").is_dir():
            candidates.append(("the checkout above the current directory", d / "build" / "graphpipe"))
            break
    seen = set()
    for _, path in candidates:
        if path in seen:
            continue
        seen.add(path)
        if _is_executable(path):
            return str(path)
        tried.append((str(path), "missing" if not path.exists() else "not executable"))
    on_path = shutil.which("graphpipe")
    if on_path:
        return on_path
    tried.append(("PATH", "no graphpipe on it"))
    raise BinaryNotFoundError(tried)


def _one_line_error(stderr: str, returncode: int) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        for prefix in _ERROR_PREFIXES:
            if ln.startswith(prefix):
                return ln[len(prefix):]
    if lines:
        return lines[-1]
    return f"graphpipe exited with code {returncode} and printed no message"


def run(args: Sequence[str], *, cwd: Optional[PathLike] = None, timeout: Optional[float] = None,
        env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Runs ``graphpipe ARGS`` and returns the finished process (stdout and stderr as text).

    Raises:
        GraphPipeError: the command exited non-zero (its one-line message and exit code), or ran past
            ``timeout`` seconds.
    """
    cmd = [find_binary(), *[str(a) for a in args]]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise GraphPipeError(f"timed out after {timeout} s", returncode=124, command=cmd, stderr=err) from None
    if proc.returncode != 0:
        raise GraphPipeError(_one_line_error(proc.stderr, proc.returncode), proc.returncode, cmd, proc.stderr)
    return proc
