"""A real node for the local cluster: containerd, runc, a CNI bridge and a kubelet.

Pods placed on it really run, from the images ``make image`` builds. Everything the
node creates on the host is kept where it can be found again and removed:

- containerd's root and state (snapshots, shims' bundles, the pods' network
  namespaces, which ``netns_mounts_under_state_dir`` keeps there) and the kubelet's
  root sit in one short directory per node (:data:`HOST_DIR`);
- the kubelet's cgroups sit under their own ``cgroupRoot`` in every v1 hierarchy;
- the pods' bridge (:data:`BRIDGE`, on the private range :data:`POD_CIDR`) and one
  iptables DNAT rule tagged :data:`RULE_TAG`.

:func:`sweep` removes all of it: mounts, network namespaces, cgroups, processes (by
pid: containerd, its shims, the containers in our cgroups, the kubelet), the bridge
and the rule. :meth:`RealNode.stop` calls it, and so does :func:`start_real_node`
before it starts, so a run that died leaves nothing for the next one.

What stands in for kube-proxy: pods find the API server through the ``kubernetes``
Service (:data:`SERVICE_IP`:443, the in-cluster client's default). One DNAT rule sends
that from the bridge to the API server, which then listens on the bridge's gateway
too; its certificate names the Service IP. The API server reaches pods directly
(``--enable-aggregator-routing``), so webhook Services work without kube-proxy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab.kubelet_shim import REAL_PROVIDER
from lab.processes import ControlPlaneError, Process, free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
HOST_DIR = Path("/run/gpu-scheduler-lab")  # short: containerd's socket path is limited
#: The kubelet's device-plugin directory: a constant of the kubelet, not under its
#: --root-dir, so the real node's kubelet keeps its device checkpoint and sockets here
#: (a device plugin's resources would come back from the checkpoint on the next node).
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
BRIDGE = "gslab0"
POD_CIDR = "10.213.7.0/24"
GATEWAY = "10.213.7.1"
SERVICE_IP = "10.96.0.1"  # first address of the control plane's service range
RULE_TAG = "gpu-scheduler-lab"
NETWORK = "gpu-scheduler-lab"  # the CNI network's name
CNI_CACHE = Path("/var/lib/cni/results")
CGROUP_ROOT = "gpu-scheduler-lab"
CGROUP_FS = Path("/sys/fs/cgroup")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
IMAGES_ENV = ROOT / ".cache" / "images" / "images.env"
#: The README's GPU pod, run on the node as written.
EXAMPLE = ROOT / "docs" / "examples" / "gpu-pod.yaml"
#: The image it names (a CUDA base image, whose nvidia-smi the NVIDIA container toolkit
#: brings): on the lab's node, the stand-in nvidia-smi image (NVIDIA_SMI_IMAGE, from
#: tools/image/nvidia-smi.c) under that name, so the pod runs nvidia-smi and exits 0.
EXAMPLE_IMAGE: str = yaml.safe_load(EXAMPLE.read_text())["spec"]["containers"][0]["image"]
#: The image of the tests' pods that run until deleted: the lab's pause image under
#: this name.
SLEEPER_IMAGE = "registry.k8s.io/pause:3.10"
TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip")


def images() -> dict[str, str]:
    """The names ``make image`` built (GPU_SCHEDULER_IMAGE, PAUSE_IMAGE, ...)."""
    if not IMAGES_ENV.is_file():
        return {}
    pairs = (line.split("=", 1) for line in IMAGES_ENV.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def archive(image: str) -> Path:
    return IMAGES_ENV.parent / (image.replace("/", "_").replace(":", "_") + ".tar")


def full_reference(image: str) -> str:
    """``image`` as containerd stores it, which is how the kubelet looks it up:
    ``nvidia/cuda:12.9.1-base-ubuntu22.04`` is ``docker.io/nvidia/cuda:...``, ``busybox``
    ``docker.io/library/busybox``; a name whose first part is a host stays as it is."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if rest else f"docker.io/library/{image}"


def cni_bin_dir() -> str | None:
    return next((d for d in CNI_BIN_DIRS if Path(d, "bridge").is_file()), None)


