"""A dict whose small non-negative int keys live in one array: a prefix cache's index without
an entry object per block.

The v1 prefix cache indexes both ways, content key -> the block caching it and block -> its
key, and almost every key of both is a small non-negative int: a block number (below the
pool's size) or an interned chain key (``policies.indexes.key_chain``: 0, 1, 2, ... in the order
first seen). As dicts, the Mooncake synthetic trace's 1.4M cached blocks of 16 tokens cost
two entries and two int objects per block (about 160 MB) and a hash insert each.
:class:`DenseMap` keeps those values in an ``array`` indexed by the key::

    _arr:    [ 7, -1, 12, -2, -1, ... ]     slot k (32 bits): key k's value; -1 absent
    _boxed:  {3: ("u", 9, 4)}               slot -2: key k's value is not a small int
    _other:  {("u", 9, 5): 40}              keys that are not small ints (a request's
                                            private blocks)

so an entry costs 4 bytes, and a whole run of keys is looked up, stored or removed by
C-level ``map`` calls over the array (``leading``, ``put_ints``, ``pop_many``): the work
per block is C's. One key at a time it behaves as a ``dict`` (``get``, ``[]``, ``in``,
``pop``, ``len``, iteration in no particular order), so a plain loop over it reads as over
a dict; the tests compare it with one.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import repeat

import numpy as np

from kvsim.policies.accel.int_runs import BLOCKS, from_numpy, index

ABSENT = -1
BOXED = -2
MAX_VALUE = 2**31 - 1
"""Slots are 32-bit ints: block numbers and chain keys stay far below (a KeyChain of 2**31
keys would hold tens of GB of contents)."""
_MISSING = object()
NUMPY_RUN = 128
"""Runs of more keys than this go through numpy, shorter ones through C-level ``map``
(measured on the Mooncake and multi-turn bench cases)."""


def _small(key: object) -> bool:
    """Whether ``key`` indexes the array, or a value is stored in it: a non-negative int (not
    a bool) below ``MAX_VALUE``."""
    return type(key) is int and 0 <= key <= MAX_VALUE


class DenseMap:
    """A mapping, fast and compact for small non-negative int keys (module docstring).
    ``size``: the keys expected below it (the array grows by doubling past it)."""

    __slots__ = ("_arr", "_boxed", "_other", "_n")

    def __init__(self, size: int = 0):
        self._arr = array("i", [ABSENT]) * size
        self._boxed: dict[int, Hashable] = {}
        self._other: dict[Hashable, Hashable] = {}
        self._n = 0  # slots of _arr that are not ABSENT

    def _view(self) -> np.ndarray:
        """A numpy view of ``_arr`` (made per call: the array may be replaced as it grows)."""
        return np.frombuffer(self._arr, dtype=np.int32) if len(self._arr) else np.zeros(0, np.int32)

    def _grow(self, top: int) -> None:
        """Make slot ``top`` exist."""
        size = len(self._arr)
        if top >= size:  # a new array (one exporting its buffer to a numpy view cannot resize)
            grown = array("i", [ABSENT]) * max(top + 1, 2 * size)
            grown[:size] = self._arr
            self._arr = grown

    # --- one key at a time, as a dict -----------------------------------------------------
    def __len__(self) -> int:
        return self._n + len(self._other)

    def __bool__(self) -> bool:
        return bool(self._n or self._other)

    def __contains__(self, key: object) -> bool:
        if _small(key):
            return key < len(self._arr) and self._arr[key] != ABSENT
        return key in self._other

    def get(self, key: Hashable, default=None):
        if _small(key):
            if key >= len(self._arr):
                return default
            v = self._arr[key]
            if v == ABSENT:
                return default
            return self._boxed[key] if v == BOXED else v
        return self._other.get(key, default)

    def __getitem__(self, key: Hashable):
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __setitem__(self, key: Hashable, value: Hashable) -> None:
        if not _small(key):
            self._other[key] = value
            return
        self._grow(key)
        old = self._arr[key]
        if old == ABSENT:
            self._n += 1
        elif old == BOXED:
            del self._boxed[key]
        if _small(value):
            self._arr[key] = value
        else:
            self._arr[key] = BOXED
            self._boxed[key] = value

    def pop(self, key: Hashable, default=_MISSING):
        v = self.get(key, _MISSING)
        if v is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        if _small(key):
            if self._arr[key] == BOXED:
                del self._boxed[key]
            self._arr[key] = ABSENT
            self._n -= 1
        else:
            del self._other[key]
        return v

    def __delitem__(self, key: Hashable) -> None:
        self.pop(key)

    def update(self, pairs: Iterable[tuple[Hashable, Hashable]]) -> None:
        for key, value in pairs:
            self[key] = value

    def __iter__(self) -> Iterator[Hashable]:
        yield from np.flatnonzero(self._view() != ABSENT).tolist()
        yield from list(self._other)

    def items(self) -> Iterator[tuple[Hashable, Hashable]]:
        for key in self:
            yield key, self[key]

    def keys(self) -> set:
        """The keys, as a set (for comparisons in checks)."""
        return set(self)

    def __repr__(self) -> str:
        return f"DenseMap({dict(self.items())!r})"

    # --- whole runs at a time ---------------------------------------------------------------
    # ``map`` over the array's own ``__getitem__`` / ``__setitem__`` runs at C speed (about
    # 30 ns a key, no Python frame): for runs of up to hundreds of blocks, faster than
    # numpy's fixed cost per call (about ten calls of a few microseconds); longer runs
    # (``NUMPY_RUN``) go through numpy on a view of the array (a few ns a key).

    def _cover(self, keys: list[int]) -> None:
        """Make a slot for every one of ``keys`` (small ints), so that C-level reads of them
        need no bounds check (absent slots read ``ABSENT``)."""
        top = max(keys)
        if top >= len(self._arr):
            self._grow(top)

    def _read(self, keys: list[int]) -> list[int]:
        """The slots of ``keys`` (small ints; beyond the array: ``ABSENT``), at C speed."""
        try:
            return list(map(self._arr.__getitem__, keys))
        except IndexError:  # a key beyond the array: make room, once
            self._cover(keys)
            return list(map(self._arr.__getitem__, keys))

    def _gather(self, k: np.ndarray) -> np.ndarray:
        """The slots of the keys ``k`` (small ints), the array grown to hold them first if
        one lies beyond it (absent slots read ``ABSENT``)."""
        try:
            return self._view()[k]
        except IndexError:
            self._grow(int(k.max()))
            return self._view()[k]

    def leading(self, keys: Sequence[int]) -> array:
        """The values of the longest leading run of ``keys`` (small ints, a list or an
        ``array``) that are present with small int values, as an ``array`` of 32-bit ints
        (``policies.accel.int_runs``): a prefix lookup stops at the first miss. Read in strides
        that double, so a miss wastes at most as many reads as hit before it."""
        hits = array(BLOCKS)
        if not len(keys):
            return hits
        if len(keys) > NUMPY_RUN:
            got = self._gather(index(keys))
            missing = got < 0
            return from_numpy(got[:int(np.argmax(missing))] if missing.any() else got)
        read = self._read
        start, stride = 0, 32
        while start < len(keys):
            part = read(keys[start:start + stride])
            if min(part) < 0:
                for v in part:
                    if v < 0:
                        break
                    hits.append(v)
                return hits
            hits.extend(part)
            start += stride
            stride *= 2
        return hits

    def put_ints(self, keys: Sequence[int], values: Sequence[int]) -> bool:
        """``self[k] = v`` for each pair of small int keys and small int values (a run just
        registered; lists or ``array``s) if none of ``keys`` is present; else nothing, and
        False. The keys must be distinct (one chain's positions, one table's blocks)."""
        n = len(keys)
        if not n:
            return True
        if n > NUMPY_RUN:  # (an ``array`` reaches numpy without a copy: policies.accel.int_runs)
            k = index(keys)
            if (self._gather(k) != ABSENT).any():
                return False
            self._view()[k] = np.asarray(values)  # (values are stored, not an index: any int type)
            self._n += n
            return True
        if self._read(keys).count(ABSENT) != n:
            return False
        deque(map(self._arr.__setitem__, keys, values), maxlen=0)
        self._n += n
        return True

    def put_absent_ints(self, keys: Sequence[int], values: Sequence[int]) -> None:
        """``put_ints`` for small int keys the caller knows are absent and distinct (the
        blocks of a run just filled name nothing yet): the same writes, no slot read first."""
        n = len(keys)
        if not n:
            return
        if n > NUMPY_RUN:
            k = index(keys)
            self._grow(int(k.max()))
            self._view()[k] = np.asarray(values)
        else:
            self._cover(keys)
            deque(map(self._arr.__setitem__, keys, values), maxlen=0)
        self._n += n

    def put_others(self, keys: list[Hashable], values: Sequence[int]) -> bool:
        """``self[k] = v`` for each pair, where no key is a small int (a request's own blocks'
        identities), if none of ``keys`` is present; else nothing, and False. At C speed: one
        disjointness check and one ``dict.update``, no Python call per key."""
        if not self._other.keys().isdisjoint(keys):
            return False
        self._other.update(zip(keys, values))
        return True

    def put_absent_boxed(self, keys: Sequence[int], values: list[Hashable]) -> None:
        """``self[k] = v`` for small int keys the caller knows are absent and distinct (the
        blocks of a run just filled) and values that are not small ints (identities of a
        request's own blocks): no slot read first, one ``dict.update``."""
        if len(keys):
            self._cover(keys)
        deque(map(self._arr.__setitem__, keys, repeat(BOXED)), maxlen=0)
        self._boxed.update(zip(keys, values))
        self._n += len(keys)

    def pop_many(self, keys: list[int]) -> list[Hashable]:
        """Remove those of ``keys`` (distinct small ints) that are present; return their
        values, in the order of ``keys``."""
        if not self._n or not len(keys):
            return []
        if len(keys) == 1:  # one block taken (a decode step's new block): no lists
            v = self.pop(keys[0], None)
            return [] if v is None else [v]
        if len(keys) > NUMPY_RUN:
            k = index(keys)
            present = self._gather(k) != ABSENT
            if not present.any():
                return []
            keys = k[present].tolist()  # few: the blocks taken that held cached content
        got = self._read(keys)
        absent = got.count(ABSENT)
        if absent == len(got):
            return []
        deque(map(self._arr.__setitem__, keys, repeat(ABSENT)), maxlen=0)
        self._n -= len(got) - absent
        if not self._boxed or BOXED not in got:
            return [v for v in got if v != ABSENT] if absent else got
        boxed = self._boxed
        return [boxed.pop(k) if v == BOXED else v for k, v in zip(keys, got) if v != ABSENT]

    def delete_many(self, keys: list[Hashable]) -> None:
        """``del self[k]`` for each of ``keys`` (present, distinct: the contents a run of
        taken blocks held), without a method call per key."""
        if not self._other and not self._boxed:  # all present keys are small ints: at C speed
            try:
                got = self._read(keys)
            except TypeError:  # a key that is not an int: not present
                got = [ABSENT]
            if ABSENT in got:
                raise KeyError(keys[got.index(ABSENT)] if len(got) == len(keys) else keys)
            deque(map(self._arr.__setitem__, keys, repeat(ABSENT)), maxlen=0)
            self._n -= len(keys)
            return
        arr, boxed, other = self._arr, self._boxed, self._other
        size = len(arr)
        for key in keys:
            if type(key) is int and 0 <= key < size and arr[key] != ABSENT:
                if arr[key] == BOXED:
                    del boxed[key]
                arr[key] = ABSENT
                self._n -= 1
            else:
                del other[key]  # a KeyError names a key that is not present
