"""Build of the hermes-guard Python package: the Rust parts come from this repository's cargo
workspace, one directory up (or, in the sdist, from the part of it carried under rust/).

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
# In a checkout the Rust workspace is one directory up; an sdist carries the part of it the
# package builds under rust/ (SdistWithWorkspace below).
CARRIED = os.path.join(HERE, "rust")
WORKSPACE = CARRIED if os.path.isfile(os.path.join(CARRIED, "Cargo.toml")) else os.path.dirname(HERE)
EXT_MANIFEST = os.path.join(WORKSPACE, "ext", "Cargo.toml")
CLI_MANIFEST = os.path.join(WORKSPACE, "cli", "Cargo.toml")

for manifest in (EXT_MANIFEST, CLI_MANIFEST):
    if not os.path.isfile(manifest):
        sys.exit(
            f"{manifest} is missing: the package builds from a checkout of the hermes-guard "
            f"repository (pip install ./python, pip wheel ./python) or from its sdist, which "
            f"carries the Rust workspace under rust/"
        )

EXTENSION_FILE = "libhermes_guard.so"
# A first `pip install ./python` (release, nothing in cargo's cache), measured: 82 crates, 296 s
# on a 2-core machine busy with other builds.
FIRST_BUILD = "some minutes (about 80 crates: 5 min on a busy 2-core machine)"


def _announce(message):
    """One line for the person waiting. pip runs this build with its output captured (shown only
    with `pip install -v`, or when the build fails), so on a terminal the line goes to the
    terminal itself (/dev/tty), which pip does not capture; with no terminal (CI, a container
    build) it goes to stderr, where `-v` shows it."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\n{message}\n")
            return
    except OSError:
        pass
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


class BuildRust(build_rust):
    """The extension keeps SQLite's own file name, `libhermes_guard.so` (SQLite derives its entry
    point, `sqlite3_hermesguard_init`, from it), instead of a Python module's
    `<name>.cpython-XY-<platform>.so`: it is not a Python module."""

    def run(self):
        # The profile setuptools-rust picks: SETUPTOOLS_RUST_CARGO_PROFILE, else dev for a debug
        # or in-place (editable) build, else release.
        is_debug = getattr(self, "_is_debug_build", None)
        debug = is_debug(self.extensions[0]) if is_debug and self.extensions else bool(self.debug)
        profile = os.environ.get("SETUPTOOLS_RUST_CARGO_PROFILE") or ("dev" if debug else "release")
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(WORKSPACE, "target")
        _announce(
            f"hermes-guard: cargo is building the SQLite extension (ext/) and the hermes-guard "
            f"CLI (cli/, SQLite compiled in), profile {profile}, in {target}. A first build takes "
            f"{FIRST_BUILD}; later ones reuse cargo's cache there. pip shows nothing until it "
            f"ends: `pip install -v ./python` shows cargo's progress."
        )
        super().run()

    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        if ext.binding == Binding.NoBinding:
            return os.path.join(os.path.dirname(path), EXTENSION_FILE)
        return path


# What of the Rust workspace the sdist carries: the crates the package builds (the library, the
# store, the CLI, the extension) with the workspace's lock, and the documents the CLI embeds.
# Symlinks are followed (cli/docs/ links into docs/).
CARRIED_TREES = ["src", "store", "cli", "ext"]
CARRIED_FILES = ["Cargo.toml", "Cargo.lock", "README.md", "LICENSE"]
CARRIED_MEMBERS = 'members = [".", "store", "cli", "ext"]'


class SdistWithWorkspace(sdist):
    """An sdist that builds: python/ plus, under rust/, the part of the cargo workspace one
    directory up that the two Rust artifacts need. The carried root manifest lists only the
    carried members (the repository's test-only members stay behind)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if WORKSPACE == CARRIED:
            raise SystemExit("an sdist is made from a checkout of the repository, not from an sdist")
        import re
        import shutil

        dest = os.path.join(base_dir, "rust")
        os.makedirs(dest, exist_ok=True)
        for name in CARRIED_FILES:
            shutil.copyfile(os.path.join(WORKSPACE, name), os.path.join(dest, name))
        for tree in CARRIED_TREES:
            shutil.copytree(os.path.join(WORKSPACE, tree), os.path.join(dest, tree),
                            ignore=shutil.ignore_patterns("target", "__pycache__"))
        manifest = os.path.join(dest, "Cargo.toml")
        with open(manifest, encoding="utf-8") as f:
            text = f.read()
        text, n = re.subn(r"^members = \[.*\]$", CARRIED_MEMBERS, text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{manifest}: no members line to rewrite")
        with open(manifest, "w", encoding="utf-8") as f:
            f.write(text)


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
    cmdclass={"build_rust": BuildRust, "bdist_wheel": BdistWheel, "sdist": SdistWithWorkspace},
    zip_safe=False,
)
