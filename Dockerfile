# attnserve: the gRPC server with the bundled models, as a non-root container.
#   podman build -t attnserve .            then   podman run -p 50051:50051 -p 9464:9464 attnserve
# GPU (needs a base whose CUDA 13 and cuDNN 9 match onnxruntime-gpu 1.31.1, whose wheel is built for CUDA 13
# (bench/README.md), and Python >= 3.11):
#   podman build --build-arg BASE=docker.io/nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04 --build-arg EXTRA=gpu ...
# BASE must provide python3 with venv and ca-certificates (deploy/smoke-container.sh builds such a base
# from Debian packages where no registry is reachable). PIP_CERT names a CA bundle that the build mounts
# for pip behind a TLS-inspecting proxy; it is a path only, nothing of it is stored in the image.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

# ---- build: sdist, then the wheel from the sdist (the gRPC stubs are generated here) ----
FROM ${BASE} AS build
ARG PIP_CERT
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY protos/ protos/
COPY server/ server/
COPY clients/ clients/
COPY export/ export/
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --disable-pip-version-check build==1.6.1 \
    && /opt/build/bin/python -m build --outdir /dist .

# ---- runtime: the wheel and the serving dependencies only (no torch, no compilers) ----
FROM ${BASE} AS runtime
ARG PIP_CERT
# cpu (onnxruntime) or gpu (onnxruntime-gpu)
ARG EXTRA=cpu
COPY --from=build /dist/ /tmp/dist/
RUN python3 -m venv /opt/attnserve \
    && /opt/attnserve/bin/pip install --no-cache-dir --disable-pip-version-check \
        "$(echo /tmp/dist/attnserve-*.whl)[${EXTRA}]" \
    && rm -rf /tmp/dist \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin attnserve
COPY models/ /models/
COPY deploy/healthcheck.py /usr/local/bin/attnserve-healthcheck
ENV PATH=/opt/attnserve/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
EXPOSE 50051 9464
# Asks the gRPC health service of the default port (SERVING once the models are loaded).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/opt/attnserve/bin/python", "/usr/local/bin/attnserve-healthcheck", "localhost:50051"]
# Exec form: attnserve is PID 1 and gets SIGTERM itself: health NOT_SERVING, 10 s to drain, exit 0.
ENTRYPOINT ["attnserve"]
# gRPC and metrics listen on all of the container's interfaces (the server's default for both is loopback,
# which nothing outside the container reaches); they leave the host only where 50051 and 9464 are published.
CMD ["serve", "--models", "/models", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9464", \
     "--metrics-host", "0.0.0.0"]
