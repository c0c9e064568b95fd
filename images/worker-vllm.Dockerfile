# CUDA inference workers with the vllm backend. vLLM's wheel brings its CUDA build of torch; the node
# needs the NVIDIA driver and container runtime (the GPU Operator or the device plugin).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp ECHORL_CACHE_DIR=/cache/echorl HF_HOME=/cache/huggingface VLLM_NO_USAGE_STATS=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime runtime
COPY operator operator
RUN pip install ".[vllm]" \
 && echorl worker --help >/dev/null \
 && rm -rf /src

USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["echorl"]
CMD ["worker", "--help"]
