"""A capture directory and its `manifest.json` (`hermes-guard help capture-format`), and the
operator's commands on it (`captures`, `verify`, `recover`), run by the `hermes-guard` CLI carried
in this package: the package answers what the CLI answers.

What was given and cannot be used (a path that does not exist, a directory that is not a
capture: the CLI's exit code 2) raises :class:`BadInputError`; captures whose manifest cannot be
read (the CLI's exit code 1 from `captures`) raise :class:`UnreadableCapturesError`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ._loader import HermesGuardError
from ._status import Backfill, FileId, RetireReason, _file_id, _path

PathLike = Union[str, "os.PathLike[str]"]

MANIFEST = "manifest.json"
HEALED = "healed.json"
_CLI_FILE = "hermes-guard"


class BadInputError(HermesGuardError, ValueError):
    """What was given cannot be used — a path that does not exist, a directory that is not a
    capture, a target that cannot receive it: where the CLI exits 2. Nothing was written."""


class CaptureFormatError(BadInputError):
    """A directory that is not a complete capture, or whose manifest cannot be read. When the
    directory still holds the database and its `-wal`, the message says how to open them."""


class UnreadableCapturesError(HermesGuardError):
    """:func:`captures` found captures whose `manifest.json` cannot be read, as
    `hermes-guard captures` lists them `unreadable` and exits 1. Their two files still hold
    every committed row: each reason says how to open them.

    `captures`: the readable captures, as :func:`captures` would have returned them;
    `unreadable`: each unreadable capture directory with why (and how to open its files)."""

    def __init__(self, given: PathLike, captures: Sequence["Capture"], unreadable: Dict[Path, str]):
        self.captures: List[Capture] = list(captures)
        self.unreadable: Dict[Path, str] = dict(unreadable)
        lines = [f"  {path}: {why}" for path, why in self.unreadable.items()]
        super().__init__(
            f"{len(self.unreadable)} capture(s) of {os.fspath(given)} cannot be read "
            f"({len(self.captures)} can: in .captures):\n" + "\n".join(lines)
        )


def _how_to_open(directory: Path) -> Optional[str]:
    """For a capture whose manifest is missing or unreadable: how to open its two files, which
    hold every committed row without it (the CLI says the same). None without a database and its
    `-wal` side by side, or for an interrupted `.partial` capture."""
    if directory.name.endswith(".partial"):
        return None
    try:
        names = sorted(e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False))
    except OSError:
        return None
    for name in names:
        if name.endswith(("-wal", "-shm", ".json")) or name + "-wal" not in names:
            continue
        return (
            f"its two files still open as a database with every committed row: copy {name} and "
            f"{name}-wal (same names, side by side) into an empty directory and open the copy "
            f"there, e.g. `sqlite3 /tmp/rows/{name}`; never open them inside the capture"
        )
    return None


@dataclass(frozen=True)
class WalEntry:
    """The manifest's `wal`: the retired WAL, read from the descriptor the guard pinned."""

    identity: FileId
    file: str
    bytes: int
    sha256: str
    header: Dict[str, Any]
    frames: int
    commits: int
    last_commit_frame: Optional[int]


