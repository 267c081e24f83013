#!/usr/bin/env bash
# `make image`: the project image from the repo's own Dockerfile, built daemonless
# (buildah, vfs storage, chroot isolation), and the pod sandbox image, for the lab.
#
# - base: a Debian root filesystem made here with debootstrap from Debian's packages
#   (python3, pip, CA certificates), pinned by suite and package set; it stands in
#   for python:3.11-slim, whose registry this machine cannot reach, and is passed to
#   the Dockerfile as BASE. The host's CA bundle is copied in, so pip inside the build
#   trusts what the host trusts (a TLS-intercepting proxy included).
# - pause: the sandbox process (tools/image/pause.c), static, on an empty image.
# - nvidia-smi: a stand-in for the driver's nvidia-smi (tools/image/nvidia-smi.c),
#   static, at /usr/bin/nvidia-smi on an empty image: what docs/examples/gpu-pod.yaml
#   runs on the lab's node, which has no GPU (lab/realnode.py tags it with its name).
# - gpu-scheduler: `buildah bud` of the Dockerfile on that base.
#
# Each image is cached by the hash of its inputs as an OCI archive under .cache/images/
# and loaded into buildah's store when missing there; a hit costs seconds. The names
# built are written to .cache/images/images.env (GPU_SCHEDULER_IMAGE, PAUSE_IMAGE,
# NVIDIA_SMI_IMAGE).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=.cache/images
SUITE=bookworm
PACKAGES=python3,python3-pip,python3-venv,ca-certificates
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot

for tool in buildah debootstrap gcc; do
  command -v "$tool" >/dev/null || {
    echo "make image needs $tool: apt-get install buildah debootstrap gcc" >&2; exit 1; }
done
mkdir -p "$CACHE"

digest() { sha256sum | cut -c1-12; }
have() { buildah images --quiet "$1" >/dev/null 2>&1; }

# cached NAME BUILD-FUNCTION: both the image in buildah's store and its archive (the
# lab's real node loads the archive into containerd): each made from the other when
# only one is there (another checkout on this machine built it), else built.
cached() {
  local name=$1 build=$2 archive="$CACHE/$(echo "$1" | tr '/:' '__').tar"
  if [ -f "$archive" ]; then
    have "$name" || buildah pull --quiet "oci-archive:$archive:$name" >/dev/null
    return
  fi
  have "$name" || "$build" "$name"
  buildah push --quiet "$name" "oci-archive:$archive.tmp:$name"
  mv "$archive.tmp" "$archive"
}

build_base() {
  local root
  root=$(mktemp -d /tmp/gpu-scheduler-base.XXXXXX)
  trap "rm -rf '$root'" RETURN
  echo "image: debootstrap $SUITE ($PACKAGES)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >/dev/null
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  local ctr mnt
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  cp -a "$root"/. "$mnt"/
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PIP_BREAK_SYSTEM_PACKAGES=1 --cmd /bin/sh "$ctr"
  buildah commit --quiet --rm "$ctr" "$1" >/dev/null
}

build_pause() {
  local dir ctr
  dir=$(mktemp -d /tmp/gpu-scheduler-pause.XXXXXX)
  trap "rm -rf '$dir'" RETURN
  gcc -Os -static -o "$dir/pause" tools/image/pause.c
  ctr=$(buildah from scratch)
  buildah copy --quiet "$ctr" "$dir/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah commit --quiet --rm "$ctr" "$1" >/dev/null
}

build_nvidia_smi() {
  local dir ctr
  dir=$(mktemp -d /tmp/gpu-scheduler-nvidia-smi.XXXXXX)
  trap "rm -rf '$dir'" RETURN
  gcc -Os -static -o "$dir/nvidia-smi" tools/image/nvidia-smi.c
  ctr=$(buildah from scratch)
  buildah copy --quiet "$ctr" "$dir/nvidia-smi" /usr/bin/nvidia-smi >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /usr/bin/nvidia-smi "$ctr"
  buildah commit --quiet --rm "$ctr" "$1" >/dev/null
}

build_project() {
  echo "image: buildah bud Dockerfile on $BASE"
  buildah bud --quiet --layers=false --build-arg "BASE=$BASE" -t "$1" . >/dev/null
}

base_inputs=$( (echo "$SUITE $PACKAGES"; declare -f build_base; sha256sum /etc/ssl/certs/ca-certificates.crt) | digest)
BASE=localhost/gpu-scheduler-base:$SUITE-$base_inputs
cached "$BASE" build_base

PAUSE=localhost/pause:lab-$( (cat tools/image/pause.c; declare -f build_pause) | digest)
cached "$PAUSE" build_pause

NVIDIA_SMI=localhost/nvidia-smi:lab-$( (cat tools/image/nvidia-smi.c; declare -f build_nvidia_smi) | digest)
cached "$NVIDIA_SMI" build_nvidia_smi

project_inputs=$( (echo "$BASE"; git ls-files -z Dockerfile .dockerignore pyproject.toml README.md \
  gpu_scheduler extender webhook agent certs | xargs -0 sha256sum) | digest)
IMAGE=localhost/gpu-scheduler:dev-$project_inputs
cached "$IMAGE" build_project

# The image runs as the deploy/ pods do: uid 65532, the console script on PATH.
ctr=$(buildah from --quiet "$IMAGE")
buildah run --user 65532:65532 "$ctr" -- gpu-scheduler --version
buildah rm "$ctr" >/dev/null

# Earlier builds of the project image (other sources) go; base and pause stay.
for old in "$CACHE"/localhost_gpu-scheduler_dev-*.tar; do
  [ "$old" = "$CACHE/$(echo "$IMAGE" | tr '/:' '__').tar" ] || rm -f "$old"
done
buildah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/gpu-scheduler:dev-' \
  | grep -vx "$IMAGE" | xargs -r buildah rmi --force >/dev/null 2>&1 || true

printf 'GPU_SCHEDULER_IMAGE=%s\nPAUSE_IMAGE=%s\nBASE_IMAGE=%s\nNVIDIA_SMI_IMAGE=%s\n' \
  "$IMAGE" "$PAUSE" "$BASE" "$NVIDIA_SMI" > "$CACHE/images.env"
echo "image: $IMAGE (pause: $PAUSE, nvidia-smi: $NVIDIA_SMI)"
