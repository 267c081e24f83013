# The one project image: `gpu-scheduler <extender|webhook|agent|...>` picks the component.
# Build: docker build -t ghcr.io/gpu-scheduler/gpu-scheduler:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_scheduler gpu_scheduler
COPY extender extender
COPY webhook webhook
COPY agent agent
COPY certs certs
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Non-root by default; the agent's DaemonSet documents what NVML needs.
USER 65532:65532
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["gpu-scheduler"]
CMD ["--help"]
