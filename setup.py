"""setup.py only for what pyproject.toml cannot say (the metadata lives there):
- the installed package records the checkout it came from (graphpipe/_source.py), so it finds that
  checkout's build/graphpipe from anywhere;
- setuptools' scratch files go to a temporary directory, never into ./build (CMake's build tree) or
  next to the sources."""
import os
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SCRATCH = os.path.join(tempfile.gettempdir(), f"graphpipe-pybuild-{os.getuid() if hasattr(os, 'getuid') else 0}")
os.makedirs(SCRATCH, exist_ok=True)


class BuildPyRecordingSource(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            with open(os.path.join(self.build_lib, "graphpipe", "_source.py"), "w") as f:
                f.write('"""Written by setup.py at install time: the checkout this package was installed from."""\n')
                f.write(f"SOURCE_DIR = {HERE!r}\n")


setup(cmdclass={"build_py": BuildPyRecordingSource},
      options={"build": {"build_base": os.path.join(SCRATCH, "build")},
               "egg_info": {"egg_base": SCRATCH}})
