# The dev MinIO of manifests/dev/minio.yaml for the test cluster, from the minio scripts/testbin.sh
# builds (the e2e overlay swaps quay.io/minio/minio for this image).
ARG BASE
FROM ${BASE}
COPY minio /usr/local/bin/minio
USER 1000:1000
ENTRYPOINT ["/usr/local/bin/minio"]
