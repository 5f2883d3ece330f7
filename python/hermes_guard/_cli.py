"""The `hermes-guard` console script: runs the Rust CLI carried in this package (`captures`,
`verify`, `recover`, `demo`, `bench`)."""

import os
import sys

from ._capture import cli_path


def main() -> None:
    """Replaces this process with the packaged `hermes-guard` binary, arguments unchanged."""
    try:
        path = cli_path()
    except Exception as e:  # a broken install: say so instead of a traceback
        sys.exit(f"hermes-guard: {e}")
    os.execv(path, ["hermes-guard", *sys.argv[1:]])