def missing() -> str | None:
    """Why a real node cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, mounts, network namespaces, cgroups)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return (
            f"a real node needs {', '.join(absent)}: "
            "apt-get install containerd runc iptables iproute2"
        )
    if cni_bin_dir() is None:
        return "a real node needs the CNI plugins: apt-get install containernetworking-plugins"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "a real node needs the overlay filesystem (containerd's overlayfs snapshotter)"
    if not (CGROUP_FS / "memory").is_dir() and not (CGROUP_FS / "cgroup.controllers").is_file():
        return "a real node needs cgroups mounted at /sys/fs/cgroup"
    names = images()
    for key in ("GPU_SCHEDULER_IMAGE", "PAUSE_IMAGE", "NVIDIA_SMI_IMAGE"):
        if key not in names or not archive(names[key]).is_file():
            return f"a real node needs the images: run `make image` ({key} not built)"
    return None


def _run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ControlPlaneError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


# --- cleanup -------------------------------------------------------------------------


def _cgroup_dirs() -> list[Path]:
    """Our cgroup directories in every hierarchy, deepest first."""
    found: list[Path] = []
    for top in CGROUP_FS.glob(f"*/{CGROUP_ROOT}"):
        found.extend(path for path, _, _ in os.walk(top))
    for top in CGROUP_FS.glob(CGROUP_ROOT):  # unified (v2) layout
        found.extend(path for path, _, _ in os.walk(top))
    return sorted((Path(p) for p in found), key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for directory in _cgroup_dirs():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
    return pids


def _processes_of(needle: str) -> set[int]:
    """Pids whose command line mentions ``needle`` (our containerd's root, our
    kubelet's config): shims daemonize, so they are found by what they were given."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace"
            ):
                pids.add(int(proc.name))
    return pids


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.1)


def _mounts_under(prefix: Path) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(prefix) or point.startswith(f"{prefix}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _iptables_rules() -> list[list[str]]:
    done = _run("iptables", "-t", "nat", "-S", "PREROUTING", check=False)
    return [line.split()[1:] for line in done.stdout.splitlines() if RULE_TAG in line]


def sweep() -> None:
    """Remove everything a real node (this run's or a dead run's) left on the host."""
    _kill(_processes_of(str(HOST_DIR)) | _cgroup_pids())
    for point in _mounts_under(HOST_DIR):
        _run("umount", "-l", point, check=False)
    for directory in _cgroup_dirs():
        with contextlib.suppress(OSError):
            directory.rmdir()
    shutil.rmtree(HOST_DIR, ignore_errors=True)
    for left in DEVICE_PLUGINS.glob("*"):  # the checkpoint and the sockets
        left.unlink(missing_ok=True)
    for cached in CNI_CACHE.glob(f"{NETWORK}-*"):  # libcni's results of our network
        cached.unlink(missing_ok=True)
    for rule in _iptables_rules():
        _run("iptables", "-t", "nat", "-D", *rule, check=False)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "delete", BRIDGE, check=False)


def leftovers() -> list[str]:
    """What :func:`sweep` would still find: empty after a clean stop."""
    found = [f"mount {p}" for p in _mounts_under(HOST_DIR)]
    found += [f"cgroup {p}" for p in _cgroup_dirs()]
    found += [f"process {p}" for p in sorted(_processes_of(str(HOST_DIR)))]
    found += [f"iptables {' '.join(r)}" for r in _iptables_rules()]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"link {BRIDGE}")
    if HOST_DIR.exists():
        found.append(f"directory {HOST_DIR}")
    found += [f"file {p}" for p in CNI_CACHE.glob(f"{NETWORK}-*")]
    found += [f"file {p}" for p in DEVICE_PLUGINS.glob("*")]
    return found


# --- start ---------------------------------------------------------------------------


def _network(api_port: int) -> None:
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    _run(
        "iptables", "-t", "nat", "-A", "PREROUTING", "-i", BRIDGE, "-d", SERVICE_IP,
        "-p", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination", f"{GATEWAY}:{api_port}",
        "-m", "comment", "--comment", RULE_TAG,
    )  # fmt: skip


def _cgroups() -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy (it must exist beforehand)."""
    for hierarchy in CGROUP_FS.iterdir():
        if not (hierarchy / "cgroup.procs").is_file():
            continue
        mine = hierarchy / CGROUP_ROOT
        mine.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset admits no task
            if (hierarchy / name).is_file():
                (mine / name).write_text((hierarchy / name).read_text())


def _containerd_config(home: Path, pause: str) -> Path:
    cni = home / "cni"
    cni.mkdir(parents=True)
    (cni / "10-lab.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": NETWORK,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(home / "ipam"),
                        },
                    },
                    {"type": "loopback"},
                ],
            }
        )
    )
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = home / "containerd.toml"
    config.write_text(
        f"""version = 2
root = "{home}/containerd/root"
state = "{home}/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{home}/containerd.sock"
[{cri}]
  sandbox_image = "{pause}"
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  # Lowering oom_score_adj needs a privilege this kind of VM does not grant (runc's
  # init fails on it); cap pods at containerd's own score instead.
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  Root = "{home}/runc"
[{cri}.registry]
  # Where trust_registry puts a registry's CA; read at each pull.
  config_path = "{home}/certs.d"
[{cri}.cni]
  bin_dir = "{cni_bin_dir()}"
  conf_dir = "{cni}"
