"""A filter that picks: one round trip a pod, and no scoring pass in kube-scheduler.

With ``filterChooses`` on (the default), a filter call that leaves more than one node
answers only the node the extender ranks first. kube-scheduler then has one feasible
node, and with one it skips its PreScore and Score plugins and the prioritize call
altogether (``schedulePod`` in ``pkg/scheduler/schedule_one.go``: "When only one
node after predicate, just use it"). The refusals, their reasons and every retry
answer are the filter's as before; only the nodes that fit and rank lower are left
out of the answer (in neither failed map: they did not fail, and a pod with a node
to go to is never diagnosed or preempted for).

What kube-scheduler's scoring would have added, and how the pick keeps it:

- **The pod's own preferences** (preferred node or pod affinity, a ScheduleAnyway
  topology spread): the extender does not pick. Every node that fits goes back, and
  kube-scheduler weighs them with ours through prioritize, as without this option.
- **PreferNoSchedule taints** (Cluster Autoscaler marks the nodes it means to remove
  with one): a node with taints the pod does not tolerate is picked only when every
  node that fits has as many; fewer intolerable taints come first. That is stricter
  than kube-scheduler, whose TaintToleration score (weight 3) was worth about three
  of the extender's score steps.
- **Ties** on the extender's score are broken by its unrounded score (a finer ranking
  than the 0..10 integers kube-scheduler is sent), then by the least free CPU, then
  memory, in absolute amounts left by the GPU pods the cache counts (after the spirit
  of MostAllocated in deploy/'s profile, which takes shares of allocatable and every
  pod), then kube-scheduler's own order of the candidates. Image locality and
  BalancedAllocation, which only broke ties before (their 0..100 against the
  extender's 100 a point), are not weighed, nor is other pods' preferred affinity
  toward this one (their required terms are kube-scheduler's filters, which came
  first).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from extender.columns import CPU, RAM, SOFT, Candidates
from extender.model import PodFacts
from gpu_scheduler.taints import intolerable

#: Who picks among the nodes that fit, as counted and logged.
EXTENDER = "extender"
SCHEDULER = "kube-scheduler"


def _intolerable(pod: PodFacts, batch: Candidates) -> np.ndarray | None:
    """Each known candidate's soft taints the pod does not tolerate (None: no
    candidate has any soft taint, the usual case: one vector test)."""
    tainted = np.flatnonzero(batch.cols[SOFT])
    if not len(tainted):
        return None
    counts = np.zeros(batch.known, dtype=np.int64)
    for j in tainted.tolist():
        counts[j] = intolerable(pod.soft_tolerations, batch.facts(j).soft_taints)
    return counts


def avoided(pod: PodFacts, batch: Candidates, chosen: int) -> Callable[[int], bool]:
    """For the Event: whether candidate ``i`` (a position among all) was passed over
    for soft taints the pod does not tolerate, beside ``chosen`` (a position too)."""
    counts = _intolerable(pod, batch)
    if counts is None or batch.where is not None:  # picked ones are all known
        return lambda i: False
    return lambda i: bool(counts[i] > counts[chosen])


def pick(pod: PodFacts, batch: Candidates, means: np.ndarray | None) -> int:
    """The position among ``batch``'s known candidates of the node to answer.

    ``means``: the known candidates' unrounded scores (engine.weighted_means; None:
    no policy scores this pod, so all tie). Pure: the ranking described above."""
    cols = batch.cols
    # lexsort is stable: what ties on every key keeps kube-scheduler's order
    keys: list[np.ndarray] = [cols[RAM], cols[CPU]]
    if means is not None:
        keys.append(-means)
    counts = _intolerable(pod, batch)
    if counts is not None:
        keys.append(counts)
    # lexsort: the last key is the primary one
    return int(np.lexsort(keys)[0])
