# A trainer that always fails, for the e2e test of backoffLimit: its `echorl` prints a traceback-like
# tail and exits 1, as a trainer with a real bug would.
ARG BASE
FROM ${BASE}
COPY failing-trainer.sh /usr/local/bin/echorl
USER 1000:1000
ENTRYPOINT ["/usr/local/bin/echorl"]
