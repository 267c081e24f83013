"""A real OCI registry on loopback for the install e2e: the CNCF distribution registry
(``tools/k8s/build.sh registry`` builds it from its Go module), serving TLS with a CA
made here, so helm and containerd talk to it as they talk to ghcr.io: HTTPS, a
certificate they verify, no ``--plain-http`` and no insecure flags.

What trusts the CA: helm through ``SSL_CERT_FILE`` (Go reads it for its system roots;
:meth:`Registry.env`), buildah through ``--cert-dir`` and the lab's real node through
containerd's ``certs.d`` (:meth:`lab.realnode.RealNode.trust_registry`).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from lab.controlplane import BUILD_SCRIPT, LocalCluster
from lab.processes import Process, free_port, wait_url

HOW_TO_GET_IT = "the registry is not built: run `tools/k8s/build.sh registry` (`make test` does)"


def registry_binary() -> Path | None:
    """The registry's build (``tools/k8s/build.sh --path registry``), if it is there."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--path", "registry"], capture_output=True, text=True
    )
    path = Path(done.stdout.strip()) if done.returncode == 0 else None
    return path if path is not None and path.is_file() else None


@dataclass
class Registry:
    address: str  # host:port, what replaces ghcr.io in a reference
    ca_file: Path
    cert_dir: Path  # ca.crt alone: buildah's and docker's --cert-dir layout
    process: Process

    def env(self) -> dict[str, str]:
        """The environment for helm (any Go program) to trust the registry."""
        return {**os.environ, "SSL_CERT_FILE": str(self.ca_file)}


def _certificates(cert_dir: Path, server: Path) -> tuple[Path, Path, Path]:
    """The CA (in ``cert_dir``, alone: a key there would be taken for a client's) and
    the registry's pair for 127.0.0.1 and localhost (in ``server``)."""
    from cryptography.hazmat.primitives import serialization

    from certs import build

    now = dt.datetime.now(dt.UTC)
    ca_key, key = build.new_key(), build.new_key()
    ca = build.build_ca(ca_key, now, 1, "gpu-scheduler-lab-registry-ca")
    identity = build.Identity(("localhost",), tuple(build.parse_ips(["127.0.0.1"])))
    cert = build.build_serving_cert(key, identity, ca, ca_key, now, 1)
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = cert_dir / "ca.crt", server / "tls.crt", server / "tls.key"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(cert.public_bytes(pem))
    key_file.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_file, cert_file, key_file


def start_registry(cluster: LocalCluster, binary: Path) -> Registry:
    """The registry on 127.0.0.1 (a free port), a process of ``cluster`` (stopped with
    it), its storage and certificates in the cluster's folder."""
    work = cluster.workdir / "registry"
    work.mkdir(parents=True, exist_ok=True)
    cert_dir, server = work / "certs", work / "server"
    cert_dir.mkdir(exist_ok=True)
    server.mkdir(exist_ok=True)
    ca_file, cert_file, key_file = _certificates(cert_dir, server)
    address = f"127.0.0.1:{free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(work / "storage")}},
        "http": {
            "addr": address,
            "secret": os.urandom(16).hex(),
            "tls": {"certificate": str(cert_file), "key": str(key_file)},
        },
    }
    path = work / "config.yml"
    path.write_text(yaml.safe_dump(config))
    # No OpenTelemetry exporter: it would dial localhost:4318 for every request.
    env = {"OTEL_TRACES_EXPORTER": "none"}
    process = cluster.spawn("registry", [str(binary), "serve", str(path)], env)
    wait_url(f"https://{address}/v2/", 30, process, ca_file=ca_file)
    return Registry(address, ca_file, cert_dir, process)


def push_image(registry: Registry, image: str, reference: str) -> None:
    """``image`` from buildah's store (``make image``'s) to ``reference`` in the
    registry, as the release's build-push step leaves it on ghcr.io (one architecture
    here)."""
    from lab.realnode import archive

    env = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
    listed = subprocess.run(["buildah", "images", "--quiet", image], env=env, capture_output=True)
    if listed.returncode != 0:  # only its archive is here (tools/image/build.sh keeps both)
        subprocess.run(
            ["buildah", "pull", "--quiet", f"oci-archive:{archive(image)}:{image}"],
            env=env, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    done = subprocess.run(
        ["buildah", "push", "--quiet", f"--cert-dir={registry.cert_dir}", image,
         f"docker://{reference}"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"buildah push {image} {reference}: {done.stderr.strip()}")
