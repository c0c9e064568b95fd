# The Echo operator: kopf, the Kubernetes client, MinIO's SDK and Echo's spec models. No torch: the
# operator imports only echo_runtime.spec, .coordinator (client, wire, staleness, tls) and .snapshots;
# cryptography issues the coordinators' TLS certificates.
#
# Build arguments (images/README.md): BASE, any image with Python 3.11 and its venv module;
# PIP_INDEX_URL, the Python package index pip installs from.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_INDEX_URL=https://pypi.org/simple

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/echorl/bin:$PATH
# --no-deps for Echo itself: the distribution's dependencies include torch and transformers, which the
# operator never imports; these are the ones it does.
RUN python3 -m venv /opt/echorl \
 && pip install --index-url "$PIP_INDEX_URL" "pydantic==2.14.3" "pyyaml>=6.0" "click>=8.1" "kopf==1.45.2" \
      "kubernetes==36.0.3" "python-dateutil>=2.8,<3" "minio==7.2.20" "httpx==0.28.1" "numpy>=1.26,<3" \
      "cryptography==50.0.2" "prometheus-client==0.26.0" \
      "setuptools>=69" wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime runtime
COPY operator operator
RUN pip install --index-url "$PIP_INDEX_URL" --no-deps --no-build-isolation . \
 && python -c "import echo_operator.handlers" \
 && rm -rf /src

# A name for uid 1000: kopf names its peering identity after the user (getpass.getuser()), which
# fails for a uid without a passwd entry.
RUN echo "echorl:x:1000:1000:Echo operator:/tmp:/usr/sbin/nologin" >>/etc/passwd \
 && echo "echorl:x:1000:" >>/etc/group
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "echo_operator"]
CMD ["--all-namespaces"]
