"""The README's examples are true: what they say about a pod holds for the code."""

from __future__ import annotations

import re

from gpu_scheduler import contract
from tests.helpers import ROOT

# GPU memory as GFD labels it (nvidia.com/gpu.memory, MiB), for the products the
# README's example pod names.
MEMORY = {"NVIDIA-H100-80GB-HBM3": 81559, "NVIDIA-A100-SXM4-80GB": 81920}


def test_the_example_pod_admits_the_products_it_names():
    text = (ROOT / "docs" / "reference" / "annotations.md").read_text()
    example = text[text.index("  name: train\n") :]
    minimum = re.search(r"gpu-scheduler\.io/min-gpu-memory: (\S+)", example)[1]
    products = re.search(r"gpu-scheduler\.io/gpu-products: (\S+)", example)[1].split(",")
    assert set(products) == set(MEMORY)
    for product in products:
        assert MEMORY[product] >= contract.parse_mib(minimum), product
    # and the warning next to it is true: 80Gi would exclude the H100
    assert contract.parse_mib("80Gi") > MEMORY["NVIDIA-H100-80GB-HBM3"]
