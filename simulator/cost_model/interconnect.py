"""GPU-to-GPU links and the collectives a replica's GPUs run over them.

A collective over ``ranks`` GPUs that moves ``nbytes`` (the buffer each rank holds, as
nccl-tests counts it) takes a fixed latency per call plus its bytes at the link's *bus
bandwidth*, the figure nccl-tests reports (NVIDIA/nccl-tests ``doc/PERFORMANCE.md``): the
algorithm bandwidth ``nbytes / time`` times the share of the buffer each rank must send,
so one number describes a link whatever the rank count::

    all-reduce (ring)    2 (n-1)/n x nbytes / busbw + latency      tensor parallel
    all-to-all           (n-1)/n   x nbytes / busbw + latency      expert parallel
    send/recv            nbytes / busbw + latency                  pipeline stages

Catalogue bandwidths are *measured* all-reduce bus bandwidths (nccl-tests
``all_reduce_perf`` at large sizes), never a datasheet's line rate, which collectives do not
reach (protocol overhead, SM-driven copies, and on PCIe the CPU's root complex and memory).
Each is cited where it is defined; a link measured at some rank counts answers for the
others at the nearest measured count (log2 distance, ties to the smaller). All-to-all and
send/recv use the all-reduce figures unless a link gives their own (the same wires, a
different traffic pattern: an approximation, stated here once).

Latency: the time of a small (<= 64 KiB) all-reduce, also measured, charged once per call.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Collective:
    """One collective's numbers on a link: bus bandwidth (bytes/s) measured at some rank
    counts, and the per-call latency (s)."""

    bus_bandwidth: tuple[tuple[int, float], ...]  # ((ranks, bytes/s), ...), ranks ascending
    latency_s: float

    def bandwidth(self, ranks: int) -> float:
        """Bus bandwidth at ``ranks``: the measurement at the nearest measured rank count."""
        return min(self.bus_bandwidth, key=lambda p: (abs(math.log2(p[0]) - math.log2(max(ranks, 1))), p[0]))[1]


@dataclass(frozen=True)
class LinkSpec:
    """How a replica's GPUs talk: all-reduce numbers, optionally all-to-all and send/recv
    numbers of their own, and the most GPUs the link joins (None: any number)."""

    name: str
    all_reduce: Collective
    all_to_all: Collective | None = None
    send_recv: Collective | None = None
    max_ranks: int | None = None


# --- collectives: pure functions of bytes and ranks --------------------------------------

def ring_all_reduce_s(nbytes: float, ranks: int, bus_bandwidth: float, latency_s: float) -> float:
    """Seconds of one all-reduce of ``nbytes`` per rank over ``ranks`` GPUs (0 on one GPU)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bus_bandwidth + latency_s


