"""The one rule for everything kvsim writes (run, sweep, plot, reproduce, validate,
trace plot, calibrate --import):

1. **Only inside the folder asked for.** Every name kvsim makes a file or folder from (``--run``,
   ``--name``, an experiment's or a profile's ``name``) is a plain slug (:func:`check_name`):
   never empty, never ``.``/``..``, hidden or holding a separator, so the output lands
   directly in the folder the user gave.
2. **Only what kvsim marked as its own is replaced.**

   - A *kvsim folder* holds the marker file ``.kvsim-run``. kvsim creates every output folder
     with it (:func:`claim_folder`, :func:`atomic_dir`) and adds or replaces files only in
     such folders; an existing folder without it is the user's and is refused, unless it is
     empty (nothing to lose: ``mkdir out; kvsim ... --out out`` works).
   - A *loose file* (a plot or a profile written into any folder) is kvsim's when that
     folder's ``.kvsim-files`` lists it with the SHA-256 of its current bytes (the format of
     ``sha256sum``). A file the user made, or edited since, is theirs and is refused.

3. **Only once the new output is complete.** It is written under a temporary name in the
   same folder and renamed over the old one (:func:`atomic_write`, :func:`atomic_dir`): a
   reader sees the old output or the new, never half, and a failed write leaves the old.

Anything in the way is an :class:`OutputError`, one line naming the path, raised before any
work is done and checked again just before the rename; nothing is touched. ::

    OUT/                  the user's folder: kvsim adds names here, replaces none it did not list
      .kvsim-files        "<sha256>  trace.png", one line per loose file kvsim wrote here
      trace.png
      notes.txt           the user's: never touched
      block-size/         a kvsim folder (a sweep): kvsim replaces its files
        .kvsim-run
        sweep.csv  runs/...

Plain Python (no numpy, pandas or pydantic): the profile importers use it too.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A safe name: letters, digits, '.', '_', '-', starting with a letter or digit (so never
'.', '..' or hidden), no separators, at most 128 characters."""

NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters"

MARKER = ".kvsim-run"
"""File in every folder kvsim writes: the proof that kvsim may replace the folder's contents."""
MARKER_TEXT = "written by kvsim; kvsim replaces this folder when the same output is written again\n"

MANIFEST = ".kvsim-files"
"""In a folder that is not kvsim's: the loose files kvsim wrote there, with their SHA-256."""


class OutputError(Exception):
    """An output that cannot be written, or would replace something not kvsim's; one line."""


def check_name(value: str, what: str) -> str:
    """Return ``value`` if it is a safe name for a file or folder (a slash or '..' would write,
    or replace, elsewhere); else ValueError saying what is allowed."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a plain folder name: use {NAME_RULE}")
    return value


# --- what is kvsim's -----------------------------------------------------------------------------


def is_kvsim_folder(path: Path) -> bool:
    """True for a real folder (not a link) holding kvsim's marker file."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(folder: Path) -> dict[str, str]:
    """``.kvsim-files`` of ``folder``: name -> SHA-256 (empty when there is none)."""
    try:
        lines = (folder / MANIFEST).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines) if name}


def is_kvsim_file(path: Path) -> bool:
    """True for a real file kvsim wrote: in a kvsim folder, or listed with its current bytes in
    its folder's ``.kvsim-files``."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return False
    return is_kvsim_folder(path.parent) or _manifest(path.parent).get(path.name) == _sha256(path)


def _refuse(path: Path, what: str, mark: str) -> OutputError:
    return OutputError(f"{path}: exists and was not written by kvsim (kvsim replaces only {what} it "
                       f"marked: {mark}): remove it yourself, or choose another name or output folder")


def _is_empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def check_replaceable(folder: Path) -> None:
    """Raise OutputError unless output folder ``folder`` is absent, empty or a kvsim folder."""
    folder = Path(folder)
    if (folder.exists() or folder.is_symlink()) and not (is_kvsim_folder(folder) or _is_empty_folder(folder)):
        raise _refuse(folder, "folders", f"it has no {MARKER} marker; outputs from before kvsim "
                      "marked them have none")


def check_file(path: Path) -> None:
    """Raise OutputError unless loose output file ``path`` is absent or kvsim's."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not is_kvsim_file(path):
        raise _refuse(path, "files", f"listed, unchanged since, in {MANIFEST} beside them")


