"""Triton kernels run in the interpreter on CPU tensors here; set before triton loads them."""

import os

os.environ["TRITON_INTERPRET"] = "1"