def all_to_all_s(nbytes: float, ranks: int, bus_bandwidth: float, latency_s: float) -> float:
    """Seconds of one all-to-all where each rank holds ``nbytes`` (a ``1/ranks`` share of it
    for every rank, its own share staying put) (0 on one GPU)."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * nbytes / bus_bandwidth + latency_s


def send_recv_s(nbytes: float, bus_bandwidth: float, latency_s: float) -> float:
    """Seconds to send ``nbytes`` from one GPU to the next (a pipeline stage boundary)."""
    return nbytes / bus_bandwidth + latency_s


def link_all_reduce_s(link: LinkSpec, nbytes: float, ranks: int) -> float:
    c = link.all_reduce
    return ring_all_reduce_s(nbytes, ranks, c.bandwidth(ranks), c.latency_s)


def link_all_to_all_s(link: LinkSpec, nbytes: float, ranks: int) -> float:
    c = link.all_to_all or link.all_reduce
    return all_to_all_s(nbytes, ranks, c.bandwidth(ranks), c.latency_s)


def link_send_recv_s(link: LinkSpec, nbytes: float) -> float:
    c = link.send_recv or link.all_reduce
    return send_recv_s(nbytes, c.bandwidth(2), c.latency_s)


def tp_all_reduce_coefficients(num_layers: int, hidden_bytes_per_token: float, link: LinkSpec | None,
                               tensor_parallel: int) -> tuple[float, float]:
    """``(fixed_s, per_token_s)`` of a step's tensor-parallel communication: two all-reduces
    per layer (after attention, after the MLP), each of ``tokens x hidden x dtype`` bytes.
    ``(0, 0)`` on one GPU."""
    if tensor_parallel <= 1:
        return 0.0, 0.0
    if link is None:
        raise ValueError(f"tensor_parallel {tensor_parallel} needs a GPU-to-GPU link (hardware.interconnect)")
    c = link.all_reduce
    bw = c.bandwidth(tensor_parallel)
    calls = 2 * num_layers
    per_token = calls * 2 * (tensor_parallel - 1) / tensor_parallel * hidden_bytes_per_token / bw
    return calls * c.latency_s, per_token


# --- catalogue: measured NCCL all-reduce bus bandwidths ------------------------------------

def _measured(latency_s: float, *points: tuple[int, float]) -> Collective:
    return Collective(tuple(sorted(points)), latency_s)


# Small-message latency. NVLink: an all-reduce of 128 B-64 KiB between two H100s (NVLink 4,
# NVLS, CUDA graphs) takes about 6 us (NVIDIA/nccl issue #1259, 8x H100 HGX, NCCL 2.20.5); used
# for every NVLink generation (no other generation's figure found). PCIe: NCCL's all-reduce of
# 256 B-64 KiB takes 24.1-24.6 us on 8 RTX PRO 6000 Blackwell over PCIe 5.0 switches, P2P on
# (voipmonitor/rtx6kpro, hardware/pcie-bandwidth.md, "Custom Allreduce vs NCCL"); used for every
# PCIe link (no per-generation or no-P2P figure found).
NVLINK_LATENCY_S = 6e-6
PCIE_LATENCY_S = 24e-6

# NVLink 3 (A100 SXM, NVSwitch): "should reach 230 GB/s" busbw on 8 GPUs (NCCL maintainer,
# NVIDIA/nccl-tests issue #149: 12 links x 20 GB/s effective, other GPU limits -> ~230);
# 232.54 GB/s measured on 8x A100 (NVIDIA/nccl-tests issue #175).
NVLINK3 = LinkSpec("nvlink3", _measured(NVLINK_LATENCY_S, (8, 230 * GB)))
# NVLink 4 (H100/H200/H20 SXM, NVSwitch): ring all-reduce reaches the link's effective ~370 GB/s
# (450 GB/s line rate less ~20% protocol overhead), and with NVLink SHARP 8 GPUs peak at ~480 GB/s
# busbw (NCCL maintainer, NVIDIA/nccl-tests issue #212); 475 GB/s measured on 8x H200
# (NVIDIA/nccl-tests issue #272). NVLS figures exist for 8 GPUs only: 2 and 4 take the ring's.
NVLINK4 = LinkSpec("nvlink4", _measured(NVLINK_LATENCY_S, (2, 370 * GB), (4, 370 * GB), (8, 480 * GB)))
# NVLink 5 (B200, NVSwitch): all_reduce_perf on 8 B200 in one machine reaches "830+" GB/s busbw
# (NVIDIA/nccl issue #1807, NCCL 2.27).
NVLINK5 = LinkSpec("nvlink5", _measured(NVLINK_LATENCY_S, (8, 830 * GB)))
# NVLink bridge between a pair of H100 PCIe cards: 115.4-116.3 GB/s busbw at 1-4 GiB on 2 GPUs
# (NVIDIA/nccl issue #1161). A bridge joins two cards only.
NVLINK4_BRIDGE = LinkSpec("nvlink4-bridge", _measured(NVLINK_LATENCY_S, (2, 116 * GB)), max_ranks=2)
# PCIe 5.0 x16, peer to peer: 8x RTX PRO 6000 Blackwell, all_reduce_perf busbw 37.6-41.1 GB/s
# (four systems); 40.1 GB/s with NCCL's default settings at 32 MiB on PCIe switches
# (voipmonitor/rtx6kpro, hardware/pcie-bandwidth.md, "NCCL AllReduce Bus Bandwidth").
PCIE_GEN5_P2P = _measured(PCIE_LATENCY_S, (8, 40.1 * GB))
# PCIe 5.0 x16 without peer to peer (GeForce RTX 5090, whose driver has no P2P: traffic staged
# in host memory): all_reduce_perf at 1-8 GiB peaks at 35 GB/s busbw on 4 GPUs and 28 GB/s on 8
# (NVIDIA/nccl issue #1639; the maintainer: on PCI systems the CPU and its memory set the rate).
PCIE_GEN5_HOST = _measured(PCIE_LATENCY_S, (4, 35 * GB), (8, 28 * GB))
# PCIe 4.0 x16, peer to peer: 4x RTX 4090 with the P2P-enabling open kernel modules,
# all_reduce_perf busbw 25.72-25.95 GB/s at 256 MiB-2 GiB (tinygrad/open-gpu-kernel-modules
# issue #36).
PCIE_GEN4_P2P = _measured(PCIE_LATENCY_S, (4, 25.8 * GB))
# PCIe 4.0 x16 without peer to peer: no published all_reduce_perf figure was found. Derived, not
# measured: PCIe 5.0's without-P2P figures scaled by PCIe 4.0's P2P over PCIe 5.0's P2P
# (25.8 / 40.1), i.e. 22.5 GB/s on 4 GPUs, 18.0 on 8. Give hardware.interconnect explicitly
# where a measurement exists.
PCIE_GEN4_HOST = Collective(tuple((n, bw * 25.8 / 40.1) for n, bw in PCIE_GEN5_HOST.bus_bandwidth), PCIE_LATENCY_S)

_PCIE = {("gen4", True): PCIE_GEN4_P2P, ("gen4", False): PCIE_GEN4_HOST,
         ("gen5", True): PCIE_GEN5_P2P, ("gen5", False): PCIE_GEN5_HOST}
_PCIE_NAME = re.compile(r"pcie-(gen4|gen5)(?:-x(16|8|4))?(-p2p)?")

INTERCONNECTS: dict[str, LinkSpec | None] = {
    "none": None,  # GPUs that cannot talk (one GPU per replica only)
    "nvlink3": NVLINK3,
    "nvlink4": NVLINK4,
    "nvlink5": NVLINK5,
    "nvlink4-bridge": NVLINK4_BRIDGE,
    **{f"pcie-{gen}{'-p2p' if p2p else ''}": LinkSpec(f"pcie-{gen}{'-p2p' if p2p else ''}", c)
       for (gen, p2p), c in _PCIE.items()},
}
"""Named links (``hardware.interconnect``). PCIe names take a width too: ``pcie-gen4-x8-p2p``
(x16 when not given; a narrower link's bandwidths scale with its lanes, an assumption: every
measurement above is x16)."""

INTERCONNECT_RULE = ("one of none, nvlink3, nvlink4, nvlink5, nvlink4-bridge, pcie-gen4|gen5[-x16|-x8|-x4][-p2p] "
                     "(e.g. pcie-gen4-p2p), or {bus_bandwidth_gb_s, latency_s}")


def interconnect(name: str) -> LinkSpec | None:
    """The link a name denotes (``INTERCONNECTS`` or a PCIe generation, width and P2P); None
    for ``none``. A ValueError names what is allowed."""
    key = name.lower()
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    m = _PCIE_NAME.fullmatch(key)
    if m is None:
        raise ValueError(f"unknown interconnect {name!r}; allowed: {INTERCONNECT_RULE}")
    gen, width, p2p = m.group(1), int(m.group(2) or 16), bool(m.group(3))
    c = _PCIE[(gen, p2p)]
    scaled = Collective(tuple((n, bw * width / 16) for n, bw in c.bus_bandwidth), c.latency_s)
    return LinkSpec(key, scaled)


def explicit_link(bus_bandwidth_gb_s: float, latency_s: float, all_to_all: tuple[float, float] | None = None,
                  send_recv: tuple[float, float] | None = None) -> LinkSpec:
    """A link given by its numbers (GB/s bus bandwidth, seconds per call), at every rank count;
    all-to-all and send/recv as ``(GB/s, s)`` when they differ from the all-reduce's."""
    def one(bw: float, lat: float) -> Collective:
        return Collective(((2, bw * GB),), lat)
    return LinkSpec("explicit", one(bus_bandwidth_gb_s, latency_s),
                    one(*all_to_all) if all_to_all else None, one(*send_recv) if send_recv else None)


def check_ranks(link: LinkSpec | None, ranks: int, name: str) -> None:
    """Refuse ``ranks`` GPUs on a link that cannot join them (one line, naming the link)."""
    if ranks <= 1:
        return
    if link is None:
        raise ValueError(f"{name!r} joins no GPUs, so tensor_parallel {ranks} cannot run on it: set a link "
                         f"({INTERCONNECT_RULE})")
    if link.max_ranks is not None and ranks > link.max_ranks:
        raise ValueError(f"{name!r} joins {link.max_ranks} GPUs, not {ranks}: set another link, e.g. pcie-gen5-p2p")