@dataclass(frozen=True)
class MainEntry:
    """The manifest's `main`: the main image as the retiring connection saw it."""

    identity: FileId
    size: int
    file: str
    bytes: int
    sha256: str
    header: Dict[str, Any]
    mode: str


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Capture:
    """A complete capture: `<name>.retired-wal-<UTC>-<pid>[-n]/` with the retired WAL, the main
    image and `manifest.json`. `Capture(path)` reads the manifest; a path that does not exist, a
    `.partial` directory (an interrupted capture) or an unreadable manifest raises
    :class:`CaptureFormatError` (a :class:`BadInputError`)."""

    verified: Optional[bool] = None
    """From :func:`captures` (`hermes-guard captures`): whether the capture verifies; None for a
    `Capture(path)` made directly (see :meth:`verify`)."""
    status: Optional[str] = None
    """From :func:`captures`: the CLI's status line (`verified`, `NOT verified: ...`)."""
    missing: Optional[int] = None
    """From :func:`captures`: how many of its rows are still missing from the live database
    (None when not known: made directly, or a stale WAL, whose rows need `main`)."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        if self.path.name.endswith(".partial"):
            raise CaptureFormatError(
                f"{self.path} is an interrupted capture (.partial): incomplete, never used; it "
                f"can be deleted"
            )
        if not self.path.is_dir():
            raise CaptureFormatError(
                f"{self.path} is not a hermes-guard capture: "
                + ("it is not a directory" if os.path.lexists(self.path) else "it does not exist")
            )
        if not (self.path / MANIFEST).exists():
            hint = _how_to_open(self.path)
            raise CaptureFormatError(
                f"{self.path} is not a hermes-guard capture: it has no manifest.json"
                + (f"; {hint}" if hint else "")
            )
        try:
            text = (self.path / MANIFEST).read_text(encoding="utf-8")
            m = json.loads(text)
            wal, main = m["wal"], m["main"]
            self.manifest: Dict[str, Any] = m
            """The manifest as JSON, every key included."""
            self.version: int = int(m["version"])
            self.database: str = _path(m["database"], m.get("database_hex")) or ""
            """The database's full pathname as SQLite opened it (exact bytes when not UTF-8)."""
            self.trigger: str = m["trigger"]
            """`"halt"` (first refused write) or `"close"`."""
            self.reason: Optional[RetireReason] = (
                RetireReason(m["reason"]) if m.get("reason") else None
            )
            self.pid: int = int(m["pid"])
            self.captured_at: str = m["captured_at"]
            self.sqlite: str = m.get("sqlite", "")
            self.wal = WalEntry(
                identity=_file_id(wal["identity"]) or (0, 0),
                file=wal["file"],
                bytes=int(wal["bytes"]),
                sha256=wal["sha256"],
                header=dict(wal.get("header") or {}),
                frames=int(wal.get("frames", 0)),
                commits=int(wal.get("commits", 0)),
                last_commit_frame=wal.get("last_commit_frame"),
            )
            self.main = MainEntry(
                identity=_file_id(main["identity"]) or (0, 0),
                size=int(main.get("size", main["bytes"])),
                file=main["file"],
                bytes=int(main["bytes"]),
                sha256=main["sha256"],
                header=dict(main.get("header") or {}),
                mode=main.get("mode", "copied"),
            )
            shm = m.get("shm")
            self.shm: Optional[FileId] = _file_id(shm["identity"]) if shm else None
            generation = m.get("path_generation_at_capture") or {}
            self.path_generation_at_capture: Dict[str, Any] = dict(generation)
            backfill = m.get("backfill_at_loss")
            self.backfill_at_loss: Optional[Backfill] = Backfill(**backfill) if backfill else None
            self.main_torn: bool = bool(m.get("main_torn", False))
            base = m.get("base") or {}
            self.base: str = str(base.get("verdict", "unknown"))
            """Whether the main image is the one the WAL generation was written on: `own`,
            `not-own` or `unknown` (absent in a capture older than the base verdict: `unknown`). Only
            from an `own` capture does `recover` replay changes and deletions."""
            self.base_evidence: str = str(base.get("evidence", ""))
        except (OSError, ValueError, KeyError, TypeError) as e:
            hint = _how_to_open(self.path)
            raise CaptureFormatError(
                f"{self.path}: not a readable capture: {e}" + (f"; {hint}" if hint else "")
            ) from e

    def __repr__(self) -> str:
        return f"Capture({str(self.path)!r}, trigger={self.trigger!r}, commits={self.wal.commits})"

    @property
    def wal_file(self) -> Path:
        """The retired WAL in the capture."""
        return self.path / self.wal.file

    @property
    def main_file(self) -> Path:
        """The main image in the capture (see :attr:`has_main_image`)."""
        return self.path / self.main.file

    @property
    def has_main_image(self) -> bool:
        """Whether the capture holds the main image its WAL was written on. A stale WAL set aside
        at open (`reason` `stale-wal`, `main.mode` `absent`) does not: its frames only make
        sense on the main file they were written on, which :func:`recover` takes as `main`."""
        return self.main.mode != "absent"

    @property
    def heal(self) -> str:
        """What became of the generation at close (the capture's `healed.json`, resolved as the
        library does): `"not-healed"` (its rows are in the capture only, unless a merge brought
        them back), `"healed"` (checkpointed back into the live file at close: nothing to merge;
        also a heal interrupted after its commit point, whose WAL put back at the path SQLite
        replays — when the -wal it put back, or the main file, shows its bytes), or
        `"rolled-back"` (a heal interrupted before it touched the live file, or one whose staging
        file is gone with nothing in the live files showing it: the rows are in the capture
        only, and `recover` merges each once)."""
        try:
            record = json.loads((self.path / HEALED).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return "not-healed"
        except (OSError, ValueError) as e:
            raise CaptureFormatError(f"{self.path / HEALED}: unreadable heal record: {e}") from e
        put_back = record.get("put_back")
        if record.get("phase") == "done" or not put_back:
            return "healed"
        # The rule of `heal_state` in src/capture/healed.rs: the staging file still there (by its
        # inode, or holding the captured WAL's prefix byte for byte), beside the capture or at the
        # database's recorded path, means the heal never reached the live file; it reached it only
        # when the live files show it (the -wal it put back, or every page of its frames in the
        # main file); with neither, it reads rolled back (recover merges each row once).
        name = os.path.basename(self.database)
        dbs = [self.path.parent / name, Path(os.path.dirname(self.database) or ".") / name]
        dbs = list(dict.fromkeys(dbs))
        for db in dbs:
            staging = Path(str(db) + "-wal" + put_back["suffix"])
            try:
                st = os.stat(staging, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if _file_id(put_back["identity"]) == (st.st_dev, st.st_ino) or self._holds_wal_prefix(
                staging
            ):
                return "rolled-back"
        frames = int(record.get("frames") or 0)
        for db in dbs:
            if self._live_wal_shows(db, put_back, frames) or self._main_shows(db, frames):
                return "healed"
        return "rolled-back"

    def _page_size(self) -> int:
        with open(self.wal_file, "rb") as f:
            head = f.read(32)
        return int.from_bytes(head[8:12], "big") if len(head) == 32 else 0

    @staticmethod
    def _sha256_prefix(path: Path, length: int) -> Optional[str]:
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < length:
                    return None
                h = hashlib.sha256()
                left = length
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        return None
                    h.update(chunk)
                    left -= len(chunk)
                return h.hexdigest()
        except FileNotFoundError:
            return None

    def _live_wal_shows(self, db: Path, put_back: Dict[str, Any], frames: int) -> bool:
        """Whether `<db>-wal` begins with the bytes the heal put back."""
        length, want = put_back.get("bytes"), put_back.get("sha256")
        if length is None or want is None:
            page = self._page_size()
            if not page:
                return False
            length = 32 + frames * (24 + page)
            want = self._sha256_prefix(self.wal_file, length)
            if want is None:
                return False
        if length <= 32:
            return False
        got = self._sha256_prefix(Path(str(db) + "-wal"), int(length))
        return got is not None and got == str(want).lower()

    def _main_shows(self, db: Path, frames: int) -> bool:
        """Whether the main file holds every page the heal's frames wrote, as the last of them."""
        page = self._page_size()
        if not page or frames <= 0:
            return False
        last: Dict[int, int] = {}
        try:
            with open(self.wal_file, "rb") as wal, open(db, "rb") as main:
                for i in range(frames):
                    at = 32 + i * (24 + page)
                    wal.seek(at)
                    head = wal.read(4)
                    if len(head) < 4:
                        return False
                    last[int.from_bytes(head, "big")] = at
                if not last or 0 in last:
                    return False
                for pgno, at in last.items():
                    wal.seek(at + 24)
                    main.seek((pgno - 1) * page)
                    if wal.read(page) != main.read(page):
                        return False
        except FileNotFoundError:
            return False
        return True

    def _holds_wal_prefix(self, staging: Path) -> bool:
        """Whether `staging` holds a prefix of the captured WAL (its header at least)."""
        size = staging.stat().st_size
        if size < 32 or size > self.wal_file.stat().st_size:
            return False
        with open(staging, "rb") as a, open(self.wal_file, "rb") as b:
            while size > 0:
                chunk = a.read(min(size, 1 << 20))
                if not chunk or chunk != b.read(len(chunk)):
                    return False
                size -= len(chunk)
        return True

    @property
    def healed(self) -> bool:
        """Whether the generation's rows are in the live file through the heal at close (see
        :attr:`heal`): `recover` then merges nothing."""
        return self.heal == "healed"

    def files_match(self) -> bool:
        """Whether both files have the size and sha256 the manifest records (no SQLite
        involved; :meth:`verify` also opens the captured generation)."""
        files = [(self.wal_file, self.wal.bytes, self.wal.sha256)]
        if self.has_main_image:
            files.append((self.main_file, self.main.bytes, self.main.sha256))
        return all(
            f.is_file() and f.stat().st_size == size and _sha256(f) == digest
            for f, size, digest in files
        )

    def open_copy(self, directory: PathLike) -> sqlite3.Connection:
        """Copies the captured main image and WAL into `directory` (created; must not exist)
        and opens the copy through the stock `unix` VFS: the retired generation, every
        transaction its WAL committed, with nothing from the original path. The capture itself
        is never opened or changed."""
        if not self.has_main_image:
            raise CaptureFormatError(
                f"{self.path} holds no main image (a stale WAL set aside at open): its frames "
                f"only make sense on the main file they were written on; recover it with "
                f"hermes_guard.recover(capture, into, main=<that file>)"
            )
        target = Path(directory)
        target.mkdir(parents=True)
        shutil.copyfile(self.main_file, target / self.main.file)
        shutil.copyfile(self.wal_file, target / (self.main.file + "-wal"))
        uri = "file:" + _quote(str(target / self.main.file)) + "?vfs=unix"
        return sqlite3.connect(uri, uri=True)

    def verify(self) -> "VerifyResult":
        """`hermes-guard verify`: the files match the manifest and the captured generation
        passes `integrity_check`."""
        return verify(self.path)

    def recover(
        self,
        into: PathLike,
        apply: bool = False,
        take_capture: bool = False,
        main: Optional[PathLike] = None,
    ) -> "RecoverResult":
        """`hermes-guard recover`: the plan (or with `apply=True`, the merge) of this capture's
        missing rows into the live database `into` (`main`: see :func:`recover`). See
        `hermes-guard help recovery`."""
        return recover(self.path, into, apply=apply, take_capture=take_capture, main=main)


def _quote(path: str) -> str:
    import urllib.parse

    return urllib.parse.quote(os.fsencode(path))


def captures(database: PathLike) -> List[Capture]:
    """Runs `hermes-guard captures --json <database>`: the complete captures beside `database`
    (or every capture in the directory `database`), oldest first, each with what the CLI found
    (:attr:`Capture.verified`, :attr:`Capture.status`, :attr:`Capture.missing`). Interrupted
    `.partial` captures are left out (never used). Nothing is written.

    Raises :class:`BadInputError` when `database` does not exist or cannot be listed (the CLI's
    exit code 2), and :class:`UnreadableCapturesError` when a capture's manifest cannot be read
    (the CLI's exit code 1: it lists it `unreadable`); the readable captures are then in the
    error's `captures`. Rows still missing (the CLI's exit code 3) are each capture's
    :attr:`Capture.missing`."""
    done = _run_cli(["captures", "--json", os.fspath(database)])
    doc = _json_of(done, "captures")
    if done.returncode == 2 or isinstance(doc, dict):
        raise BadInputError(_error_of(done, doc))
    found: List[Capture] = []
    unreadable: Dict[Path, str] = {}
    for row in doc:
        path = Path(_path(row["capture"], row.get("capture_hex")) or row["capture"])
        if row.get("partial"):
            continue
        if "captured_at" not in row:  # its manifest cannot be read
            unreadable[path] = str(row.get("status", "unreadable"))
            continue
        try:
            capture = Capture(path)
        except CaptureFormatError as e:
            unreadable[path] = str(e)
            continue
        capture.verified = bool(row.get("verified", False))
        capture.status = str(row.get("status", ""))
        capture.missing = int(row["missing"]) if row.get("missing") is not None else None
        found.append(capture)
    if unreadable:
        raise UnreadableCapturesError(database, found, unreadable)
    return found


def cli_path() -> str:
    """The `hermes-guard` CLI carried in this package."""
    path = Path(__file__).resolve().parent / _CLI_FILE
    if not os.access(path, os.X_OK):
        found = shutil.which(_CLI_FILE)
        raise HermesGuardError(
            f"the package has no executable {path}: it was not built"
            + (f" ({found} on PATH may be a wrapper of this package)" if found else "")
            + " (install it with `pip install ./python` from the hermes-guard repository)"
        )
    return str(path)


@dataclass(frozen=True)
class VerifyResult:
    """What `hermes-guard verify --json` said."""

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class RecoverResult:
    """What `hermes-guard recover --json` said. `exit_code`: 0 done (merged, nothing to do, or
    a plan: read `missing`), 3 done as far as it could with something left over (unreadable
    commits, conflicts kept live, rows refused); see `hermes-guard help exit-codes`. Bad input
    (2) raises :class:`BadInputError`, a failure while working (1) :class:`HermesGuardError`:
    nothing was written."""

    exit_code: int
    report: Dict[str, Any]
    """The JSON report: `missing`, `inserted`, `left_over`, `tables`, ..."""

    @property
    def missing(self) -> int:
        return int(self.report.get("missing", 0))

    @property
    def inserted(self) -> int:
        return int(self.report.get("inserted", 0))

    @property
    def applied(self) -> bool:
        return bool(self.report.get("applied", False))

    @property
    def healed_at_close(self) -> Optional[str]:
        """Set when the capture's generation was healed into the live file at close: what its
        record says. Nothing was (or would be) merged."""
        healed = self.report.get("healed_at_close")
        return str(healed) if healed else None


def _run_cli(args: List[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, check=False)


def _error_of(done: "subprocess.CompletedProcess[str]", doc: Any) -> str:
    """The CLI's error message: from its JSON answer, else its stderr."""
    if isinstance(doc, dict) and doc.get("error"):
        return str(doc["error"])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[0].removeprefix("hermes-guard: ") if lines else f"exit code {done.returncode}"


def _json_of(done: "subprocess.CompletedProcess[str]", what: str) -> Any:
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise HermesGuardError(
            f"hermes-guard {what} exited with {done.returncode} without a JSON answer: "
            f"{done.stderr.strip() or done.stdout.strip()}"
        ) from None


def verify(capture: PathLike) -> VerifyResult:
    """Runs `hermes-guard verify --json <capture>`: ok only for a complete capture whose two
    files match `manifest.json` (size, sha256) and whose captured generation passes
    `PRAGMA integrity_check`; not ok (the CLI's exit code 1) for a capture that does not, with
    the reason (and, for a capture whose manifest cannot be read, how to open its files).
    Raises :class:`BadInputError` for a path that does not exist or is not a capture (exit 2).
    Nothing is written."""
    done = _run_cli(["verify", "--json", os.fspath(capture)])
    doc = _json_of(done, "verify")
    if done.returncode == 2:
        raise BadInputError(_error_of(done, doc))
    return VerifyResult(ok=bool(doc["ok"]), message=str(doc["message"]))


def recover(
    capture: PathLike,
    into: PathLike,
    apply: bool = False,
    take_capture: bool = False,
    main: Optional[PathLike] = None,
) -> RecoverResult:
    """Runs `hermes-guard recover --json <capture> --into <db>`: without `apply` the plan (no
    write), with it the merge of the capture's missing rows, in one transaction through the
    guard. `main` is the main file a stale WAL's frames were written on (`--main`), for a capture
    that holds no main image. Raises :class:`BadInputError` on bad input (exit 2) and
    :class:`HermesGuardError` on a failure while working (exit 1): nothing was written."""
    args = ["recover", "--json", os.fspath(capture), "--into", os.fspath(into)]
    if main is not None:
        args += ["--main", os.fspath(main)]
    if apply:
        args.append("--apply")
    if take_capture:
        args.append("--take-capture")
    done = _run_cli(args)
    doc = _json_of(done, "recover")
    if not doc.get("ok", False):
        error = BadInputError if done.returncode == 2 else HermesGuardError
        raise error(f"hermes-guard recover: {_error_of(done, doc)}; nothing was written")
    return RecoverResult(exit_code=done.returncode, report=doc)
