"""GPU validation: a Triton paged-attention kernel, a GPU block pool and the calibration
benchmark that writes the profiles the simulator's ``calibrated`` cost model reads.

Importing this package needs neither torch nor triton: the profile format
(``gpu_validation.profile``) and the model shapes (``gpu_validation.model_shapes``) are
plain Python so the simulator can read profiles on a laptop. The kernel, pool and
benchmark modules import torch and triton themselves.
"""
