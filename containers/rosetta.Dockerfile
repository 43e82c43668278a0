# rosetta-<env>:<variant>: one environment's lock, installed offline and hash-checked, and nothing else. One recipe
# for all four environments (torch, tf, jax, validation) and both variants: what differs between them is data in
# pyproject.toml's [tool.rosetta.environments], passed as build arguments by `python -m pipelines.images build`:
#   ENV_NAME     the environment (its lock is the build context's requirements.lock)
#   TITLE        how the image describes it
#   BASE_IMAGE   its `cuda_base` (pinned there), or for CPU the local Debian base rosetta-base:bookworm
#   VARIANT, REVISION, FRAMEWORK, FRAMEWORK_VERSION, LOCK_SHA256: labels
# Our own code (packages/common, the framework package, pipelines) is not in the image: the runner mounts the
# checkout and puts it on PYTHONPATH, so a stage always runs the code it was started from (as the local runtime).
# The build context holds only requirements.lock and wheels/ (the lock's wheels, downloaded on the host).
# No default base: each environment needs its own (CUDA 12 or 13, cuDNN or not), so a build without one must fail.
ARG BASE_IMAGE

FROM ${BASE_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Python 3.11, the interpreter every lock is resolved for. Debian bookworm (the CPU base) has it; Ubuntu 22.04
# (the CUDA bases) has 3.10, and its archive's python3.11 is a 3.11.0 release-candidate build, so there it comes
# from the deadsnakes PPA. Unpinned apt versions: the PPA keeps only its latest build, and the lock (not apt) pins
# everything the stages import.
# hadolint ignore=DL3008
RUN if python3.11 -c 'import ensurepip, venv' 2>/dev/null; then exit 0; fi \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends software-properties-common gpg-agent \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && apt-get purge -y --auto-remove software-properties-common gpg-agent \
 && rm -rf /var/lib/apt/lists/*
# The image's own user; the runner still passes --user $(id -u):$(id -g) so outputs belong to whoever ran dvc.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin rosetta

FROM python AS install
COPY requirements.lock /tmp/rosetta/requirements.lock
COPY wheels/ /tmp/rosetta/wheels/
# No index, no network, no credential: every file must match a hash in the lock. pip runs from a throwaway
# installer venv (this stage only), so the runtime venv holds exactly the lock and not pip itself.
RUN python3.11 -m venv /opt/installer \
 && python3.11 -m venv --without-pip /opt/venv \
 && /opt/installer/bin/pip --python /opt/venv/bin/python install --no-cache-dir --disable-pip-version-check \
      --no-index --find-links /tmp/rosetta/wheels --only-binary :all: --require-hashes \
      -r /tmp/rosetta/requirements.lock

FROM python
ARG BASE_IMAGE
ARG ENV_NAME
ARG TITLE=${ENV_NAME}
ARG VARIANT=cuda
ARG REVISION=unknown
ARG FRAMEWORK=unknown
ARG FRAMEWORK_VERSION=unknown
ARG LOCK_SHA256=unknown
LABEL org.opencontainers.image.title="rosetta-${ENV_NAME}" \
      org.opencontainers.image.description="Rosetta ${TITLE} environment (${VARIANT}); code mounted at run time" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      rosetta.environment="${ENV_NAME}" \
      rosetta.variant="${VARIANT}" \
      rosetta.framework="${FRAMEWORK}" \
      rosetta.framework.version="${FRAMEWORK_VERSION}" \
      rosetta.lock.sha256="${LOCK_SHA256}"
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so a runtime can tell it is not root without reading /etc/passwd (e.g. runAsNonRoot).
USER 10001:10001
CMD ["python"]
# Last, so the metadata above adds no layer copy of the big environment (storage drivers like vfs copy per layer).
COPY --from=install /opt/venv /opt/venv
