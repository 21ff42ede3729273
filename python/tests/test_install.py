"""`pip install .` from a clean copy of the package's files, into a fresh virtual environment (with the
system's site-packages, for torch): the installed package records that checkout and finds its
build/graphpipe from any directory, and `python -m graphpipe` runs it. pip fetches setuptools from
PyPI for the isolated build, as a user's `pip install .` does."""
import os
import shutil
import subprocess
import sys
import venv


def test_pip_install_from_a_clean_checkout(repo, gp_bin, tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for f in ["pyproject.toml", "setup.py", "README.md"]:
        shutil.copy(repo / f, checkout / f)
    shutil.copytree(repo / "python" / "graphpipe", checkout / "python" / "graphpipe",
                    ignore=shutil.ignore_patterns("__pycache__", "_source.py"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    # The venv reuses the running interpreter's pip (with_pip=False is much faster than ensurepip).
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q",
                          "--disable-pip-version-check", str(checkout)], capture_output=True, text=True, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert not (checkout / "build").exists(), "setuptools wrote into the checkout's build/ (CMake's)"
    assert not list(checkout.rglob("*.egg-info"))

    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHPIPE_BIN", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    probe = ("import graphpipe, graphpipe._source as s; print(graphpipe.__file__); print(s.SOURCE_DIR); "
             "print(graphpipe.find_binary())")
    # The checkout has no build yet: the error names the recorded checkout's build/graphpipe.
    r = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode != 0 and f"{checkout}/build/graphpipe (missing)" in r.stderr, r.stderr
    # Built (here: the real binary linked in): found from any directory.
    (checkout / "build").mkdir()
    os.symlink(gp_bin, checkout / "build" / "graphpipe")
    r = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    module_file, source, binary = r.stdout.split()
    assert module_file.startswith(str(env_dir)) and source == str(checkout)
    assert binary == str(checkout / "build" / "graphpipe")
    v = subprocess.run([py, "-m", "graphpipe", "--version"], capture_output=True, text=True, env=env, cwd="/")
    assert v.returncode == 0 and v.stdout.startswith("graphpipe ")
