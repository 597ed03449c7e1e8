"""GPU validation: a Triton paged-attention kernel, a GPU block pool and the calibration
benchmark that writes the profiles the simulator's ``calibrated`` cost model reads.

Importing this package needs neither torch nor triton. The profile format, the GEMM shapes
and the model catalogue it measures for live in ``simulator.cost_model`` (plain Python: no
simpy, no pydantic), which this package imports; the simulator never imports this package
(DESIGN.md "Layout and layering", checked by the import contract in pyproject.toml). The
kernel, pool and benchmark modules import torch and triton themselves.
"""

if __name__ != "kvsim.gpu_validation":  # one module object per file: never both gpu_validation.x and kvsim.gpu_validation.x
    raise ImportError(f"import kvsim.gpu_validation, not {__name__}: the repository's folders install as the kvsim package")
