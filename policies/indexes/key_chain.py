"""Chained block identities, interned, walked a run at a time instead of a block at a time.

A prefix cache names a full block by (its parent's identity, its own content): two prompts
share block j exactly when they agree on every block up to j. The paged allocators intern
these pairs into small integers in one dict, ``chain``::

    chain[(parent key, content)] = key        key = len(chain) when first seen; parent -1
                                              for a prompt's first block

Walking a prompt block by block costs a tuple, a dict lookup and an append per block in
Python, and the dict holds every block ever seen (the Mooncake synthetic trace's 61M prompt
tokens are 3.8M blocks of 16; 1.4M distinct). :class:`KeyChain` gives the same keys with
Python work per *run* of blocks, from two facts:

- **A miss ends the walk.** A key created now has never been a parent, so every block
  after a prompt's first unseen block is unseen too: the tail gets the next consecutive
  integers at once.
- **Runs are consecutive.** A tail's keys are consecutive, each the parent of the next. So
  key ``k``'s child ``k + 1`` needs no dict entry: unless ``k + 1`` is a branch (below), it
  is ``k + 1`` exactly when ``content_of[k + 1]`` (indexed by key) is the content.
  Only the first key of a tail that does not follow its parent (a branch) is entered in a
  dict, ``branches``, and in ``starts`` (the branch keys, increasing): every key between
  two branch keys is the child of the key before it, so the run through key ``k`` ends
  before the first branch key above ``k`` (one bisection). A walk guesses that the run
  goes on and checks a whole stride of contents with a C-level slice comparison; the first
  wrong guess (found by bisecting) is where the chain leaves the run, and one dict lookup
  says where it goes on, if anywhere. Strides double while guesses hold, so a run of
  ``m`` blocks costs ``O(log m)`` Python steps. (No key's parent is stored: a branch's is
  in its dict entry, every other key's is the key before it.)

The keys are exactly those of the block-by-block walk over one dict (:func:`chain_keys_plain`,
the definition, for the tests): key ``n`` is the ``n``-th distinct (parent, content) pair.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Hashable, Sequence

from kvsim.policies.accel.int_runs import KEYS, extend_run
from kvsim.policies.indexes.token_blocks import TokenBlocks

Contents = array | TokenBlocks | list
"""The kinds a run of contents is held as (:meth:`KeyChain._same_kind`)."""

FIRST_STRIDE = 128
"""Blocks guessed at once after a run starts (doubling while the guesses hold). A wrong guess
costs a C-level comparison of the stride and a bisection, so a long first stride is cheap;
from 16 to 128 the Mooncake trace at block 16 and the multi-turn bench each ran about 2% fewer
instructions (1,024 gained nothing more)."""


def chain_keys_plain(keys_of: dict[tuple, int], contents: Sequence[Hashable]) -> list[int]:
    """The block-by-block walk over one dict ``(parent key, content) -> key``, interning new
    pairs as it goes: the definition :class:`KeyChain` reproduces."""
    keys, parent = [], -1
    for content in contents:
        k = keys_of.get((parent, content))
        if k is None:
            k = keys_of[(parent, content)] = len(keys_of)
        keys.append(k)
        parent = k
    return keys


def _first_mismatch(got: list, want: list) -> int:
    """Index of the first difference of two equally long lists, or their length if none
    (bisection with C-level slice comparisons)."""
    if got == want:
        return len(got)
    lo, hi = 0, len(got)  # got[:lo] == want[:lo]; a difference lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if got[lo:mid] == want[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class KeyChain:
    """Interned chained block identities (module docstring): ``content_of[k]`` is key
    ``k``'s content; ``branches`` finds the keys that do not follow their parent, and
    ``starts`` lists them, increasing (``_starts`` holds the same keys, for membership).

    ``content_of`` is an ``array`` of 64-bit ints while every content is such an int (the
    Mooncake trace's hash-id blocks: 8 bytes a key instead of a list slot and an int
    object, 36 bytes; 1.3M keys at block 16), :class:`~policies.indexes.token_blocks.TokenBlocks`
    while every content is a token block of one width (a multi-turn trace's: the block's
    bytes, back to back, instead of a bytes object each), and a list otherwise (prefix ids,
    mixed kinds). Whichever it is, its slices compare at C speed."""

    __slots__ = ("content_of", "branches", "starts", "_starts", "_count")

    def __init__(self) -> None:
        self.content_of: Contents = array("q")
        self.branches: dict[tuple[int, Hashable], int] = {}
        self.starts: list[int] = []
        self._starts: set[int] = set()
        self._count = 0  # len(content_of), without a call (token blocks count in Python)

    def __len__(self) -> int:
        """Keys created so far (the next key is this number)."""
        return self._count

    def _child(self, parent: int, content: Hashable) -> int | None:
        """The key of ``(parent, content)`` if it exists."""
        k = parent + 1
        if k < self._count and k not in self._starts and self.content_of[k] == content:
            return k
        return self.branches.get((parent, content))

    def _same_kind(self, contents: Sequence[Hashable]) -> Contents:
        """``contents`` as the kind ``content_of`` is, so that slices of both compare: an
        int array, token blocks of one width (``policies.indexes.token_blocks``) or a list. The
        first contents decide; contents of another kind turn ``content_of`` into a list
        for good."""
        store = self.content_of
        if isinstance(contents, TokenBlocks):
            if isinstance(store, TokenBlocks) and store.width == contents.width:
                return contents
            if isinstance(store, array) and not store:  # the first contents: token blocks
                self.content_of = TokenBlocks(bytearray(), contents.width)
                return contents
            contents = list(contents)
        elif isinstance(contents, array) and contents.typecode == "q":
            if isinstance(store, array):
                return contents
            contents = contents.tolist()
        elif not isinstance(contents, list):
            contents = list(contents)  # an iterator is read once
        if isinstance(store, list):
            return contents
        if isinstance(store, array):
            try:
                return array("q", contents)
            except (TypeError, OverflowError):
                pass
        self.content_of = list(store)
        return contents

    def _run_stop(self, key: int) -> int:
        """The first key after ``key`` that is not its run's next (a branch key or the
        next key to create): keys ``key + 1 ..`` below it each follow the one before."""
        starts = self.starts
        at = bisect_right(starts, key)
        return starts[at] if at < len(starts) else self._count

    def keys(self, contents: Sequence[Hashable]) -> array:
        """The chained keys of ``contents`` (a prompt's leading full blocks), creating the
        unseen ones: the keys :func:`chain_keys_plain` gives, as an ``array`` of 64-bit ints
        (``policies.accel.int_runs``), built a run of consecutive keys at a time."""
        contents = self._same_kind(contents)
        content_of = self.content_of
        # token blocks compare a run as raw bytes (no block objects): j blocks = j * w bytes
        w = content_of.width if isinstance(content_of, TokenBlocks) else 0
        n = len(contents)
        keys = array(KEYS)
        parent, i = -1, 0
        while i < n:
            k = self._child(parent, contents[i])
            if k is None:
                break
            keys.append(k)
            parent, i, stride = k, i + 1, FIRST_STRIDE
            stop = self._run_stop(k)
            while i < n:  # guess that the run goes on: parent+1, parent+2, ... up to stop
                m = min(stride, n - i, stop - parent - 1)
                if m <= 0:
                    break
                lo = parent + 1
                if w:
                    j = _first_mismatch(content_of.data[lo * w:(lo + m) * w],
                                        contents.data[i * w:(i + m) * w]) // w
                else:
                    j = _first_mismatch(content_of[lo:lo + m], contents[i:i + m])
                if j:
                    extend_run(keys, lo, lo + j)
                    parent, i = parent + j, i + j
                if j < m:
                    break  # block i leaves the run: a branch, or a miss
                stride *= 2
        if i < n:  # every block from the first miss on is new: consecutive keys
            start = self._count
            if start != parent + 1:
                self.branches[(parent, contents[i])] = start
                self.starts.append(start)
                self._starts.add(start)
            content_of += contents[i:]
            self._count += n - i
            extend_run(keys, start, start + n - i)
        return keys
