# The pod sandbox image of the test cluster (containerd's sandbox_image): one static binary.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
