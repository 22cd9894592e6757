# One image for every faultmesh service; the command picks the service:
#   noded | deviced | clusterd | faultmesh (CLI)
# Build: docker build -t faultmesh/faultmesh:0.1.0 .
# (This repository's CI machine has no Docker engine; the image is built on a workstation or in a
# registry pipeline. See docs/deploy.md.)

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc: wheels that lack a manylinux build for the target (e.g. uvloop on some arches).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
COPY proto ./proto
RUN python -m venv /opt/faultmesh \
 && /opt/faultmesh/bin/pip install --upgrade pip \
 && /opt/faultmesh/bin/pip install .

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="faultmesh" \
      org.opencontainers.image.description="Fault detection, slow-node and slow-network diagnosis for AI training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
# ipmitool: operators debug BMC access from inside the noded container; tini: PID 1 that forwards
# SIGTERM so the daemons drain their streams and flush state.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ipmitool tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 faultmesh \
 && useradd --system --uid 10001 --gid faultmesh --home-dir /var/lib/faultmesh --shell /usr/sbin/nologin faultmesh \
 && mkdir -p /var/lib/faultmesh /etc/faultmesh \
 && chown faultmesh:faultmesh /var/lib/faultmesh
COPY --from=build /opt/faultmesh /opt/faultmesh
ENV PATH=/opt/faultmesh/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# clusterd runs as this user. noded and deviced need root plus a privileged container for DCMI
# (/dev/davinci*); the chart sets that per container (values.yaml explains each privilege).
USER 10001:10001
WORKDIR /var/lib/faultmesh
EXPOSE 8899 8080 11251 11255
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["clusterd", "--grpc-addr", "0.0.0.0:8899", "--http-addr", "0.0.0.0:8080", "--state-dir", "/var/lib/faultmesh"]