def check_writable(folder: Path) -> None:
    """Before long work: make ``folder``'s parent, prove a file can be created there and that
    ``folder`` may be replaced, so the work never ends in a write error."""
    folder = Path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder.parent):
            pass
    except OSError as e:
        where = e.filename or folder.parent
        raise OutputError(f"{where}: cannot write results here ({e.strerror or e})") from None
    check_replaceable(folder)


# --- writing -------------------------------------------------------------------------------------


def claim_folder(folder: Path) -> Path:
    """Make ``folder`` a kvsim folder to write into, file by file: create it with the marker
    (atomically: concurrent sweeps into one folder may claim it together), or accept it if it
    is one already; an existing folder of the user's is an OutputError (an empty one gets the
    marker)."""
    folder = Path(folder)
    check_writable(folder)
    if is_kvsim_folder(folder):
        return folder
    if _is_empty_folder(folder):
        (folder / MARKER).write_text(MARKER_TEXT)
        return folder
    new = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    new.chmod(0o755)  # mkdtemp makes it private; results are for everyone who can read the folder
    (new / MARKER).write_text(MARKER_TEXT)
    try:
        new.rename(folder)  # fails if anything appeared there meanwhile
    except OSError:
        shutil.rmtree(new, ignore_errors=True)  # made above: ours
        check_replaceable(folder)  # another kvsim claimed it first: fine; anything else: refused
    return folder


def _tmp_name(path: Path) -> Path:
    """A temporary name beside ``path``, private to this process (two sweeps into one folder
    write the same tables at once), with ``path``'s suffix (matplotlib reads the format there)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")


@contextmanager
def atomic_write(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on success it replaces ``path``, on
    failure it is removed. The caller has made sure ``path`` may be replaced (it lies in a
    folder it claimed, or :func:`write_file` checked it)."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def write_file(path: Path) -> Iterator[Path]:
    """Write loose file ``path`` in an existing folder: refused (OutputError) if a file of the
    user's is there; else yield a temporary path, rename it over ``path`` once written, and list it in the
    folder's ``.kvsim-files`` (unless the folder is kvsim's)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OutputError(f"{path.parent}: no such folder (to write {path.name} in)")
    check_file(path)
    with atomic_write(path) as tmp:
        yield tmp
        check_file(path)  # again: something may have appeared while we wrote
    if not is_kvsim_folder(path.parent):
        with _folder_locked(path.parent):  # two writers in one folder: neither loses the other's line
            listed = {**_manifest(path.parent), path.name: _sha256(path)}
            with atomic_write(path.parent / MANIFEST) as tmp:
                tmp.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(listed.items())))


@contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``folder`` itself, so that no lock file is
    added to the user's folder; the kernel drops it if the process dies. No-op without fcntl."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


@contextmanager
def atomic_dir(folder: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``folder``; on success it replaces ``folder``, on failure
    it is removed: readers see the old folder or the new, never half.

    The new folder gets the marker file. An old ``folder`` is replaced only if it holds the
    marker (else OutputError, and nothing is touched), and only after the new one is complete:
    it is renamed aside, the new one renamed in, then the old one removed.
    """
    folder = Path(folder)
    check_writable(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; results are for everyone who can read the folder
    try:
        yield tmp
        (tmp / MARKER).write_text(MARKER_TEXT)
        check_replaceable(folder)  # again: something may have appeared while we worked
        holder = None  # a private folder the old output waits in until the new one is in place
        if is_kvsim_folder(folder):
            holder = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, holder / "old")
        try:
            os.replace(tmp, folder)
        except BaseException:
            if holder is not None:  # put the old output back
                os.replace(holder / "old", folder)
                holder.rmdir()
            raise
        if holder is not None:
            shutil.rmtree(holder, ignore_errors=True)  # the old output (marked: ours) and its holder
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # made by mkdtemp above: ours
        raise


__all__ = [
    "MANIFEST",
    "MARKER",
    "NAME_PATTERN",
    "NAME_RULE",
    "OutputError",
    "atomic_dir",
    "atomic_write",
    "check_file",
    "check_name",
    "check_replaceable",
    "check_writable",
    "claim_folder",
    "is_kvsim_file",
    "is_kvsim_folder",
    "write_file",
]
