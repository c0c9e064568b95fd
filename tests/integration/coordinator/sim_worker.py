"""A simulated inference worker process for the lease tests: real client, real HTTP, no model.

    python sim_worker.py URL TOKEN MODE CAPACITY

Completions are the arithmetic task's correct answers; token ids and log-probs are made up. Every
event is one JSON line on stdout. Modes:

* ``hold``: lease CAPACITY tasks, print ``{"worker", "tasks"}``, then only heartbeat (never submit);
* ``late``: like ``hold``, then wait for a line on stdin and submit every held task, printing
  ``{"task", "result"}`` (the outcome, or the error code the coordinator answered);
* ``work``: heartbeat, lease, submit, repeatedly, printing ``{"task", "result"}`` per submission.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from echo_runtime.coordinator import client, wire


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


def group(task: wire.TaskOut, version: int) -> list[dict[str, object]]:
    answer = str(eval(task.prompt.rstrip("=")))  # "12+7=" style prompts
    return [
        {"completion": answer, "tokenIds": [1, 2], "logprobs": [-0.5, -0.5], "policyVersion": version}
        for _ in range(task.group_size)
    ]


def submit(w: client.WorkerClient, task: wire.TaskOut, version: int) -> None:
    result: str
    try:
        result = w.submit(task.task_id, group(task, version)).outcome
    except client.CoordinatorError as exc:
        result = exc.code
    say(task=task.task_id, result=result)


def main() -> None:
    url, token, mode, capacity = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    retry = client.RetryPolicy(attempts=100, base=0.05, cap=0.5, deadline=60.0)
    w = client.WorkerClient(
        url,
        token,
        pool="cpu",
        backend="transformers",
        device="cpu",
        dtype="float32",
        capacity=capacity,
        retry=retry,
        timeout=5.0,
    )
    registration = w.register()
    capacity = registration.capacity  # the pool may allow fewer leases than asked for
    loaded = {"version": registration.load_version or 0}

    def obey(reply: wire.Instructions) -> None:
        if reply.load_version is not None:
            loaded["version"] = reply.load_version

    stop = threading.Event()
    threading.Thread(
        target=w.run_heartbeats, args=(stop, lambda: loaded["version"], obey), daemon=True
    ).start()
    if mode in ("hold", "late"):
        tasks: list[wire.TaskOut] = []
        while len(tasks) < capacity:
            tasks += w.lease(capacity - len(tasks)).tasks
            time.sleep(0.05)
        say(worker=w.worker_id, tasks=[t.task_id for t in tasks])
        if mode == "hold":
            stop.wait()
        sys.stdin.readline()
        for task in tasks:
            submit(w, task, loaded["version"])
        return
    while True:
        reply = w.lease(capacity)
        obey(reply)
        for task in reply.tasks:
            submit(w, task, loaded["version"])
        if not reply.tasks:
            time.sleep(reply.retry_after_seconds or 0.1)


if __name__ == "__main__":
    main()
