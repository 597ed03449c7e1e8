"""A binary copy of a parsed operator profile, so a large one loads in milliseconds.

An imported profile is a YAML file of about a megabyte (160,000 measured times): parsing it
takes most of a second with libyaml and several with PyYAML's pure-Python parser, reading
this copy a few hundredths (``benchmarks/profile_load.py`` measures the three). The copy
holds exactly the data the YAML parser returned, so the profile read from it is the same,
and it is checked by the same reader (``operator_profile``) as the YAML.

Keyed by the source's bytes: the copy records the SHA-256 of the YAML it was made from and is
used only while the YAML still has those bytes; otherwise the YAML is parsed again and the
copy rewritten. A copy that is unreadable, truncated or from another format version is
ignored the same way.

Where the copy goes (kvsim never writes over a file it did not create, and never into the
user's folders uninvited):

- beside the profile, as ``<profile file name>.kvsim-cache``, when kvsim wrote that profile
  (``kvsim calibrate --import``: the profile is listed, unchanged, in its folder's
  ``.kvsim-files``, or lies in a folder kvsim made; ``simulator.outputs``), by the same rule,
  so a file of that name kvsim did not write is never replaced; never beside the profiles
  kvsim ships (``gpu_validation/profiles`` is package data, installed read-only or not);
- otherwise, only when the user names a cache folder (``$KVSIM_CACHE_DIR``: kvsim writes only
  where it is asked to), there, under ``operator-profiles/<sha256>.kvsim-cache`` (a folder kvsim
  marks as its own);
- otherwise nowhere: the profile is kept in memory for the process (``operator_profile``'s own
  cache) and parsed again next time (the shipped profiles: under a second with libyaml).

Profiles under :data:`MIN_BYTES` are not copied: they parse in well under 0.1 s.

Format: one line ``kvsim operator profile cache 1``, one line with the source's SHA-256, one
line with the length of a JSON header; the header (the data's tree, each long list of numbers
replaced by a reference to an array, and the arrays' type codes, lengths and byte order); then
the arrays' bytes (an attention grid written sparse, ``operator_profile``'s ``points``, is five
such lists: four integer columns and the times). Plain Python (``array``, ``json``): no numpy, no pickle (a cache file is
only ever read as data).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from array import array
from pathlib import Path
from typing import Any

from kvsim.simulator.outputs import (
    OutputError,
    atomic_write,
    claim_folder,
    is_kvsim_file,
    write_file,
)

MAGIC = b"kvsim operator profile cache 1\n"
SUFFIX = ".kvsim-cache"
MIN_BYTES = 256 * 1024
"""Profiles smaller than this (the shipped ones) are not copied to disk."""
_MIN_ARRAY = 8  # shorter lists stay in the JSON header


def source_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def user_cache_dir() -> Path | None:
    """``$KVSIM_CACHE_DIR`` (None: not set, no cache folder)."""
    return Path(os.environ["KVSIM_CACHE_DIR"]) if os.environ.get("KVSIM_CACHE_DIR") else None


def beside(profile: Path) -> Path:
    return profile.with_name(profile.name + SUFFIX)


def in_user_cache(digest: str) -> Path | None:
    folder = user_cache_dir()
    return None if folder is None else folder / "operator-profiles" / f"{digest}{SUFFIX}"


# --- encoding ------------------------------------------------------------------------------------


def encode(data: Any) -> bytes:
    """The cache file's bytes after its first two lines (see the module docstring)."""
    arrays: list[array] = []

    def enc(x: Any) -> Any:
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"$map": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, list):
            if len(x) >= _MIN_ARRAY and all(type(v) is int for v in x):
                try:
                    arrays.append(array("q", x))
                    return {"$q": len(arrays) - 1}
                except OverflowError:
                    pass
            if len(x) >= _MIN_ARRAY and all(v is None or (type(v) is float and not math.isnan(v)) for v in x):
                arrays.append(array("d", [math.nan if v is None else v for v in x]))
                return {"$d": len(arrays) - 1}  # NaN stands for None (a real NaN is never here)
            return [enc(v) for v in x]
        return x

    header = json.dumps({"tree": enc(data), "byteorder": sys.byteorder,
                         "arrays": [[a.typecode, len(a)] for a in arrays]}, allow_nan=False).encode()
    return b"%d\n" % len(header) + header + b"".join(a.tobytes() for a in arrays)


def decode(body: bytes) -> Any:
    """The data :func:`encode` was given; ValueError (or KeyError, IndexError) if malformed."""
    line, _, rest = body.partition(b"\n")
    n = int(line)
    header = json.loads(rest[:n])
    offset, arrays = n, []
    for typecode, length in header["arrays"]:
        if typecode not in ("q", "d"):
            raise ValueError(f"unknown array type {typecode!r}")
        a = array(typecode)
        size = a.itemsize * int(length)
        chunk = rest[offset:offset + size]
        if len(chunk) != size:
            raise ValueError("truncated")
        a.frombytes(chunk)
        if header["byteorder"] != sys.byteorder:
            a.byteswap()
        arrays.append(a)
        offset += size

    def dec(x: Any) -> Any:
        if isinstance(x, dict):
            if "$q" in x:
                return arrays[x["$q"]].tolist()
            if "$d" in x:
                return [None if v != v else v for v in arrays[x["$d"]].tolist()]
            if "$map" in x:
                return {dec(k): dec(v) for k, v in x["$map"]}
            return {k: dec(v) for k, v in x.items()}
        if isinstance(x, list):
            return [dec(v) for v in x]
        return x

    return dec(header["tree"])


# --- reading and writing -------------------------------------------------------------------------


def load(profile: Path, digest: str) -> Any | None:
    """The cached data of ``profile`` whose YAML has SHA-256 ``digest``, or None (no copy, a
    stale one, or one that cannot be read)."""
    for path in (beside(profile), in_user_cache(digest)):
        if path is None:
            continue
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        head = MAGIC + digest.encode() + b"\n"
        if not raw.startswith(head):
            continue
        try:
            return decode(raw[len(head):])
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return None


def store(profile: Path, digest: str, data: Any, size: int, package_data: bool = False) -> Path | None:
    """Write the binary copy of ``data`` (parsed from ``profile``'s ``size`` bytes of YAML with
    SHA-256 ``digest``) where the module docstring says; return where, or None.
    ``package_data``: the profile is one kvsim ships (its copy never goes beside it)."""
    if size < MIN_BYTES:
        return None
    content = MAGIC + digest.encode() + b"\n" + encode(data)
    try:
        if not package_data and is_kvsim_file(profile):
            target = beside(profile)
            with write_file(target) as tmp:
                tmp.write_bytes(content)
            return target
    except (OSError, OutputError):
        pass  # beside it is not possible: the user's cache folder, then
    target = in_user_cache(digest)
    if target is None:
        return None
    try:
        target.parent.parent.mkdir(parents=True, exist_ok=True)
        claim_folder(target.parent)
        with atomic_write(target) as tmp:
            tmp.write_bytes(content)
        return target
    except (OSError, OutputError):
        return None
