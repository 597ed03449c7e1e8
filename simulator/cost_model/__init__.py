"""Step-time models: roofline (no GPU needed), calibrated (from a GPU profile) and profiled
(measured operator tables, ``profiled.py``; imported with ``kvsim calibrate --import``)."""

from kvsim.simulator.cost_model.base import (
    BatchShape,
    CostModel,
    Deployment,
    causal_attention_pairs,
)
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS, PCIE, GPUSpec, ModelSpec
from kvsim.simulator.cost_model.roofline import RooflineCostModel, RooflineParams

__all__ = [
    "BatchShape",
    "CostModel",
    "Deployment",
    "causal_attention_pairs",
    "GPUS",
    "MODELS",
    "PCIE",
    "GPUSpec",
    "ModelSpec",
    "RooflineCostModel",
    "RooflineParams",
]
