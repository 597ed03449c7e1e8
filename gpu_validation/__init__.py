"""GPU validation: a Triton paged-attention kernel, a GPU block pool and the calibration
benchmark that writes the profiles the simulator's ``calibrated`` cost model reads.

Importing this package needs neither torch nor triton. The profile format, the GEMM shapes
and the model catalogue it measures for live in ``simulator.cost_model`` (plain Python: no
simpy, no pydantic), which this package imports; the simulator never imports this package
(DESIGN.md "Layout and layering", checked by the import contract in pyproject.toml). The
kernel, pool and benchmark modules import torch and triton themselves.
"""
