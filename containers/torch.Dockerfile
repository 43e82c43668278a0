# rosetta-torch: the torch environment's lock, installed offline and hash-checked, and nothing else.
# Our own code (packages/common, packages/torch_impl, pipelines) is not in the image: the runner mounts the
# checkout and puts it on PYTHONPATH, so a stage always runs the code it was started from (as the local runtime).
#
# Built by `python -m pipelines.containers build --variant cpu|cuda torch` (see containers/README.md), with a
# build context that holds only requirements.lock and wheels/ (the lock's wheels, downloaded on the host).
#
# CUDA (the default base): torch's CUDA 13 wheels bring their own CUDA libraries, so the small `base` flavour is
# enough; it still sets NVIDIA_REQUIRE_CUDA, so a driver too old for CUDA 13 is refused at start, not mid-stage.
# CPU: the same recipe with --build-arg BASE_IMAGE=rosetta-base:bookworm (made locally) and VARIANT=cpu.
ARG BASE_IMAGE=nvidia/cuda:13.0.3-base-ubuntu22.04@sha256:73ab6dfb3814a5097cd456736e70650ef9dc72343be4117d0400de78168760fe

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
ARG VARIANT=cuda
ARG REVISION=unknown
ARG FRAMEWORK_VERSION=unknown
ARG LOCK_SHA256=unknown
LABEL org.opencontainers.image.title="rosetta-torch" \
      org.opencontainers.image.description="Rosetta PyTorch environment (${VARIANT}); code mounted at run time" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      rosetta.environment="torch" \
      rosetta.variant="${VARIANT}" \
      rosetta.framework="torch" \
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
