"""Runs of block numbers and chain keys as typed ``array``s that numpy reads in place.

The v1 prefix cache moves whole runs of a request's blocks at each event (a prompt's chained
keys, a hit, a fresh allocation, a block table, a release). As Python lists, every run
costs an int object per block when it is built and again when numpy reads it (``np.array``
of a list: about 25 ns a block, measured; a 1,000-block table ~25 us, several times per
request). Held as ``array("i")`` (block numbers) or ``array("q")`` (chain keys) they are
built from numpy in one copy (:func:`from_numpy`, :func:`arange`) and read by numpy without
a copy (:func:`view`, about 0.5 us whatever the length), while Python code still indexes,
slices, appends to and iterates over them as over a list (items come out as ``int``).

One rule with views: a numpy view pins its array's buffer (an ``array`` exporting it cannot
grow), so a view lives for one call and is never stored next to a table that grows.
"""

from __future__ import annotations

from array import array

import numpy as np

BLOCKS = "i"
"""Typecode of block numbers (32-bit, as the pools' refcounts and queues store them)."""
KEYS = "q"
"""Typecode of chain keys (64-bit: ``policies.indexes.key_chain`` numbers keys 0, 1, 2, ...)."""


def view(items: array) -> np.ndarray:
    """A numpy view of ``items`` (no copy; for the length of one call, see the module
    docstring)."""
    return np.frombuffer(items, dtype=items.typecode)


def index(items: array | list[int] | np.ndarray) -> np.ndarray:
    """``items`` as the index array numpy gathers and scatters with fastest (``intp``: an
    index of 32-bit or unsigned ints is converted again at every use, about 4x slower for
    a 1,000-block table, measured); a copy, so no view of ``items`` stays alive, except for
    an index array already (returned as it is: numpy owns it, and no caller writes to it)."""
    if type(items) is np.ndarray and items.dtype == np.intp:
        return items
    return np.array(items, dtype=np.intp)


def from_numpy(values: np.ndarray, typecode: str = BLOCKS) -> array:
    """``values`` as an ``array`` of ``typecode`` (one C-level copy, no int object per item)."""
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values, dtype=typecode).tobytes())
    return out


def arange(start: int, stop: int, typecode: str = BLOCKS) -> array:
    """``array(typecode, range(start, stop))`` at C speed (``array`` from a range reads it
    item by item: about 50 ns each)."""
    return from_numpy(np.arange(start, stop, dtype=typecode), typecode)


SHORT_RUN = 32
"""Runs of at most this many items are appended item by item (about 50 ns each), longer ones
through numpy (a few microseconds a call)."""


def extend_run(out: array, start: int, stop: int) -> None:
    """Append ``start, start + 1, ..., stop - 1`` to ``out``."""
    if stop - start <= SHORT_RUN:
        out.extend(range(start, stop))
    else:
        out.frombytes(np.arange(start, stop, dtype=out.typecode).tobytes())

