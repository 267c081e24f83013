import re
from decimal import Decimal

import pytest

from gpu_scheduler import contract, podspec
from gpu_scheduler.fields import FieldError
from gpu_scheduler.quantity import QuantityError, parse_quantity


def gpu(n, where="requests"):
    return {"resources": {where: {contract.RESOURCE_GPU: str(n)}}}


def test_requests_and_limits_count_the_same():
    assert podspec.pod_gpu_request({"containers": [gpu(2)]}) == 2
    assert podspec.pod_gpu_request({"containers": [gpu(2, "limits")]}) == 2


def test_request_wins_over_limit_when_both_given():
    c = {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}
    assert podspec.pod_gpu_request({"containers": [c]}) == 1


def test_containers_are_summed():
    assert podspec.pod_gpu_request({"containers": [gpu(1), gpu(2), {"name": "x"}]}) == 3


def test_init_containers_count_by_their_maximum():
    spec = {"containers": [gpu(1)], "initContainers": [gpu(4), gpu(2)]}
    assert podspec.pod_gpu_request(spec) == 4
    spec = {"containers": [gpu(3)], "initContainers": [gpu(2)]}
    assert podspec.pod_gpu_request(spec) == 3


def test_sidecars_add_to_the_sum_and_to_later_init_containers():
    sidecar = gpu(1) | {"restartPolicy": "Always"}
    # sidecar runs beside the app container: 2 + 1
    assert podspec.pod_gpu_request({"containers": [gpu(2)], "initContainers": [sidecar]}) == 3
    # an init container after the sidecar runs beside it: max(1+2, 1+3) = 4
    spec = {"containers": [gpu(2)], "initContainers": [sidecar, gpu(3)]}
    assert podspec.pod_gpu_request(spec) == 4
    # an init container before the sidecar runs alone: max(3, 1+2) = 3
    spec = {"containers": [gpu(2)], "initContainers": [gpu(3), sidecar]}
    assert podspec.pod_gpu_request(spec) == 3


def test_overhead_is_added():
    spec = {"containers": [gpu(1)], "overhead": {contract.RESOURCE_GPU: "1"}}
    assert podspec.pod_gpu_request(spec) == 2


def test_no_gpu_and_empty_specs():
    assert podspec.pod_gpu_request(None) == 0
    assert podspec.pod_gpu_request({}) == 0
    assert podspec.pod_gpu_request({"containers": None, "initContainers": None}) == 0
    assert podspec.pod_gpu_request({"containers": [{"resources": None}]}) == 0


def test_bad_quantities_raise_naming_the_field():
    where = 'spec.containers[0].resources.requests["nvidia.com/gpu"]'
    with pytest.raises(FieldError, match=re.escape(where)):
        podspec.pod_gpu_request({"containers": [gpu("lots")]})
    with pytest.raises(FieldError, match="whole number") as caught:
        podspec.pod_gpu_request({"containers": [gpu("500m")]})
    assert not caught.value.wrong_type  # a value the API server would validate
    with pytest.raises(FieldError, match="must not be negative"):
        podspec.pod_gpu_request({"containers": [gpu("-1")]})


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"containers": "nope"}, "spec.containers: must be an array, not a string"),
        ({"containers": [3]}, "spec.containers[0]: must be an object, not a number"),
        ({"containers": [{"resources": []}]}, "spec.containers[0].resources: must be an object"),
        (
            {"containers": [{"resources": {"limits": "x"}}]},
            "spec.containers[0].resources.limits: must be an object, not a string",
        ),
        ({"initContainers": [{"resources": {"requests": 1}}]}, "spec.initContainers[0]"),
        ({"overhead": ["1"]}, "spec.overhead: must be an object, not an array"),
        ({"containers": [{"resources": {"limits": {"nvidia.com/gpu": True}}}]}, "not a boolean"),
        ({"containers": [{"resources": {"limits": {"nvidia.com/gpu": {}}}}]}, "not an object"),
        ("spec", "spec: must be an object, not a string"),
    ],
)
def test_wrong_types_raise_naming_the_field(spec, path):
    with pytest.raises(FieldError) as caught:
        podspec.pod_gpu_request(spec)
    assert path in str(caught.value)
    assert caught.value.wrong_type


