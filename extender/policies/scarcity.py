"""scarcity: keep scarce GPU models for the pods that can only run there.

A pod without ``gpu-scheduler.io/gpu-products`` can run on any GPU; a pod with it
cannot. Packing the unrestricted pods onto the model the restricted ones need (small
T4 and P100 nodes are binpack's favourite perfect fits) fails the restricted ones
later. The cluster cache knows, per product, the share of GPU demand restricted to it
over its share of the cluster's GPUs (the *pressure*, from the bound pods): roughly
the part of that model the restricted pods will need; a pod asking a share of one GPU
counts as that share of a GPU of its node (its units over the GPU's). An unrestricted
GPU pod, whole GPUs or a share, scores
each node ``(1 - min(1, pressure))**2`` on an absolute scale: models nobody is
restricted to all score near 1 and binpack decides among them, while a model whose
restricted demand needs much of it (0.75: score 0.06) is left to those pods.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from extender.columns import MODEL, Candidates
from extender.model import PodFacts
from extender.policies.base import ClusterView, Policy


class ScarcityPolicy(Policy):
    name: ClassVar[str] = "scarcity"
    #: Scores are already on a fixed 0..1 scale: the engine must not stretch them
    #: min-max (two models nobody is restricted to would look far apart).
    absolute: ClassVar[bool] = True

    def pre_score(self, pod: PodFacts, view: ClusterView) -> dict[str, float] | None:
        if (pod.gpus == 0 and not pod.shares) or pod.products is not None:
            return None
        pressure = view.product_pressure()
        return pressure if pressure and max(pressure.values()) > 0 else None

    def score_all(
        self, pressure: dict[str, float], nodes: Candidates, view: ClusterView
    ) -> np.ndarray:
        scores = {model: (1.0 - min(1.0, value)) ** 2 for model, value in pressure.items()}
        return nodes.models.lookup(scores, 1.0)[nodes.cols[MODEL]]
