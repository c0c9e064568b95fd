# CPU image: the coordinator, and inference workers with the transformers backend or the mlx backend
# (mlx[cpu] on Linux). Also a fine base for CPU-only trainers.
#
# Build arguments (images/README.md): BASE, any image with Python 3.11 and its venv module;
# PIP_INDEX_URL, the Python package index; TORCH_INDEX_URL, an extra index searched for torch first
# (PyTorch's CPU wheels by default, a few hundred MB instead of several GB of CUDA libraries; empty:
# torch from PIP_INDEX_URL, the CUDA build, which also runs on CPU).
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/echorl/bin:$PATH \
    HOME=/tmp ECHORL_CACHE_DIR=/cache/echorl HF_HOME=/cache/huggingface
# jemalloc for every process: a SmolLM2 trainer step peaks at 2.2 GiB on it instead of 3.2 GiB on
# glibc's malloc, at the same step time (docs/benchmarks/memory-smollm2.md). Debian's libjemalloc2,
# from BASE when it has it (scripts/images.sh's base does), else from apt. The settings are
# `echorl run`'s (runtime/echo_runtime/runner/allocator.py); LD_PRELOAD="" in a container's env gives
# it the C library's allocator back. The trainer and the worker log which one they run on.
RUN lib=$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 2>/dev/null | head -n1); \
    if [ -z "$lib" ]; then \
      apt-get update && apt-get install -y --no-install-recommends libjemalloc2 && rm -rf /var/lib/apt/lists/* \
      && lib=$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2 | head -n1); \
    fi \
 && [ -n "$lib" ] && mkdir -p /opt/echorl-malloc && ln -s "$lib" /opt/echorl-malloc/libjemalloc.so.2
# torch first, in a layer of its own (GBs with its CUDA libraries): a change to any other dependency
# leaves it cached. TORCH is the requirement (scripts/images.sh passes pyproject.toml's pin; the
# next layer installs the pinned version anyway).
ARG TORCH=torch
RUN python3 -m venv /opt/echorl \
 && pip install --index-url "$PIP_INDEX_URL" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "$TORCH"
WORKDIR /src
COPY pyproject.toml ./
# Dependencies first, in the same layer as trainer.Dockerfile's (identical lines, so a builder with a
# layer cache builds and stores it once), then Echo itself: a source change rebuilds only the last layer.
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
 && pip install --index-url "$PIP_INDEX_URL" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      -r /tmp/requirements.txt "setuptools>=69" wheel \
 && rm /tmp/requirements.txt
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['mlx']))" >/tmp/mlx.txt \
 && pip install --index-url "$PIP_INDEX_URL" -r /tmp/mlx.txt \
 && rm /tmp/mlx.txt
COPY README.md ./
COPY runtime runtime
COPY operator operator
# EXTRAS: optional extras to add, e.g. `--build-arg EXTRAS=reasoning-gym,math-verify` for the task
# libraries (this image also runs the coordinator, which scores, and the scoring pools).
ARG EXTRAS=
RUN pip install --index-url "$PIP_INDEX_URL" --no-deps --no-build-isolation . \
 && if [ -n "$EXTRAS" ]; then pip install --index-url "$PIP_INDEX_URL" --no-build-isolation ".[$EXTRAS]"; fi \
 && echorl --help >/dev/null \
 && python -c "import torch, transformers, mlx.core" \
 && rm -rf /src

ENV LD_PRELOAD=/opt/echorl-malloc/libjemalloc.so.2 MALLOC_CONF=dirty_decay_ms:30000,muzzy_decay_ms:30000,narenas:2
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["echorl"]
CMD ["--help"]
