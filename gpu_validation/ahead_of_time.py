"""Compile the kernels for a GPU architecture on a machine without a GPU.

The Triton interpreter checks what the kernels compute, not how they compile: whether
loads vectorise, whether the K/V loads are software-pipelined, how many registers and how
much shared memory a program needs. Triton can compile for a given target without a
device (it ships ``ptxas``), so this module builds the decode kernel as the benchmark's
launches would specialise it on an H100/H200 (``sm_90``) and reports those facts; the
tests use it to guard the GPU path between GPU sessions.

Uses ``triton.compiler.ASTSource`` (triton >= 3.2 argument format). Do not set
``TRITON_INTERPRET`` in the process that calls it: interpreted kernels cannot be compiled.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvsim.gpu_validation.paged_attention import DecodeConfig, _decode_attention_kernel

POINTERS = {
    "out_ptr": "{dtype}",
    "part_m_ptr": "fp32",
    "part_l_ptr": "fp32",
    "part_acc_ptr": "fp32",
    "q_ptr": "{dtype}",
    "k_ptr": "{dtype}",
    "v_ptr": "{dtype}",
    "block_table_ptr": "i32",
    "context_lens_ptr": "i32",
}
# Integer arguments that Triton leaves unspecialised (``do_not_specialize``); every other
# integer of the benchmark's launches is a multiple of 16 and is specialised as such.
UNSPECIALISED = {"stride_bt_seq", "num_q_heads", "num_splits"}


@dataclass(frozen=True)
class CompiledFacts:
    registers: int  # per thread
    spill_bytes: int  # per-thread stack (register spills)
    shared_bytes: int  # dynamic shared memory per program
    kv_buffers: int  # K (and V) tiles the software pipeline keeps in flight
    vector_bytes: int  # narrowest asynchronous K/V load per thread (16 = 8 fp16 at once)


def compile_decode(
    config: DecodeConfig,
    *,
    paged: bool,
    split: bool = False,
    block_size: int = 16,
    dtype: str = "fp16",
    group: int = 4,
    head_dim: int = 128,
    arch: int = 90,
):
    """The compiled decode kernel (a ``triton.compiler.CompiledKernel``)."""
    fn = _decode_attention_kernel
    constexprs = dict(
        GROUP=group,
        GROUP_PAD=max(16, 1 << (group - 1).bit_length()),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, 1 << (head_dim - 1).bit_length()),
        BLOCK_SIZE=block_size,
        TILE=config.tile,
        PAGED=paged,
        SPLIT=split,
        DOT_IN_FP32=False,
    )
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = "*" + POINTERS[name].format(dtype=dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name not in UNSPECIALISED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    keyed = {(i,): constexprs[n] for i, n in enumerate(fn.arg_names) if n in constexprs}
    src = ASTSource(fn=fn, signature=signature, constexprs=keyed, attrs=attrs)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def facts(kernel) -> CompiledFacts:
    """Registers and spills (from the cubin), shared memory, pipeline depth, load width."""
    cuobjdump = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    ttgir = kernel.asm["ttgir"]
    buffers = [
        int(b) for b in re.findall(r"local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+x", ttgir)
    ]
    vector = re.findall(
        r"cp\.async\.c[ga]\.shared\.global \[[^\]]*\], \[[^\]]*\], (0x[0-9a-f]+|\d+)",
        kernel.asm["ptx"],
    )
    return CompiledFacts(
        registers=regs,
        spill_bytes=stack,
        shared_bytes=kernel.metadata.shared,
        kv_buffers=max(buffers, default=0),
        vector_bytes=min((int(v, 0) for v in vector), default=0),
    )
