"""The plugins path on the real control plane: our kube-scheduler (the official one
with GPUScheduler, SpotScheduler, AZScheduler and GangPreemption compiled in,
tools/k8s/build.sh plugins) serves the gpu-scheduler profile from
deploy/scheduler/plugins/, with no extender in the profile. The extender path's own
scenarios run here unchanged:

- placement: GPU memory, spot preference, a placement group's zone, a silent agent,
  an annotation the rules cannot read (the extender's words), the GPUPlacement Event
  that `gpu-scheduler explain` prints;
- preemption with DefaultPreemption alone: just enough victims, a sick GPU the device
  plugin still advertises (kube-scheduler counts it now: the plugin's Filter runs in
  its what-if), a disruption budget that steers the preemptor, a budget-protected
  pod kept on a sick-GPU node, ``preemptionPolicy: Never``; a gang of two nodes of
  which no member is taken (GangPreemption, in DefaultPreemption's place);
- gangs: two 4 x 8-GPU jobs on six nodes, one placed whole and the other after it,
  as upstream PodGroups (1.37) and through Kueue;

- shares of a GPU: best fit GPU by GPU and the largest free piece in the reason; a
  share that preempts the whole-GPU pod holding its GPU (which the extender path
  cannot: tests/e2e/test_shares.py);
- DRA GPUs: DRA and device-plugin nodes in one cluster, by product, memory and
  binpack, through the webhook's node affinity; a tainted device not offered
  (tests/e2e/test_gpu_stack.py);

on the newest minor and on the oldest (its plugins built with pkg/fwk's 1.34 tag).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from lab.controlplane import GANG_MINOR, plugins_scheduler, supported_minors
from lab.stack import start_stack
from tests.e2e import test_explain as explain
from tests.e2e import test_gangs as gangs
from tests.e2e import test_gpu_stack as gpu_stack
from tests.e2e import test_placement as placement
from tests.e2e import test_preemption as preemption
from tests.e2e import test_preemption_state as preemption_state
from tests.e2e import test_shares as shares
from tests.e2e.kube import core, ensure_namespace, unique, wait_bound, wait_event
from tests.e2e.scenarios import gpu_node, place
from tests.e2e.test_versions import oldest_binary
from tests.helpers import required

MINORS = ("newest", "oldest")


@contextlib.contextmanager
def plugins_stack(which: str, workdir) -> Iterator:
    """A stack of its own on the plugins path, on the newest or the oldest minor."""
    binary = oldest_binary() if which == "oldest" else None
    minor = supported_minors()[0 if which == "oldest" else -1]
    try:
        plugins_scheduler(int(minor.split(".")[1]))
    except FileNotFoundError as exc:
        required("the plugins path's e2e tests", f"{exc} (or `make test`, which builds it)")
    stack = start_stack(workdir, binary=binary, scheduling="plugins")
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module", params=MINORS)
def plugins(request, tmp_path_factory, control_plane_binary):
    with plugins_stack(request.param, tmp_path_factory.mktemp(f"plugins-{request.param}")) as stack:
        yield stack


def test_the_profile_is_served_by_our_kube_scheduler(plugins):
    """The gpu-scheduler profile names the plugins and no extender, and the binary
    that decodes it is the plugins' build for the control plane's minor."""
    config = yaml.safe_load((plugins.cluster.workdir / "gpu-scheduler.yaml").read_text())
    assert "extenders" not in config
    names = [p["name"] for p in config["profiles"][0]["plugins"]["multiPoint"]["enabled"]]
    assert names == ["SpotScheduler", "GPUScheduler", "AZScheduler", "GangPreemption"]
    assert plugins_scheduler(plugins.cluster.minor).exists()


def test_min_gpu_memory_lands_only_on_80gib_gpus(plugins):
    placement.test_min_gpu_memory_lands_only_on_80gib_gpus(plugins)


def test_an_unreadable_constraint_is_refused_in_the_extenders_words(plugins):
    placement.test_malformed_constraint_keeps_the_extenders_reason(plugins)


@pytest.mark.parametrize(("preference", "expected"), [("avoid", "on-demand"), ("prefer", "spot")])
def test_spot_preference_decides_between_otherwise_equal_nodes(plugins, preference, expected):
    placement.test_spot_preference_decides_between_otherwise_equal_nodes(
        plugins, preference, expected
    )


def test_group_is_drawn_to_the_zone_it_runs_in(plugins):
    placement.test_group_is_drawn_to_the_zone_it_runs_in(plugins)


def test_node_with_a_stale_agent_heartbeat_gets_no_gpu_pods(plugins):
    placement.test_node_with_a_stale_agent_heartbeat_gets_no_gpu_pods(plugins)


def test_a_placed_gpu_pod_says_why_that_node(plugins):
    """The plugins write the extender's GPUPlacement Event, named and worded alike
    (their own component as its source), and `gpu-scheduler explain` prints it."""
    case = "plugins-explain"
    roomy = gpu_node(plugins, case, 8)
    tight = gpu_node(plugins, case, 2)
    pod = place(plugins, case, 2)
    assert wait_bound(plugins, pod) == tight  # binpack: 2 of 2, nothing left to strand
    message = wait_event(plugins, pod, "GPUPlacement")
    assert f"2 GPUs on {tight}: gpu-scheduler score" in message, message
    assert "rank 1 of 2 candidates" in message and "gpu 10" in message, message
    assert roomy in message, message
    events = (
        core(plugins)
        .list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod},reason=GPUPlacement"
        )
        .items
    )
    assert len(events) == 1 and events[0].source.component == "gpu-scheduler-plugins"
    out = explain.explain(plugins, pod, "-n", "default")
    assert out.returncode == 0, out.stderr
    assert f"pod default/{pod}: on {tight}, scheduler gpu-scheduler" in out.stdout
    assert f"GPUPlacement: 2 GPUs on {tight}" in out.stdout, out.stdout


def test_an_inference_pod_preempts_just_enough_training_pods(plugins):
    preemption.inference_preempts_training(plugins)


def test_a_sick_gpu_gets_its_victim_from_default_preemption_alone(plugins, tmp_path):
    preemption.sick_gpu_gets_enough_victims(plugins, tmp_path)


def test_a_disruption_budget_sends_the_preemptor_to_the_unprotected_node(plugins):
    preemption.budget_steers_the_preemptor(plugins)


def test_a_budget_protected_pod_is_kept_on_a_sick_gpu_node(plugins, tmp_path):
    preemption_state.budget_kept_on_a_sick_gpu(plugins, tmp_path)


def test_preemption_policy_never_evicts_nothing(plugins):
    preemption.never_preempts(plugins)


def test_a_gang_loses_all_its_members_or_none(plugins):
    """A gpu-scheduler.io/group with a member on each of two nodes: an 8-GPU preemptor
    would take one member and leave its sibling holding four GPUs, and takes nothing;
    a 4-GPU preemptor takes a lone pod (as on the extender path)."""
    preemption.gang_whole_or_none(plugins)


def test_shares_fit_gpu_by_gpu_and_wait_with_the_largest_piece(plugins):
    shares.shares_fit_gpu_by_gpu(plugins)


def test_a_share_preempts_the_whole_gpu_pod_that_holds_its_gpu(plugins):
    shares.share_preempts_a_whole_gpu(plugins, preempts=True)


@contextlib.contextmanager
def gang_namespace(stack) -> Iterator[str]:
    """A namespace of its own, its pods and itself deleted after (test_gangs' fixture)."""
    name = unique("gang")
    ensure_namespace(stack, name)
    try:
        yield name
    finally:
        gangs.force_delete(stack, name, core(stack).list_namespaced_pod(name).items)
        core(stack).delete_namespace(name)


def test_an_upstream_gang_places_one_job_whole_and_the_other_after_it(plugins, tmp_path):
    cluster = plugins.cluster
    if cluster.minor < GANG_MINOR or "GenericWorkload=true" not in cluster.gates:
        pytest.skip(f"the Workload / PodGroup API is served from 1.{GANG_MINOR} with its gate on")
    with gang_namespace(plugins) as namespace:
        gangs.test_upstream_gang_places_one_job_whole_and_the_other_after_it(
            plugins, namespace, client.CustomObjectsApi(plugins.api), tmp_path
        )


def test_kueue_admits_one_job_whole_and_the_other_after_it(plugins, tmp_path):
    from lab.kueue import HOW_TO_GET_IT, kueue_binary, start_kueue

    if kueue_binary() is None:
        required("the Kueue e2e tests", HOW_TO_GET_IT)
    kueue = start_kueue(plugins.cluster, tmp_path / "kueue")
    try:
        with gang_namespace(plugins) as namespace:
            gangs.test_kueue_admits_one_job_whole_and_the_other_after_it(
                plugins, namespace, kueue, tmp_path
            )
    finally:
        kueue.stop()


@pytest.fixture(scope="module", params=MINORS)
def dra(request, tmp_path_factory, control_plane_binary):
    """A cluster of its own with the DRA scenario's nodes: its scores (scarcity keeps an
    unrestricted pod off the H100s restricted pods need) read every node of the
    cluster, and the other scenarios leave theirs behind."""
    workdir = tmp_path_factory.mktemp(f"plugins-dra-{request.param}")
    with plugins_stack(request.param, workdir) as stack:
        yield stack, gpu_stack.make_dra_nodes(stack)


def test_dra_and_device_plugin_nodes_in_one_cluster(dra):
    """Through the webhook, whose node affinity leaves nodes without GPU labels (the
    DRA nodes) to the plugins: product and memory are judged from the devices."""
    stack, nodes = dra
    gpu_stack.dra_and_device_plugin_nodes(
        stack, nodes, lambda gpus, **kw: place(stack, "dra", gpus, **kw)
    )


def test_a_tainted_dra_device_is_not_offered(dra):
    stack, _ = dra
    gpu_stack.tainted_device_not_offered(stack, lambda gpus: place(stack, "dra-sick", gpus))
