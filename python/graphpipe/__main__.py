"""`python -m graphpipe ARGS` runs `graphpipe ARGS`: the same binary the package drives, with its own
help, output and exit code."""
import os
import sys

from ._cli import BinaryNotFoundError, find_binary


def main() -> int:
    try:
        binary = find_binary()
    except BinaryNotFoundError as e:
        print(f"graphpipe: error: {e.message}", file=sys.stderr)
        return e.returncode  # 127, as a shell says for a command it cannot find
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, [binary, *sys.argv[1:]])  # replaces this process: signals and exit code pass through


if __name__ == "__main__":
    sys.exit(main())
