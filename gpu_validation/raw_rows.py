"""The raw rows of a calibration: one flat dict per measurement, one CSV line each.

``measurements`` writes them, ``fitting`` reads them back (from the CSV too, with
``kvsim calibrate --refit``), so a section's columns are named in one place: here.
Plain Python (no torch), so the fits and their tests build rows without a GPU.
"""

from __future__ import annotations

Row = dict  # one measurement: its "section", the shape it ran, and its median "seconds"


def swap_columns(
    mode: str, direction: str, block_size: int, blocks: int, transfers: int, nbytes: float
) -> Row:
    """A swap row without its ``seconds``: ``blocks`` blocks of ``block_size`` tokens
    (``nbytes`` bytes, all layers) moved ``direction`` ("out": device to host, "in": back)
    in ``transfers`` copies, ``mode`` "per_block" or "batched"."""
    return {
        "section": "swap",
        "mode": mode,
        "direction": direction,
        "block_size": block_size,
        "blocks": blocks,
        "transfers": transfers,
        "bytes": nbytes,
    }
