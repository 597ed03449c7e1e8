"""Which catalogue GPU and model a name means, and what an operator profile of them is called.

One rule for everyone who names a profile or looks one up (``kvsim calibrate --import``
writes ``<name>.yaml``; ``kvsim validate`` looks for the profile of a run's GPU and model)::

    profile_name(gpu, model) = <catalogue GPU key>-<catalogue model key>
                               e.g. rtx4090-llama-3.1-8b, rtx-pro-6000-qwen3-32b

A GPU or model the catalogue does not know keeps its own name (lower case, characters other
than ``a-z 0-9 . _ -`` as ``-``), so a profile of a new GPU still gets a stable name.

Plain Python (the importers use it, and they need no numpy, simpy or pydantic).
"""

from __future__ import annotations

import re

from kvsim.simulator.cost_model.catalogue import GPUS, MODELS


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def gpu_key(device_name: str) -> str | None:
    """The catalogue GPU a device name is (``NVIDIA GeForce RTX 4090`` -> ``rtx4090``,
    ``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``, ``RTXPRO6000`` -> ``rtx-pro-6000``): the entry
    whose key or name is in the device name, written together or as words; the most specific
    (longest) one wins."""
    dev, words = _norm(device_name), _words(device_name)
    found = [(len(_norm(n)), k) for k, spec in GPUS.items() for n in (k, spec.name)
             if _norm(n) in dev or _words(n) <= words]
    return max(found)[1] if found else None


def model_key(model: str) -> str | None:
    """The catalogue model a Hugging Face name is (``meta-llama/Llama-3.1-8B`` -> ``llama-3.1-8b``;
    ``-hf``, ``-chat`` and ``-instruct`` variants have their base model's shape)."""
    base = model.rstrip("/").split("/")[-1].lower()
    for suffix in ("-hf", "-chat", "-instruct"):
        base = base.removesuffix(suffix)
    return base if base in MODELS else None


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-")


def profile_name(gpu: str, model: str) -> str:
    """The operator profile's name for ``model`` (a catalogue key or a Hugging Face name) on
    ``gpu`` (a catalogue key, a device name or a label): see the module docstring."""
    g = gpu_key(gpu) or _plain(gpu)
    m = model_key(model) or _plain(model.rstrip("/").split("/")[-1])
    return f"{g}-{m}"
