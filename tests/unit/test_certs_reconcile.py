"""The in-cluster certificate controller's decisions (certs.reconcile): what the four
Secrets hold after a pass, from nothing, when good, when stale or garbage, and through
a CA rollover in which no reader ever meets a certificate it does not trust."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from certs import build, reconcile, store
from gpu_scheduler import certinfo

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = reconcile.Settings(namespace="gpu-scheduler", settle=dt.timedelta(minutes=5))
LEAVES = list(reconcile.LEAVES)


def certs_in(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle)


def trusted(leaf: bytes, bundle: bytes) -> bool:
    cert = certinfo.load_cert(leaf)
    return any(cert.issuer == ca.subject and build.signed_by(cert, ca) for ca in certs_in(bundle))


def fresh(now: dt.datetime = NOW) -> reconcile.Outcome:
    return reconcile.reconcile({}, None, SETTINGS, now)


def test_from_nothing_a_ca_and_three_leaves_it_signs():
    out = fresh()
    assert sorted(out.changed) == sorted([reconcile.CA_SECRET, *LEAVES])
    ca = out.secrets[reconcile.CA_SECRET]
    assert set(ca) == {"ca.crt", "ca.key"}
    assert out.bundle == ca["ca.crt"]
    for name in LEAVES:
        leaf = out.secrets[name]
        assert set(leaf) == {"tls.crt", "tls.key", "ca.crt"}
        assert leaf["ca.crt"] == out.bundle and trusted(leaf["tls.crt"], out.bundle)
    webhook = certinfo.load_cert(out.secrets["gpu-scheduler-webhook-tls"]["tls.crt"])
    names = webhook.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-scheduler-webhook.gpu-scheduler.svc" in names.get_values_for_type(x509.DNSName)
    scheduler = certinfo.load_cert(out.secrets["gpu-scheduler-scheduler-tls"]["tls.crt"])
    assert build.is_client_cert(scheduler)
    assert not build.is_client_cert(webhook)
    assert out.next_step_at is None and out.step_at is None


def test_a_second_pass_changes_nothing():
    first = fresh()
    again = reconcile.reconcile(first.secrets, first.step_at, SETTINGS, NOW + dt.timedelta(days=1))
    assert again.changed == [] and again.actions == []
    assert again.secrets == first.secrets


def test_leaves_are_renewed_by_the_same_ca_thirty_days_before_they_end():
    first = fresh()
    later = NOW + dt.timedelta(days=365 - 29)
    out = reconcile.reconcile(first.secrets, None, SETTINGS, later)
    assert sorted(out.changed) == sorted(LEAVES)  # the CA stays: the bundle peers hold
    assert out.bundle == first.bundle
    for name in LEAVES:
        assert out.secrets[name]["tls.crt"] != first.secrets[name]["tls.crt"]
        assert trusted(out.secrets[name]["tls.crt"], first.bundle)


@pytest.mark.parametrize("broken", [b"junk", b""])
def test_a_garbage_leaf_is_replaced_and_nothing_else(broken):
    first = fresh()
    current = {k: dict(v) for k, v in first.secrets.items()}
    current["gpu-scheduler-extender-tls"]["tls.crt"] = broken
    out = reconcile.reconcile(current, None, SETTINGS, NOW)
    assert out.changed == ["gpu-scheduler-extender-tls"]
    assert trusted(out.secrets["gpu-scheduler-extender-tls"]["tls.crt"], first.bundle)


def test_a_pair_of_the_wrong_kind_is_reissued():
    first = fresh()
    current = {k: dict(v) for k, v in first.secrets.items()}
    # the webhook's serving pair where kube-scheduler's client pair belongs
    current["gpu-scheduler-scheduler-tls"] = dict(first.secrets["gpu-scheduler-webhook-tls"])
    out = reconcile.reconcile(current, None, SETTINGS, NOW)
    assert out.changed == ["gpu-scheduler-scheduler-tls"]
    cert = certinfo.load_cert(out.secrets["gpu-scheduler-scheduler-tls"]["tls.crt"])
    assert build.is_client_cert(cert)


def assert_trust_holds(states: list[reconcile.Outcome]) -> None:
    """Readers lag by up to one step: every leaf of step k is trusted by the bundle of
    step k-1, every leaf of step k-1 by the bundle of step k, and each leaf's ca.crt is
    its step's bundle."""
    for k in range(1, len(states)):
        before, now = states[k - 1], states[k]
        for name in LEAVES:
            leaf_now, leaf_before = now.secrets[name]["tls.crt"], before.secrets[name]["tls.crt"]
            assert trusted(leaf_now, before.bundle), (k, name)
            assert trusted(leaf_before, now.bundle), (k, name)
            assert now.secrets[name]["ca.crt"] == now.bundle


