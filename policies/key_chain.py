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
  key ``k``'s child ``k + 1`` needs no dict entry: it is found by comparing
  ``parent_of[k + 1]`` and ``content_of[k + 1]`` (two lists indexed by key). Only the first
  key of a tail that does not follow its parent (a branch) is entered in a dict,
  ``branches``. A walk guesses that the run goes on and checks a whole stride of guesses
  with C-level slice comparisons; the first wrong guess (found by bisecting) is where the
  chain leaves the run, and one dict lookup says where it goes on, if anywhere. Strides
  double while guesses hold, so a run of ``m`` blocks costs ``O(log m)`` Python steps.

The keys are exactly those of the block-by-block walk over one dict (:func:`chain_keys_plain`,
the definition, for the tests): key ``n`` is the ``n``-th distinct (parent, content) pair.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

FIRST_STRIDE = 16
"""Blocks guessed at once after a run starts (doubling while the guesses hold)."""


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
    """Interned chained block identities (module docstring): ``parent_of[k]`` and
    ``content_of[k]`` name key ``k``'s pair; ``branches`` finds the keys that do not
    follow their parent."""

    __slots__ = ("parent_of", "content_of", "branches")

    def __init__(self) -> None:
        self.parent_of: list[int] = []
        self.content_of: list[Hashable] = []
        self.branches: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        """Keys created so far (the next key is this number)."""
        return len(self.parent_of)

    def _child(self, parent: int, content: Hashable) -> int | None:
        """The key of ``(parent, content)`` if it exists."""
        k = parent + 1
        parent_of = self.parent_of
        if k < len(parent_of) and parent_of[k] == parent and self.content_of[k] == content:
            return k
        return self.branches.get((parent, content))

    def keys(self, contents: Sequence[Hashable]) -> list[int]:
        """The chained keys of ``contents`` (a prompt's leading full blocks), creating the
        unseen ones: the keys :func:`chain_keys_plain` gives."""
        if not isinstance(contents, list):
            contents = list(contents)
        parent_of, content_of = self.parent_of, self.content_of
        n = len(contents)
        keys: list[int] = []
        parent, i = -1, 0
        while i < n:
            k = self._child(parent, contents[i])
            if k is None:
                break
            keys.append(k)
            parent, i, stride = k, i + 1, FIRST_STRIDE
            while i < n:  # guess that the run goes on: parent+1, parent+2, ...
                m = min(stride, n - i, len(parent_of) - parent - 1)
                if m <= 0:
                    break
                lo = parent + 1
                j = min(_first_mismatch(parent_of[lo:lo + m], list(range(parent, parent + m))),
                        _first_mismatch(content_of[lo:lo + m], contents[i:i + m]))
                if j:
                    keys += range(lo, lo + j)
                    parent, i = parent + j, i + j
                if j < m:
                    break  # block i leaves the run: a branch, or a miss
                stride *= 2
        if i < n:  # every block from the first miss on is new: consecutive keys
            start = len(parent_of)
            if start != parent + 1:
                self.branches[(parent, contents[i])] = start
            parent_of.append(parent)
            parent_of += range(start, start + n - i - 1)
            content_of += contents[i:]
            keys += range(start, start + n - i)
        return keys
