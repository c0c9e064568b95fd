# The GRPO trainer: torch from PyPI (the CUDA build, which also runs on CPU), peft, and torchrun for
# multi-GPU and multi-node groups (the operator runs `torchrun --no-python ... echorl trainer ...`).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp ECHORL_CACHE_DIR=/cache/echorl HF_HOME=/cache/huggingface
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime runtime
COPY operator operator
RUN pip install . \
 && echorl trainer --help >/dev/null \
 && torchrun --help >/dev/null \
 && rm -rf /src

USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["echorl"]
CMD ["trainer", "--help"]
