"""A prompt's token blocks as one run of bytes: the content of block j without an object per block.

A prefix cache names a block by its tokens (``simulator.decoding.token_block_contents``:
the ids as 32-bit ints). Held as a list, that is one ``bytes`` object per block, built and
kept block by block: about 100 bytes each (64 of them tokens, at 16 tokens a block), and a
multi-turn workload of 100k requests names millions of blocks. :class:`TokenBlocks` keeps
the blocks back to back in one ``bytes`` (or, growing, a ``bytearray``)::

    data:  | block 0 | block 1 | block 2 | ...      each ``width`` bytes
    [j]    -> bytes of block j                 (a content, as the list held it)
    [i:k]  -> TokenBlocks of blocks i .. k-1   (one C-level copy)
    ==     -> the bytes compared at once       (a run of blocks in one memcmp)

so ``policies.indexes.key_chain`` compares a whole run of blocks in one comparison and stores every
distinct block in ``width`` bytes. It behaves as the list of its blocks would: length,
indexing, iteration, slicing, and equality with a list of the same ``bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator


class TokenBlocks:
    """Equal blocks of ``width`` bytes, back to back in ``data`` (module docstring)."""

    __slots__ = ("data", "width")

    def __init__(self, data: bytes | bytearray, width: int):
        if width < 1 or len(data) % width:
            raise ValueError(f"token blocks of width {width} cannot hold {len(data)} bytes "
                             "(the width must be >= 1 and divide the data)")
        self.data = data
        self.width = width

    def __len__(self) -> int:
        return len(self.data) // self.width

    def __getitem__(self, j: int | slice) -> bytes | TokenBlocks:
        w, n = self.width, len(self)
        if isinstance(j, slice):
            start, stop, step = j.indices(n)
            if step != 1:
                return TokenBlocks(b"".join(self[k] for k in range(start, stop, step)), w)
            return TokenBlocks(self.data[start * w:stop * w], w)  # empty if stop <= start
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"block {j} of {n}")
        return bytes(self.data[j * w:(j + 1) * w])

    def __iter__(self) -> Iterator[bytes]:
        data, w = self.data, self.width
        return (bytes(data[i:i + w]) for i in range(0, len(data), w))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenBlocks):
            return self.width == other.width and self.data == other.data
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a growing store must not be a dict key

    def __iadd__(self, other: TokenBlocks) -> TokenBlocks:
        """Append ``other``'s blocks (same width) to a growing store (``data`` a bytearray)."""
        if not isinstance(other, TokenBlocks) or other.width != self.width:
            raise TypeError(f"only token blocks of width {self.width} can be appended")
        if not isinstance(self.data, bytearray):
            raise TypeError("only a store (its data a bytearray) grows")
        self.data += other.data
        return self

    def __repr__(self) -> str:
        return f"TokenBlocks({len(self)} blocks of {self.width} bytes)"
