# The one project image: `gpu-scheduler <extender|webhook|agent|...>` picks the component.
#
#   docker build -t ghcr.io/gpu-scheduler/gpu-scheduler:0.2.0 .
#   docker push ghcr.io/gpu-scheduler/gpu-scheduler:0.2.0
#
# The base is pinned by version (Python patch release and Debian release). For a
# reproducible build pin it by digest too:
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   # shows the digest
#   docker build --build-arg BASE=python:3.11.14-slim-bookworm@sha256:<digest> ...
# README "The image" says how to point the chart or the kustomization at your image.
ARG BASE=python:3.11.14-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_scheduler gpu_scheduler
COPY extender extender
COPY webhook webhook
COPY agent agent
COPY certs certs
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE}
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Non-root by default; the agent's DaemonSet documents what NVML needs.
USER 65532:65532
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["gpu-scheduler"]
CMD ["--help"]
