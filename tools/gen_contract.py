"""Writes plugins/pkg/contract/zz_generated.contract.go from the Python contract: every
label key, annotation key, resource name, refusal code and default weight the Go
framework plugins read, spelled once (gpu_scheduler/contract.py, the policies' codes
and registry) for both languages.

    .venv/bin/python tools/gen_contract.py           # rewrite the Go file
    .venv/bin/python tools/gen_contract.py --check   # exit 1 when it is stale

``make test`` runs the check (tests/unit/test_contract_go.py): a key renamed on one
side only fails there, before any conformance case runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender import model  # noqa: E402
from extender.policies import REGISTRY, gpu, heartbeat, spot  # noqa: E402
from extender.cache_shares import MAX_SHARE_CLASSES  # noqa: E402
from gpu_scheduler import constraints, contract, dra, sharing  # noqa: E402

OUT = ROOT / "plugins" / "pkg" / "contract" / "zz_generated.contract.go"


def go_string(value: str) -> str:
    return json.dumps(value)  # a JSON string of ASCII text is a Go string literal


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.lower().split("_"))


#: The gpu rule's refusal codes (extender/policies/gpu.py), in its order.
GPU_CODES = (
    "NO_GPUS", "NOT_ADVERTISED", "NOT_SHARED", "PRODUCT", "NO_MEMORY_LABEL", "LOW_MEMORY",
    "TOO_FEW", "UNHEALTHY", "BUSY", "SHARE_TOO_BIG", "SHARE_NO_ROOM",
)  # fmt: skip


def strings() -> list[tuple[str, str, str]]:
    """(Go name, value, what it is) of each string constant."""
    c = contract
    named = [
        ("RESOURCE_GPU", "whole GPUs, NVIDIA's device plugin's resource"),
        ("RESOURCE_GPU_MEMORY", "a share of one GPU, 1 unit = 1 GiB"),
        ("SCHEDULER_NAME", "the schedulerName GPU pods carry"),
        ("LABEL_GPU_PRESENT", ""),
        ("LABEL_GPU_COUNT", ""),
        ("LABEL_GPU_PRODUCT", ""),
        ("LABEL_GPU_MEMORY", "MiB per GPU"),
        ("LABEL_GPU_MEMORY_LEGACY", "read only where LabelGpuMemory is absent"),
        ("LABEL_GPU_REPLICAS", "> 1: time-slicing or MPS"),
        ("LABEL_GKE_GPU_SHARING_STRATEGY", ""),
        ("LABEL_GKE_MAX_SHARED_CLIENTS", ""),
        ("LABEL_GPU_SHARING", "set by the admin on a node whose GPUs are shared"),
        ("LABEL_ZONE", ""),
        ("SHARED_SUFFIX", "GFD's product suffix for a shared GPU"),
        ("MIG_PART", "the part GFD's MIG single strategy adds to a product"),
        ("ANN_MIN_GPU_MEMORY", ""),
        ("ANN_GPU_PRODUCTS", ""),
        ("ANN_PLACEMENT", ""),
        ("ANN_SPOT", ""),
        ("ANN_GROUP", ""),
        ("LABEL_KUEUE_PODSET", "a pod of a Kueue workload carries it"),
        ("LABEL_KUEUE_POD_GROUP", "Kueue's plain-pod group"),
        ("ANN_KUEUE_WORKLOAD", "the Kueue Workload a pod belongs to"),
        ("ANN_GPUS", "the agent's per-GPU annotation (JSON)"),
        ("ANN_GPU_SHARES", ""),
        ("GPU_UUID", "keys of each GPU's entry in AnnGpus"),
        ("GPU_HEALTHY", ""),
        ("GPU_REASON", ""),
        ("GPU_XID", ""),
        ("GPU_SINCE", ""),
        ("GPU_MIG_ENABLED", ""),
        ("GPU_MIG_DEVICES", ""),
        ("GPU_MEMORY_MIB", "the GPU's memory, MiB"),
        ("GPU_RESERVED_MIB", "MiB kept back from shares on the GPU"),
        ("LEASE_LABEL", "the agent's heartbeat Lease carries LeaseLabel=LeaseLabelValue"),
        ("LEASE_LABEL_VALUE", ""),
        ("LEASE_SELECTOR", ""),
    ]
    out = [(camel(name), getattr(c, name), why) for name, why in named]
    drivers = [
        ("NVIDIA_DRIVER", "the NVIDIA DRA driver's name and attribute domain"),
        ("ATTR_PRODUCT", "its device attribute naming the product (NVML's name)"),
        ("CAPACITY_MEMORY", "its device capacity of GPU memory"),
    ]
    return out + [(f"Dra{camel(name)}", getattr(dra, name), why) for name, why in drivers]


def integers() -> list[tuple[str, int, str]]:
    rows = [
        ("MaxGpusAnnotation", contract.MAX_GPUS_ANNOTATION, "a longer AnnGpus is not read"),
        ("MaxGpus", model.MAX_GPUS, "larger GPU counts are clamped"),
        ("MaxProducts", constraints.MAX_PRODUCTS, "products a pod may name"),
        ("MaxLabelValue", contract.MAX_LABEL_VALUE, ""),
        ("ShareUnitMiB", sharing.UNIT_MIB, "one unit of ResourceGpuMemory"),
        ("ShareMaxUnits", sharing.MAX_UNITS, "no GPU has more units; a larger share is refused"),
        ("ShareMaxGpus", sharing.MAX_GPUS, "a node with more GPUs is not read as shared"),
        ("ShareMaxPodKey", sharing.MAX_POD_KEY, "longest pod key in AnnGpuShares"),
        ("ShareMaxAnnotation", sharing.MAX_SHARES_ANNOTATION, "a longer AnnGpuShares is not read"),
        ("ShareMaxClasses", MAX_SHARE_CLASSES, "share classes kept in the mix"),
        ("DraMaxTaints", dra.MAX_TAINTS, "a device's blocking taints read"),
        ("DraMaxRequests", dra.MAX_REQUESTS, "a claim's requests read"),
    ]
    rows += [(f"Gpu{camel(code)}", getattr(gpu, code), "") for code in GPU_CODES]
    rows += [("SpotNotSpot", spot.NOT_SPOT, ""), ("SpotIsSpot", spot.IS_SPOT, "")]
    rows += [("HeartbeatSilent", 1, "the heartbeat rule's one refusal")]
    rows += [("HeartbeatGuardMinSilent", heartbeat.GUARD_MIN_SILENT, "")]
    for name, entry in REGISTRY.items():
        if entry.weight is not None:
            rows.append((f"Weight{camel(name)}", entry.weight, f"the {name} score's default"))
    return rows


def lists() -> list[tuple[str, tuple[str, ...], str]]:
    return [
        ("TopologyLevels", contract.TOPOLOGY_LEVELS, "the group score's levels, tightest first"),
        ("SharingModes", contract.SHARING_MODES, ""),
        ("SpotPreferences", constraints.SPOT_PREFERENCES, ""),
        ("Placements", model.PLACEMENTS, ""),
        ("DraBlockingEffects", dra.BLOCKING_EFFECTS, "device taint effects that keep pods off"),
    ]


def render() -> str:
    out = [
        "// Code generated by tools/gen_contract.py from gpu_scheduler/contract.py and the",
        "// extender's policies. DO NOT EDIT: change the Python side and rerun it.",
        "",
        "package contract",
        "",
    ]
    # One declaration a line: gofmt aligns nothing, so this text is gofmt's own.
    for name, value, why in strings():
        out += (["", f"// {name}: {why}."] if why else []) + [f"const {name} = {go_string(value)}"]
    out.append("")
    for name, value, why in integers():
        out += (["", f"// {name}: {why}."] if why else []) + [f"const {name} = {value}"]
    out.append("")
    for name, values, why in lists():
        if why:
            out.append(f"// {name}: {why}.")
        out.append(f"var {name} = []string{{{', '.join(map(go_string, values))}}}")
        out.append("")
    out.append("// SpotLabels: each cloud's spot label and the one value that marks spot.")
    out.append("var SpotLabels = [][2]string{")
    for key, value in contract.SPOT_LABELS:
        out.append(f"\t{{{go_string(key)}, {go_string(value)}}},")
    out += ["}", ""]
    unresolvable = ", ".join(
        f"Gpu{camel(n)}" for n in GPU_CODES if getattr(gpu, n) in gpu.UNRESOLVABLE
    )
    out.append("// GpuUnresolvable: the gpu codes no change in the cluster's load heals.")
    out.append(f"var GpuUnresolvable = map[int]bool{{{_set(unresolvable)}}}")
    text = "\n".join(out) + "\n"
    while "\n\n\n" in text:  # a commented constant after a blank line
        text = text.replace("\n\n\n", "\n\n")
    return text


def _set(names: str) -> str:
    return ", ".join(f"{n}: true" for n in names.split(", "))


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run tools/gen_contract.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
