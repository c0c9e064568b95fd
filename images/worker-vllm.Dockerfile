# CUDA inference workers with the vllm backend. vLLM's wheel brings its CUDA build of torch; the node
# needs the NVIDIA driver and container runtime (the GPU Operator or the device plugin). Not built by
# the test command (images/README.md): vLLM pins a torch build of its own, several GB more.
#
# Build arguments (images/README.md): BASE, any image with Python 3.11 and its venv module;
# PIP_INDEX_URL, the Python package index pip installs from.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_INDEX_URL=https://pypi.org/simple

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/echorl/bin:$PATH \
    HOME=/tmp ECHORL_CACHE_DIR=/cache/echorl HF_HOME=/cache/huggingface VLLM_NO_USAGE_STATS=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime runtime
COPY operator operator
RUN python3 -m venv /opt/echorl \
 && pip install --index-url "$PIP_INDEX_URL" ".[vllm]" \
 && echorl worker --help >/dev/null \
 && rm -rf /src

USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["echorl"]
CMD ["worker", "--help"]