"""
    )
    return config


def _kubelet_config(home: Path, name: str, client_ca: Path) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This lab VM has cgroup v1; Kubernetes 1.37 still runs on it when asked.
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "containerRuntimeEndpoint": f"unix://{home}/containerd.sock",
        "address": GATEWAY,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        # The API server's client certificate (logs, exec), signed by the cluster's CA.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(home / "pod-logs"),
        "resolvConf": "",
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": False,
        # The host's disks belong to whoever runs the tests: never evict for them.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
            "nodefs.inodesFree": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "maxPods": 20,
        "serializeImagePulls": False,
        "registerNode": True,
        "providerID": f"{REAL_PROVIDER}{name}",
    }
    path = home / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class RealNode:
    """A running real node; :meth:`stop` removes every trace of it."""

    name: str
    home: Path
    containerd: Process
    kubelet: Process

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} {p.log_path}\n{p.tail(60)}" for p in (self.containerd, self.kubelet)
        )

    def trust_registry(self, address: str, ca_file: Path) -> None:
        """Let the node's containerd pull from ``address`` (host:port) over HTTPS,
        verifying its certificate with ``ca_file``: a ``certs.d`` hosts.toml."""
        hosts = self.home / "certs.d" / address
        hosts.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ca_file, hosts / "ca.crt")
        (hosts / "hosts.toml").write_text(
            f'server = "https://{address}"\n\n[host."https://{address}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  ca = "{hosts / "ca.crt"}"\n'
        )

    def stop(self) -> None:
        self.kubelet.stop(grace=5)
        self.containerd.stop(grace=5)
        sweep()


def start_real_node(
    cluster: Any,
    name: str,
    labels: dict[str, str] | None = None,
    *,
    taints: list[dict[str, str]] | None = None,
    timeout: float = 180,
) -> RealNode:
    """containerd and a kubelet registered as Node ``name`` in ``cluster`` (a
    :class:`lab.controlplane.LocalCluster` started with ``real_node=True``), with the
    lab's images loaded; returns once the Node is Ready."""
    reason = missing()
    if reason:
        raise ControlPlaneError(reason)
    sweep()
    home = HOST_DIR
    home.mkdir(parents=True)
    names = images()
    try:
        _network(cluster.api_port)
        _cgroups()
        containerd = cluster.spawn(
            f"containerd-{name}",
            ["containerd", f"--config={_containerd_config(home, names['PAUSE_IMAGE'])}"],
        )
        sock = home / "containerd.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            if not containerd.alive() or time.monotonic() > deadline:
                raise ControlPlaneError(f"containerd did not start:\n{containerd.tail()}")
            time.sleep(0.2)
        for key in ("PAUSE_IMAGE", "GPU_SCHEDULER_IMAGE", "NVIDIA_SMI_IMAGE"):
            _run(
                "ctr", f"--address={sock}", "--namespace=k8s.io", "images", "import",
                str(archive(names[key])), timeout=300,
            )  # fmt: skip
        for key, alias in (("PAUSE_IMAGE", SLEEPER_IMAGE), ("NVIDIA_SMI_IMAGE", EXAMPLE_IMAGE)):
            _run(
                "ctr", f"--address={sock}", "--namespace=k8s.io", "images", "tag", "--force",
                names[key], full_reference(alias),
            )  # fmt: skip
        node_labels = ",".join(f"{k}={v}" for k, v in (labels or {}).items())
        node_taints = ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in taints or [])
        kubelet = cluster.spawn(
            f"kubelet-{name}",
            [
                str(cluster.binary),
                "kubelet",
                f"--config={_kubelet_config(home, name, cluster.ca_file)}",
                f"--kubeconfig={cluster.kubeconfig}",
                f"--hostname-override={name}",
                f"--node-ip={GATEWAY}",
                f"--root-dir={home / 'kubelet'}",
                f"--cert-dir={home / 'kubelet-pki'}",
                *([f"--node-labels={node_labels}"] if node_labels else []),
                *([f"--register-with-taints={node_taints}"] if node_taints else []),
                "-v=1",
            ],
        )
        node = RealNode(name, home, containerd, kubelet)
        _wait_ready(cluster, node, timeout)
    except BaseException:
        for proc in ("kubelet", "containerd"):
            cluster.stop_process(f"{proc}-{name}")
        sweep()
        raise
    return node


def _wait_ready(cluster: Any, node: RealNode, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not node.kubelet.alive():
            raise ControlPlaneError(f"the kubelet exited:\n{node.kubelet.tail(80)}")
        out = cluster.k8s("kubectl", "get", "node", node.name, "-o", "json", check=False)
        with contextlib.suppress(ValueError):
            conditions = json.loads(out).get("status", {}).get("conditions", [])
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                return
        time.sleep(1)
    raise ControlPlaneError(f"node {node.name} not Ready after {timeout:.0f}s\n{node.logs()}")
