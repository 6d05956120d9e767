# The course image for classroom servers and GPU machines.
#
# Base: the Jupyter Docker Stacks PyTorch image, CUDA 12 variant, pinned to one dated
# build. It brings the non-root user jovyan, tini, the healthcheck and the start scripts
# (start-notebook.py, and jupyterhub-singleuser for JupyterHub), all kept as they are.
# Its own torch is replaced below by the course pins, which bring their CUDA libraries
# as wheels, so the base's CUDA variant only decides what it preinstalled: its torch
# for CUDA 12 and the nvidia-*-cu12 wheels, removed first (see below; a cuda13- tag
# would not preinstall them, but none could be checked here).
#
#   docker build -t multi-gpu-course .
#   docker run --rm --gpus all --shm-size=2g -p 127.0.0.1:8888:8888 \
#       -e JUPYTER_TOKEN multi-gpu-course
#
# The token is never set here: pass JUPYTER_TOKEN at run time, or read the random one
# that start-notebook.py prints.
#
# A graded course (nbgrader) builds its image with --build-arg GRADED=1: the rooms'
# reference solutions are locked (`labkit lock-references` keeps the exercise index,
# drops the solved code), so checks.use_reference has nothing to hand out, and
# LABKIT_GRADED=1 makes a check passed on a reference fail (no points).
FROM quay.io/jupyter/pytorch-notebook:x86_64-cuda12-2026-02-09

# Where the course's torch and torchvision come from: the same versions as
# env/requirements.txt, from PyPI, i.e. exactly the build `make test` runs (torch
# 2.14.1+cu130: CUDA 13.0, NVIDIA driver >= 580 by CUDA's minor-version compatibility).
# download.pytorch.org has torch 2.14 for CUDA 12.6, 13.0 and 13.2 only (its CUDA 12.8
# builds ended with 2.12): on hosts with a CUDA 12 driver (>= 525) pass
# --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 (Maxwell to Hopper, no
# Blackwell). That index cannot be reached from the course's development machines; the
# GPU lane's `docker build` is what checks the index it is given.
ARG TORCH_INDEX=https://pypi.org/simple
ARG GRADED=0
# Where everything else comes from (pip reads PIP_INDEX_URL): PyPI, or a mirror of it,
# e.g. --build-arg PIP_INDEX_URL=https://pypi.tuna.tsinghua.edu.cn/simple (and the same
# for TORCH_INDEX: the mirror holds PyPI's torch). MNIST comes from torchvision's hosts
# unless LABKIT_MNIST_MIRROR names a mirror's URL (labkit data prepare --from). Mirrors
# cannot be reached from the course's development machines: book/zh_CN/setup.md.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG LABKIT_MNIST_MIRROR=

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV COURSE_DIR=/home/${NB_USER}/course \
    LABKIT_DATA=/opt/mnist \
    LABKIT_GRADED=${GRADED}

# The course pins override the base image's own torch: the notebooks are tested with
# exactly these versions (env/requirements.txt is the one source of truth). torch and
# torchvision first, from TORCH_INDEX; the second install then finds them satisfied
# and adds the rest from PyPI.
#
# The base's torch (a CUDA 12 build, with torchaudio built for it) and its CUDA 12
# wheels go first. cuDNN, NCCL, cuSPARSELt and NVSHMEM keep their file paths from the
# cu12 to the cu13 wheels (nvidia/cudnn/lib/libcudnn.so.9, nvidia/nccl/lib/
# libnccl.so.2, ...): installed over the cu12 ones, the cu13 wheels would overwrite
# those files in place, and a later uninstall of a cu12 wheel would delete the
# libraries the course's torch loads.
COPY --chown=${NB_UID}:${NB_GID} env/requirements.txt env/requirements-gpu.txt /tmp/env/
RUN pip list --format=freeze \
        | grep -E '^(torch|torchvision|torchaudio|nvidia-[a-z0-9-]+-cu12)==' \
        | cut -d= -f1 | xargs -r pip uninstall -y \
    && grep -E '^(torch|torchvision)==' /tmp/env/requirements.txt \
        | xargs pip install --no-cache-dir --index-url "${TORCH_INDEX}" \
    && pip install --no-cache-dir -r /tmp/env/requirements-gpu.txt \
    && fix-permissions "${CONDA_DIR}" \
    && fix-permissions "/home/${NB_USER}"

# The course itself, owned by the learner so notebooks can be edited and saved.
# solutions/ and tests/ stay out of the image (see .dockerignore).
COPY --chown=${NB_UID}:${NB_GID} pyproject.toml README.md ${COURSE_DIR}/
COPY --chown=${NB_UID}:${NB_GID} labkit/ ${COURSE_DIR}/labkit/
COPY --chown=${NB_UID}:${NB_GID} labs/ ${COURSE_DIR}/labs/
COPY --chown=${NB_UID}:${NB_GID} env/ ${COURSE_DIR}/env/
# A local folder, not a registry package: nothing to pin (its dependencies are above).
# Graded: the references are locked in the course folder before it is installed, so
# neither the installed labkit nor the copy in the course holds them.
# hadolint ignore=DL3013
RUN if [ "${GRADED}" = "1" ]; then \
        PYTHONPATH="${COURSE_DIR}" python -m labkit.cli lock-references \
            --rooms "${COURSE_DIR}/labkit/labs"; \
    fi \
    && pip install --no-cache-dir --no-deps "${COURSE_DIR}" \
    && rm -rf "${COURSE_DIR}/build" "${COURSE_DIR}/labkit.egg-info" \
    && fix-permissions "${CONDA_DIR}"

# MNIST baked in at build time, MD5-checked by labkit, then made read-only: every
# learner reads the same files and nothing downloads at run time.
USER 0
# CJK glyphs for the Chinese edition's plots (labs/zh_CN/): labkit puts Noto Sans CJK
# first in matplotlib's fonts when a notebook speaks Chinese. Debian's current package.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends fonts-noto-cjk \
    && rm -rf /var/lib/apt/lists/*
RUN mkdir -p "${LABKIT_DATA}" \
    && labkit data prepare --root "${LABKIT_DATA}" \
    && chmod -R a-w "${LABKIT_DATA}"
# jovyan's numeric uid, from the base image (1000 unless rebuilt otherwise).
# hadolint ignore=DL3066
USER ${NB_UID}

WORKDIR /home/${NB_USER}
EXPOSE 8888
CMD ["start-notebook.py", "--ServerApp.default_url=/lab/tree/course/labs"]
