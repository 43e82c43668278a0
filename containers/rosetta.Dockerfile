# rosetta-<env>:<variant>: one environment's lock, installed offline and hash-checked, and nothing else. One recipe
# for all four environments (torch, tf, jax, validation) and both variants (cpu, cuda): what differs between them
# is data (pyproject.toml's [tool.rosetta.environments] and the locks), passed as build arguments by
# `python -m tooling.build.images build`:
#   ENV_NAME     the environment (its lock is the build context's requirements.lock)
#   TITLE        how the image describes it
#   BASE_IMAGE   rosetta-base:bookworm for both variants: Debian bookworm made locally by debootstrap (its python3 is the
#                locks' 3.11). The CUDA variant needs no CUDA base: the locks bring the CUDA libraries as nvidia-*
#                wheels, and the driver (libcuda) comes from the host through the NVIDIA container toolkit.
#   VARIANT      cpu or cuda: picks the stage the image ends on (`cuda` adds the NVIDIA environment below)
#   NVIDIA_REQUIRE_CUDA, CUDA_LIBRARY_PATH   cuda only, computed from the lock and its wheels
#   REVISION, FRAMEWORK, FRAMEWORK_VERSION, LOCK_SHA256, RECIPE_SHA256: labels
# Our own code (packages/common, the framework package, pipelines) is not in the image: the runner mounts the
# checkout and puts it on PYTHONPATH, so a stage always runs the code it was started from (as the local runtime).
# The build context holds only requirements.lock and wheels/ (the lock's wheels, downloaded on the host).
# No default base: a build that names none must fail rather than silently use some other image.
ARG BASE_IMAGE
ARG VARIANT=cpu

FROM ${BASE_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Python 3.11 with venv, the interpreter every lock is resolved for, comes with the base (Debian bookworm's
# python3 and python3-venv); a base without it fails at this step, saying so, not halfway through the install.
RUN python3.11 -c 'import ensurepip, venv' \
 || { echo "error: the base image has no Python 3.11 with venv (ensurepip); use rosetta-base:bookworm" >&2; exit 1; }
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

FROM python AS cpu

# What an nvidia/cuda base image would have set, and what the NVIDIA container toolkit reads when the container
# starts: expose every GPU the engine was given (--gpus / CDI), with the compute and utility (nvidia-smi, NVML)
# driver libraries, and refuse a driver older than the CUDA major the wheels need (NVIDIA_REQUIRE_CUDA, e.g.
# "cuda>=13.0": CUDA minor version compatibility lets any 13.x runtime run on a 13.0 driver). LD_LIBRARY_PATH
# holds the lib folders of the nvidia-* wheels: the frameworks find those themselves, ONNX Runtime's CUDA provider
# only through the loader's path. What such a base adds and this one does not: the cuda-compat package (a newer
# libcuda for older data-centre drivers), and CUDA tools outside the wheels (none of which the stages use).
FROM python AS cuda
ARG NVIDIA_REQUIRE_CUDA
ARG CUDA_LIBRARY_PATH
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA=${NVIDIA_REQUIRE_CUDA} \
    LD_LIBRARY_PATH=${CUDA_LIBRARY_PATH}

# The image: the variant's stage above, then what every image has.
FROM ${VARIANT}
ARG BASE_IMAGE
ARG ENV_NAME
ARG TITLE=${ENV_NAME}
ARG VARIANT
ARG REVISION=unknown
ARG FRAMEWORK=unknown
ARG FRAMEWORK_VERSION=unknown
ARG LOCK_SHA256=unknown
ARG RECIPE_SHA256=unknown
LABEL org.opencontainers.image.title="rosetta-${ENV_NAME}" \
      org.opencontainers.image.description="Rosetta ${TITLE} environment (${VARIANT}); code mounted at run time" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      rosetta.environment="${ENV_NAME}" \
      rosetta.variant="${VARIANT}" \
      rosetta.framework="${FRAMEWORK}" \
      rosetta.framework.version="${FRAMEWORK_VERSION}" \
      rosetta.lock.sha256="${LOCK_SHA256}" \
      rosetta.recipe.sha256="${RECIPE_SHA256}"
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
