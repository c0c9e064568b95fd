#!/bin/sh
# Stands in for `echorl trainer ...` in tests/e2e: fails the same way every time.
echo "echorl trainer: loading the job from $3" >&2
echo "Traceback (most recent call last):" >&2
echo "  File \"echo_runtime/trainer/loop.py\", line 1, in run" >&2
echo "RuntimeError: injected trainer failure (tests/e2e/images/failing-trainer.sh)" >&2
exit 1
