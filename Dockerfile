# tiermem server image: `docker build -t tiermem .` (docs/deploy.md).
#
# Two stages: `build` installs the package (`pip install .`) into a virtual environment at
# /opt/tiermem, with a compiler at hand for any dependency that has no wheel for the platform;
# the runtime stage copies that environment into a slim Python and runs it as a non-root user.

ARG PYTHON_VERSION=3.12
# The image both stages start from: the official slim Python unless told otherwise
# (deploy/check-image.sh passes a Debian image made with debootstrap, to build without Docker Hub).
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/tiermem \
    && /opt/tiermem/bin/pip install --upgrade pip
WORKDIR /src
# Only what the package is built from (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY server ./server
COPY client ./client
COPY kernels ./kernels
COPY integrations ./integrations
RUN /opt/tiermem/bin/pip install .

FROM ${BASE_IMAGE} AS runtime
LABEL org.opencontainers.image.title="tiermem" \
      org.opencontainers.image.description="A gRPC memory server for AI agents" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tiermem \
    && useradd --system --uid 10001 --gid tiermem --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tiermem \
    && mkdir -p /data /var/cache/tiermem \
    && chown tiermem:tiermem /data /var/cache/tiermem
COPY --from=build /opt/tiermem /opt/tiermem
# TIERMEM_* are the server's settings (docs/configuration.md). Numba keeps its compiled kernels
# in NUMBA_CACHE_DIR: /opt/tiermem is not writable by the server's user.
ENV PATH=/opt/tiermem/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/var/cache/tiermem/numba \
    TIERMEM_DATA_DIR=/data \
    TIERMEM_HOST=0.0.0.0 \
    TIERMEM_PORT=50051
USER tiermem
# Compile the kernels once into the image's cache: a container on a machine with the same CPU
# starts without compiling (another CPU compiles at start, up to a minute, before SERVING).
RUN python -c "from tiermem.kernels import warm_up; warm_up()"
VOLUME ["/data"]
EXPOSE 50051
# The server drains calls, writes and an index snapshot on SIGTERM: give it time (docker stop -t,
# compose stop_grace_period).
STOPSIGNAL SIGTERM
# Health checks need no API key. With TLS, override this check to dial a name the certificate
# holds, with --tls-ca (deploy/compose.yaml does).
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["tiermem", "health", "--target", "127.0.0.1:50051", "--timeout", "5"]
# The server refuses an address other than loopback (here 0.0.0.0) without TLS and API keys.
# This default runs WITHOUT them (--insecure), for a trial on a private network only. Production
# deployments mount a keys file and a certificate and key, and set TIERMEM_API_KEYS,
# TIERMEM_TLS_CERT and TIERMEM_TLS_KEY instead (deploy/compose.yaml, docs/deploy.md):
#   docker run ... tiermem tiermem-server
CMD ["tiermem-server", "--insecure"]