def test_ca_rollover_in_three_steps_never_breaks_trust():
    """Readers lag by up to one step (a Secret volume refreshes within the settle
    time)."""
    start = fresh()
    not_after = certinfo.load_cert(start.bundle).not_valid_after_utc
    t = not_after - dt.timedelta(days=300)  # inside ca_renew_before (365 days)
    states = [start]
    out = reconcile.reconcile(start.secrets, None, SETTINGS, t)
    assert any("rollover begin" in a for a in out.actions)
    assert len(certs_in(out.bundle)) == 2
    assert out.next_step_at == t + SETTINGS.settle
    states.append(out)
    # before the settle time: nothing moves, and it says when to come back
    waiting = reconcile.reconcile(out.secrets, out.step_at, SETTINGS, t + dt.timedelta(minutes=1))
    assert waiting.changed == [] and waiting.next_step_at == t + SETTINGS.settle
    t += SETTINGS.settle
    out = reconcile.reconcile(out.secrets, out.step_at, SETTINGS, t)
    assert any("rollover switch" in a for a in out.actions)
    assert sorted(out.changed) == sorted([reconcile.CA_SECRET, *LEAVES])  # new leaves
    states.append(out)
    t += SETTINGS.settle
    out = reconcile.reconcile(out.secrets, out.step_at, SETTINGS, t)
    assert any("rollover finish" in a for a in out.actions)
    assert len(certs_in(out.bundle)) == 1 and out.next_step_at is None
    states.append(out)
    new_ca = certs_in(out.bundle)[0]
    assert new_ca.not_valid_after_utc > not_after
    assert_trust_holds(states)
    # and then it rests
    settled = reconcile.reconcile(out.secrets, out.step_at, SETTINGS, t + dt.timedelta(hours=1))
    assert settled.changed == []


def test_a_rollover_whose_step_time_was_lost_waits_a_settle_time_from_now():
    start = fresh()
    t = certinfo.load_cert(start.bundle).not_valid_after_utc - dt.timedelta(days=300)
    begun = reconcile.reconcile(start.secrets, None, SETTINGS, t)
    out = reconcile.reconcile(begun.secrets, None, SETTINGS, t + dt.timedelta(hours=2))
    assert not any("rollover" in a for a in out.actions)
    assert (
        out.step_at is not None and out.next_step_at == t + dt.timedelta(hours=2) + SETTINGS.settle
    )


def test_an_unreadable_step_time_counts_as_lost():
    start = fresh()
    t = certinfo.load_cert(start.bundle).not_valid_after_utc - dt.timedelta(days=300)
    begun = reconcile.reconcile(start.secrets, None, SETTINGS, t)
    out = reconcile.reconcile(begun.secrets, "yesterday", SETTINGS, t + dt.timedelta(hours=2))
    assert not any("rollover" in a for a in out.actions)


def test_settings_refuse_what_would_break_the_rollover():
    with pytest.raises(ValueError, match="ca_renew_before"):
        reconcile.Settings(namespace="x", ca_renew_before=dt.timedelta(days=45))
    with pytest.raises(ValueError, match="leaf days"):
        reconcile.Settings(namespace="x", leaf_days=400, ca_days=365)
    with pytest.raises(ValueError, match="settle"):
        reconcile.Settings(namespace="x", settle=dt.timedelta(seconds=-1))


def installed_by_the_tool(tmp_path, skip: str = "") -> dict[str, dict[str, bytes]]:
    """The three Secrets as deploy/install-certs.sh writes them: a CA kept off the
    cluster (its key in a folder of the admin's), leaves it signed."""
    ca_dir = tmp_path / "ca"
    secrets = {}
    for name, (service, client) in reconcile.LEAVES.items():
        folder = tmp_path / name
        identity = build.service_identity(service, SETTINGS.namespace)
        store.generate(folder, identity, now=NOW, ca_dir=ca_dir, client=client)
        if name != skip:
            secrets[name] = {k: (folder / k).read_bytes() for k in ("tls.crt", "tls.key", "ca.crt")}
    return secrets


