# syntax=docker/dockerfile:1
# The Keyrange coordinator image. Two stages: the builder resolves and installs everything into
# a virtualenv; the runtime stage copies only that venv onto a clean slim base, so no compiler,
# pip cache or source tree ships.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, from pyproject.toml alone: a source change then reuses this layer.
# The image runs the coordinator: the base dependencies, the `server` extra, and `otel`, so
# tracing is switched on by OTEL_* variables alone (docs/operations.md, "Tracing").
COPY pyproject.toml ./
RUN python -c "import tomllib; project = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = project['optional-dependencies']; print('\n'.join(project['dependencies'] + extras['server'] + extras['otel']))" > /tmp/requirements.txt \
    && pip install --no-cache-dir --requirement /tmp/requirements.txt

# A C compiler, in this stage only, for the package's optional C modules: the commit path's
# merge and write literals (coordinator/core/_commit.c, coordinator/offsets/_literals.c; a
# third of the coordinator's CPU per commit, docs/offsets.md) and the key filter
# (client.protocol._keyfilter, for workers built on this image). The runtime stage gets the
# built venv and no compiler. Debian's security updates replace these versions, so they are
# not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# The package itself, without dependencies: they are all in the layer above.
COPY README.m[d] ./
COPY coordinator ./coordinator
COPY client ./client
COPY migrations ./migrations
RUN pip install --no-cache-dir --no-deps .


FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="keyrange" \
      org.opencontainers.image.description="Keyrange coordinator: cooperative key-range consumption for Apache Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"

# pip compiled the bytecode at build time; at run time the root filesystem is read-only.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KEYRANGE_HOST=0.0.0.0 \
    KEYRANGE_PORT=8080

# A numeric UID, so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 10001 keyrange \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin keyrange

COPY --from=builder /opt/venv /opt/venv

# The one writable place when the root filesystem is read-only (an emptyDir in Kubernetes).
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080

# Slim images have no curl: probe /livez with the standard library.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('KEYRANGE_PORT', '8080') + '/livez', timeout=2)"]

# `docker run IMAGE` serves; `docker run IMAGE migrate --wait-for-db 120` migrates and exits.
ENTRYPOINT ["keyrange"]
CMD ["serve"]
