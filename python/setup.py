"""Build of the hermes-guard Python package: the Rust parts come from this repository's cargo
workspace, one directory up.

- `hermes_guard/libhermes_guard.so`: the loadable extension, `cargo rustc -p hermes-guard-ext`
  (rusqlite `loadable_extension`, no SQLite of its own: it runs on the host's);
- `hermes_guard/hermes-guard`: the CLI, `cargo build` of ../cli (rusqlite `bundled`), exec'd by
  the `hermes-guard` console script and by `hermes_guard.verify` / `recover`.

Each is its own cargo invocation, so the two rusqlite feature sets never meet in one build. The
artifacts go to the workspace's target directory (`CARGO_TARGET_DIR`, default ../target), so a
rebuild reuses cargo's cache. `SETUPTOOLS_RUST_CARGO_PROFILE=dev` builds unoptimised (what the
CI's test install uses, sharing the debug build `cargo test` made).

Neither artifact links libpython, so the wheel is tagged `py3-none-<platform>`: one wheel for
every Python 3 on the platform. Linux only, like the guard.
"""

import os
import sys

from setuptools import setup
from setuptools.command.sdist import sdist

if not sys.platform.startswith("linux"):
    sys.exit(
        f"hermes-guard runs on Linux only (the guard relies on inotify, /proc and open-file-"
        f"description locks); this is {sys.platform}."
    )

from setuptools_rust import Binding, RustExtension
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)
EXT_MANIFEST = os.path.join(WORKSPACE, "ext", "Cargo.toml")
CLI_MANIFEST = os.path.join(WORKSPACE, "cli", "Cargo.toml")

for manifest in (EXT_MANIFEST, CLI_MANIFEST):
    if not os.path.isfile(manifest):
        sys.exit(
            f"{manifest} is missing: the package builds from a checkout of the hermes-guard "
            f"repository (pip install ./python, pip wheel ./python); an sdist cannot carry the "
            f"Rust workspace it needs"
        )

EXTENSION_FILE = "libhermes_guard.so"


class BuildRust(build_rust):
    """The extension keeps SQLite's own file name, `libhermes_guard.so` (SQLite derives its entry
    point, `sqlite3_hermesguard_init`, from it), instead of a Python module's
    `<name>.cpython-XY-<platform>.so`: it is not a Python module."""

    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        if ext.binding == Binding.NoBinding:
            return os.path.join(os.path.dirname(path), EXTENSION_FILE)
        return path


class NoSdist(sdist):
    """An sdist of python/ could not build: the Rust workspace it needs is one directory up."""

    def run(self):
        raise SystemExit(
            "hermes-guard has no sdist: the package builds from the repository's cargo workspace "
            "(../ext, ../cli), which an sdist of python/ cannot carry. Build a wheel from the "
            "checkout instead: pip wheel ./python, or python -m build --wheel python"
        )


class BdistWheel(bdist_wheel):
    """Nothing in the wheel depends on the Python version or ABI."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    rust_extensions=[
        RustExtension(
            "hermes_guard.libhermes_guard",
            path=EXT_MANIFEST,
            binding=Binding.NoBinding,
            py_limited_api=False,
        ),
        RustExtension(
            {"hermes-guard": "hermes_guard.hermes-guard"},
            path=CLI_MANIFEST,
            binding=Binding.Exec,
        ),
    ],
    cmdclass={"build_rust": BuildRust, "bdist_wheel": BdistWheel, "sdist": NoSdist},
    zip_safe=False,
)