def test_leaves_from_the_tool_are_adopted_without_a_moment_of_distrust(tmp_path):
    tool = installed_by_the_tool(tmp_path)
    foreign = tool["gpu-scheduler-webhook-tls"]["ca.crt"]
    t = NOW + dt.timedelta(days=10)
    start = reconcile.Outcome({k: dict(v) for k, v in tool.items()}, None, foreign)
    begun = reconcile.reconcile(tool, None, SETTINGS, t)
    assert set(begun.secrets[reconcile.CA_SECRET]) == {
        "ca-next.crt",
        "ca-next.key",
        "ca-previous.crt",
    }
    assert len(certs_in(begun.bundle)) == 2 and begun.next_step_at == t + SETTINGS.settle
    for name in LEAVES:  # they keep serving what they served
        assert begun.secrets[name]["tls.crt"] == tool[name]["tls.crt"]
    waiting = reconcile.reconcile(
        begun.secrets, begun.step_at, SETTINGS, t + dt.timedelta(minutes=1)
    )
    assert waiting.changed == [] and waiting.secrets == begun.secrets
    t += SETTINGS.settle
    switched = reconcile.reconcile(begun.secrets, begun.step_at, SETTINGS, t)
    assert {"ca.crt", "ca.key", "ca-previous.crt"} == set(switched.secrets[reconcile.CA_SECRET])
    for name in LEAVES:
        assert not trusted(switched.secrets[name]["tls.crt"], foreign)  # the new CA's
    t += SETTINGS.settle
    done = reconcile.reconcile(switched.secrets, switched.step_at, SETTINGS, t)
    assert len(certs_in(done.bundle)) == 1 and not trusted(
        tool["gpu-scheduler-webhook-tls"]["tls.crt"], done.bundle
    )
    assert_trust_holds([start, begun, switched, done])
    assert (
        reconcile.reconcile(done.secrets, done.step_at, SETTINGS, t + dt.timedelta(hours=1)).changed
        == []
    )


def test_a_leaf_missing_from_the_tool_is_issued_by_the_new_ca_at_once(tmp_path):
    tool = installed_by_the_tool(tmp_path, skip="gpu-scheduler-extender-tls")
    begun = reconcile.reconcile(tool, None, SETTINGS, NOW)
    leaf = begun.secrets["gpu-scheduler-extender-tls"]
    assert leaf["ca.crt"] == begun.bundle and trusted(leaf["tls.crt"], begun.bundle)
    assert (
        begun.secrets["gpu-scheduler-webhook-tls"]["tls.crt"]
        == tool["gpu-scheduler-webhook-tls"]["tls.crt"]
    )


def test_garbage_from_elsewhere_is_not_adopted():
    junk = {name: {"tls.crt": b"junk", "tls.key": b"junk", "ca.crt": b"junk"} for name in LEAVES}
    out = reconcile.reconcile(junk, None, SETTINGS, NOW)
    assert set(out.secrets[reconcile.CA_SECRET]) == {"ca.crt", "ca.key"}
    assert out.next_step_at is None


def test_leaves_of_another_ca_beside_ours_are_adopted_by_ours(tmp_path):
    """internal -> external (install-certs.sh's CA) -> internal: our CA Secret still
    holds a good CA, the leaves are the tool's: ours is trusted beside theirs first."""
    ours = fresh()
    current = {
        reconcile.CA_SECRET: ours.secrets[reconcile.CA_SECRET],
        **installed_by_the_tool(tmp_path),
    }
    begun = reconcile.reconcile(current, None, SETTINGS, NOW)
    ca = begun.secrets[reconcile.CA_SECRET]
    assert ca["ca-next.crt"] == ours.secrets[reconcile.CA_SECRET]["ca.crt"]  # ours, kept
    for name in LEAVES:
        assert begun.secrets[name]["tls.crt"] == current[name]["tls.crt"]
    t = NOW + SETTINGS.settle
    switched = reconcile.reconcile(begun.secrets, begun.step_at, SETTINGS, t)
    done = reconcile.reconcile(switched.secrets, switched.step_at, SETTINGS, t + SETTINGS.settle)
    assert done.bundle == ours.bundle
    start = reconcile.Outcome(dict(current), None, current[LEAVES[0]]["ca.crt"])
    assert_trust_holds([start, begun, switched, done])


