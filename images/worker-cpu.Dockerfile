# CPU image: the coordinator, and inference workers with the transformers backend (torch CPU wheels)
# or the mlx backend (mlx[cpu] on Linux). Also a fine base for CPU-only trainers.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp ECHORL_CACHE_DIR=/cache/echorl HF_HOME=/cache/huggingface
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime runtime
COPY operator operator
# torch's CPU wheels keep the image a few hundred MB instead of several GB of CUDA libraries.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.15.0" \
 && pip install ".[mlx]" \
 && echorl --help >/dev/null \
 && rm -rf /src

USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["echorl"]
CMD ["--help"]