@pytest.mark.parametrize(
    ("text", "mib"),
    [("40Gi", 40960), ("81920", 81920), ("80G", 76293), ("512Mi", 512), (" 1Ti ", 1048576)],
)
def test_parse_mib(text, mib):
    assert contract.parse_mib(text) == mib


def test_parse_mib_rejects_garbage():
    with pytest.raises(QuantityError):
        contract.parse_mib("lots")


# Each cloud's spot label as the platform writes it (spelled out here, not taken from
# the contract's table, so a typo there fails): EKS managed node groups, Karpenter,
# GKE Spot VMs, GKE preemptible VMs, AKS spot pools.
@pytest.mark.parametrize(
    "key, spot, other",
    [
        ("eks.amazonaws.com/capacityType", "SPOT", "ON_DEMAND"),
        ("karpenter.sh/capacity-type", "spot", "on-demand"),
        ("cloud.google.com/gke-spot", "true", "false"),
        ("cloud.google.com/gke-preemptible", "true", "false"),
        ("kubernetes.azure.com/scalesetpriority", "spot", "regular"),
    ],
)
def test_capacity_type_per_cloud_label(key, spot, other):
    assert contract.capacity_type({key: spot}) == "spot"
    assert contract.capacity_type({key: other}) == "on-demand"
    # Exact values, as node affinity compares them: another spelling is not spot.
    assert contract.capacity_type({key: spot.swapcase()}) == "on-demand"
    # Any cloud's spot label makes the node spot, whatever another key says.
    assert contract.capacity_type({"eks.amazonaws.com/capacityType": "ON_DEMAND", key: spot}) == (
        "spot"
    )


def test_capacity_type_unknown_without_any_label():
    assert contract.capacity_type({}) is None
    assert contract.capacity_type({"topology.kubernetes.io/zone": "a"}) is None


def test_gpu_memory_label_and_legacy_fallback():
    assert contract.node_gpu_memory_mib({contract.LABEL_GPU_MEMORY: "81559"}) == 81559
    assert contract.node_gpu_memory_mib({contract.LABEL_GPU_MEMORY_LEGACY: "40960"}) == 40960
    assert contract.node_gpu_memory_mib({contract.LABEL_GPU_MEMORY: "n/a"}) is None
    # The legacy label only where the current one is absent, not where it is garbage:
    # node affinity cannot say "fall back when unreadable".
    both = {contract.LABEL_GPU_MEMORY: "n/a", contract.LABEL_GPU_MEMORY_LEGACY: "40960"}
    assert contract.node_gpu_memory_mib(both) is None


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("0", 0),
        ("007", 7),  # Go's ParseInt takes leading zeros
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", None),  # beyond int64: ParseInt fails, Gt never matches
        ("0" * 62 + "5", 5),
        ("1e3", None),
        ("12.5", None),
        ("", None),
        ("٣", None),  # a non-ASCII digit
        (None, None),
    ],
)
def test_label_int_reads_as_node_affinity_gt_does(value, number):
    assert contract.label_int(value) == number


def test_product_label_value_follows_gfd():
    """k8s-device-plugin internal/lm resource_test.go: TestSanitise, TestGetProductName."""
    assert contract.product_label_value("NVIDIA A100-SXM4-40GB", "MIG", "1g.5gb") == (
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    )
    assert contract.product_label_value("Tesla T4", "SHARED") == "Tesla-T4-SHARED"
    long = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    assert contract.product_label_value(long, "MIG", "1g.24gb") == (
        "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edi-MIG-1g.24gb"
    )
    cut = contract.product_label_value(long, "MIG", "1g.24gb.me")
    assert cut == "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-MIG-1g.24gb.me"
    assert len(cut) <= 63
    assert contract.base_product("NVIDIA-H100-80GB-HBM3-SHARED") == "NVIDIA-H100-80GB-HBM3"
    assert contract.base_product("NVIDIA-L4") == "NVIDIA-L4"


def test_product_label_value():
    assert contract.product_label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert isinstance(parse_quantity("1"), Decimal)