def test_foreign_leaves_near_their_end_are_adopted_not_cut_over(tmp_path):
    tool = installed_by_the_tool(tmp_path)
    t = NOW + dt.timedelta(days=365 - 10)  # valid 10 more days: no longer "good", still serving
    begun = reconcile.reconcile(tool, None, SETTINGS, t)
    assert "ca-previous.crt" in begun.secrets[reconcile.CA_SECRET]
    for name in LEAVES:
        assert begun.secrets[name]["tls.crt"] == tool[name]["tls.crt"]


def test_a_corrupted_ca_secret_is_replaced_by_adoption(tmp_path):
    first = fresh()
    current = {k: dict(v) for k, v in first.secrets.items()}
    current[reconcile.CA_SECRET]["ca.key"] = b"not a key"
    begun = reconcile.reconcile(current, None, SETTINGS, NOW)
    assert certs_in(first.bundle)[0] in certs_in(begun.bundle)  # the old CA still trusted
    for name in LEAVES:
        assert begun.secrets[name]["tls.crt"] == first.secrets[name]["tls.crt"]


@pytest.mark.parametrize(
    "broken",
    [{"ca-next.crt": b"junk"}, {"ca-next.crt": None}, {"ca-previous.crt": b"junk"}],
    ids=["next-junk", "next-without-key", "previous-junk"],
)
def test_unusable_rollover_keys_are_dropped_not_raised(broken):
    start = fresh()
    t = certinfo.load_cert(start.bundle).not_valid_after_utc - dt.timedelta(days=300)
    begun = reconcile.reconcile(start.secrets, None, SETTINGS, t)  # ca-next.* present
    ca = dict(begun.secrets[reconcile.CA_SECRET])
    for key, value in broken.items():
        if value is None:
            ca.pop("ca-next.key")
        else:
            ca[key] = value
    current = {**begun.secrets, reconcile.CA_SECRET: ca}
    out = reconcile.reconcile(current, begun.step_at, SETTINGS, t + dt.timedelta(minutes=1))
    assert all(b"junk" not in v for v in out.secrets[reconcile.CA_SECRET].values())
    for name in LEAVES:
        assert trusted(out.secrets[name]["tls.crt"], out.bundle)


def test_hold_keeps_a_due_step_back_and_restarts_the_settle_time():
    start = fresh()
    t = certinfo.load_cert(start.bundle).not_valid_after_utc - dt.timedelta(days=300)
    begun = reconcile.reconcile(start.secrets, None, SETTINGS, t)
    later = t + SETTINGS.settle * 3
    held = reconcile.reconcile(begun.secrets, begun.step_at, SETTINGS, later, hold=True)
    assert not any("rollover" in a for a in held.actions)
    assert held.next_step_at == later + SETTINGS.settle and reconcile.CA_SECRET in held.changed
    going = reconcile.reconcile(held.secrets, held.step_at, SETTINGS, later + SETTINGS.settle)
    assert any("rollover switch" in a for a in going.actions)


def test_a_step_time_in_the_future_is_taken_as_now():
    start = fresh()
    t = certinfo.load_cert(start.bundle).not_valid_after_utc - dt.timedelta(days=300)
    begun = reconcile.reconcile(start.secrets, None, SETTINGS, t)
    ahead = reconcile.reconcile(
        begun.secrets, "2999-01-01T00:00:00Z", SETTINGS, t + SETTINGS.settle
    )
    assert ahead.changed == [reconcile.CA_SECRET] and ahead.step_at.startswith(str(t.year))
    later = t + SETTINGS.settle * 2
    assert any(
        "rollover switch" in a
        for a in reconcile.reconcile(ahead.secrets, ahead.step_at, SETTINGS, later).actions
    )


def test_an_adoption_whose_leaves_missed_the_bundle_gets_them_on_the_next_pass(tmp_path):
    """The CA Secret was written, a leaf's write was not: while adopting, every pass
    gives each leaf the bundle (the pairs unchanged)."""
    tool = installed_by_the_tool(tmp_path)
    begun = reconcile.reconcile(tool, None, SETTINGS, NOW)
    partial = {**begun.secrets, "gpu-scheduler-extender-tls": tool["gpu-scheduler-extender-tls"]}
    out = reconcile.reconcile(partial, begun.step_at, SETTINGS, NOW + dt.timedelta(minutes=1))
    assert out.changed == ["gpu-scheduler-extender-tls"]
    leaf = out.secrets["gpu-scheduler-extender-tls"]
    assert (
        leaf["ca.crt"] == begun.bundle
        and leaf["tls.crt"] == tool["gpu-scheduler-extender-tls"]["tls.crt"]
    )
