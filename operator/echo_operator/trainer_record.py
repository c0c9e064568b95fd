"""Where a stopped trainer was and why: its pods' last log lines in a ConfigMap, ``status.trainerHistory``.

The operator stops a trainer Job — deletes it for a gang restart (a rank failed or was deleted, evicted,
preempted; the trainer's spec changed), deletes it when the job is suspended or Kueue preempts it,
suspends it past ``activeDeadlineSeconds``, or leaves it failed when the job fails — and with its pods
go their logs. Before it does, :func:`record`:

* reads the last lines of each pod's containers through the API (``pods/log``: at most
  :data:`TAIL_LINES` lines, of which the last :data:`LOG_BYTES` — less when many pods share the
  ConfigMap's :data:`BUDGET_BYTES`; a container that restarted, its previous run's too) and keeps them
  in a ConfigMap owned by the EchoJob, ``<job>-trainer-logs-<n>`` (:func:`names.trainer_logs`), one key
  per rank and container (``rank-0.trainer.log``, ``rank-0.trainer.previous.log``) and a ``summary``.
  A log that cannot be read (the pod is gone, its node's kubelet does not answer, the operator may not
  read logs) is kept as :data:`UNAVAILABLE` and why. Nothing here fails the restart: a read or a write
  that fails is logged and the restart goes on. The last :data:`KEEP` of these ConfigMaps are kept;
* appends where it stopped to ``status.trainerHistory`` (the last :data:`HISTORY`): ``n``, the time,
  the reason, each rank's pod (name, node, phase, exit code, termination reason), the policy version
  published then, and the ConfigMap.

``n`` counts the trainer Jobs the operator stopped over the job's life. An entry carries the Job's UID:
an operator that stops half-way and runs again writes the same ConfigMap (same name, applied) and never
a second entry. A pod deleted by hand may be gone before the operator looks at its Job: the status pass
remembers the trainer's pods it saw (:func:`remember`), so the record still names the deleted pod and
its node; and when a pass sees a rank terminating or failed while its Job still runs, it reads the logs
at once, before the Job controller stops the other ranks — the record keeps what was read then when its
own read finds nothing (:func:`merge`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from echo_operator import context, events, lifecycle, names
from echo_operator.kube import KubeError
from echo_runtime import spec

Object = dict[str, Any]
GV = spec.GROUP_VERSION
log = logging.getLogger("echo_operator")

COMPONENT: names.Component = "trainer-logs"
NUMBER_LABEL = f"{names.GROUP}/trainer-restart"
"""Label of a logs ConfigMap: its ``n``."""
UID_ANNOTATION = f"{names.GROUP}/trainer-uid"
"""Annotation of a logs ConfigMap: the UID of the trainer Job whose pods' logs it keeps."""
LOG_BYTES = 64 * 1024
"""At most this much of the end of each container's log."""
BUDGET_BYTES = 512 * 1024
"""At most this much log text in one ConfigMap (a ConfigMap holds at most 1 MiB)."""
TAIL_LINES = 2000
"""Lines asked of the API per log (``tailLines``)."""
KEEP = 5
"""Logs ConfigMaps kept per job: the newest; older ones are deleted."""
HISTORY = 10
"""Entries kept in ``status.trainerHistory``."""
MAX_PODS = 16
"""Pods named in one history entry (the first ranks)."""
MAX_LOGGED_PODS = 128
"""Pods whose logs one ConfigMap keeps (the first ranks)."""
MESSAGE_CHARS = 2048
"""A history entry's ``message`` is cut to this (the CRD's bound)."""
READ_TIMEOUT_S = 5.0
"""How long one log read may take (the API server asks the node's kubelet)."""
READ_BUDGET_S = 30.0
"""How long the reads of one record may take together; logs not read by then say so."""
UNAVAILABLE = "(log unavailable: "
"""How a ConfigMap entry whose log could not be read begins; the reason and ``)`` follow."""
SUMMARY_KEY = "summary"


@dataclasses.dataclass(frozen=True)
class PodSeen:
    """One pod of a trainer Job as the operator saw it."""

    rank: int | None
    name: str
    node: str | None
    phase: str
    exit_code: int | None
    reason: str | None
    containers: tuple[str, ...]
    restarted: tuple[str, ...] = ()
    """Containers that restarted: their previous run's log is read too."""
    deleted: bool = False
    """It had a ``deletionTimestamp``."""
    gone: bool = False
    """Not in the API any more when the record was made (only remembered from an earlier pass)."""

    @property
    def key(self) -> str:
        return f"rank-{self.rank}" if self.rank is not None else self.name


def rank_of(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.JOB_INDEX_LABEL)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    state = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
    return state or None


def pod_seen(pod: Mapping[str, Any]) -> PodSeen:
    """What a record keeps of a pod: rank, name, node, phase and how its (first ended) container ended."""
    meta, pod_spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    deleted = bool(meta.get("deletionTimestamp"))
    phase = str(status.get("phase") or "Pending")
    if deleted and phase not in ("Succeeded", "Failed"):
        phase = "Terminating"
    statuses = list(status.get("containerStatuses") or [])
    ended = [s for s in (_terminated(st) for st in statuses) if s is not None]
    failed = [s for s in ended if int(s.get("exitCode", 0) or 0) != 0]
    state = (failed or ended)[0] if ended else None
    return PodSeen(
        rank=rank_of(pod),
        name=str(meta.get("name", "")),
        node=pod_spec.get("nodeName") or None,
        phase=phase,
        exit_code=int(state["exitCode"]) if state is not None and state.get("exitCode") is not None else None,
        reason=str(state["reason"]) if state is not None and state.get("reason") else None,
        containers=tuple(str(c["name"]) for c in pod_spec.get("containers") or [] if c.get("name")),
        restarted=tuple(str(s["name"]) for s in statuses if int(s.get("restartCount", 0) or 0) > 0),
        deleted=deleted,
    )


def combine(current: Iterable[PodSeen], remembered: Mapping[str, PodSeen]) -> list[PodSeen]:
    """The pods to record: those in the API now, and those seen earlier that are gone (by rank)."""
    found = {p.key: p for p in current}
    for key, pod in remembered.items():
        if key not in found:
            found[key] = dataclasses.replace(pod, gone=True, phase="Gone")
    return sorted(found.values(), key=lambda p: (p.rank is None, p.rank or 0, p.name))


def going_down(trainer: Mapping[str, Any], pods: Iterable[PodSeen]) -> bool:
    """Whether a running trainer Job is about to fail: the Job controller marked it (``FailureTarget``)
    or one of its ranks is being deleted or failed (with ``backoffLimit: 0`` that fails the Job)."""
    for cond in (trainer.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("FailureTarget", "Failed") and cond.get("status") == "True":
            return True
    return any(p.deleted or p.phase == "Failed" for p in pods)


def log_key(pod: PodSeen, container: str, previous: bool = False) -> str:
    """The ConfigMap key of one container's log: ``rank-<n>.<container>[.previous].log``."""
    return f"{pod.key}.{container}{'.previous' if previous else ''}.log"


def unavailable(why: str) -> str:
    return f"{UNAVAILABLE}{why})"


def why_unreadable(exc: KubeError) -> str:
    """A short reason from a failed log read (the API server's own words)."""
    text = " ".join(exc.message.split())[:300]
    if exc.status == 403:
        return f"forbidden: the operator may not read pods/log here ({text})"
    return f"{text} (HTTP {exc.status})" if exc.status else text


def gone_reason(pod: PodSeen) -> str:
    how = "was deleted" if pod.deleted else "was gone (deleted or evicted)"
    return f"pod {pod.name} {how} before the operator could read its log"


def streams(pods: Sequence[PodSeen]) -> list[tuple[PodSeen, str, bool]]:
    """Every log a record reads: (pod, container, previous)."""
    out = []
    for pod in pods[:MAX_LOGGED_PODS]:
        for container in pod.containers:
            out.append((pod, container, False))
            if container in pod.restarted:
                out.append((pod, container, True))
    return out


def per_log_bytes(count: int) -> int:
    """How much of each log a ConfigMap of ``count`` logs keeps."""
    return min(LOG_BYTES, BUDGET_BYTES // max(1, count))


def fit(text: str, limit: int) -> str:
    """The end of ``text`` in at most ``limit`` UTF-8 bytes, from a line's start, marked when cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker = "[… earlier lines cut …]\n"
    tail = data[len(data) - (limit - len(marker.encode("utf-8"))) :]
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return marker + tail.decode("utf-8", errors="ignore")


def merge(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str]:
    """``new``, except where it has no log and ``old`` (an earlier read for the same Job) has one."""
    out = dict(old)
    for key, value in new.items():
        if key in old and value.startswith(UNAVAILABLE) and not old[key].startswith(UNAVAILABLE):
            continue
        out[key] = value
    return out


def describe_pod(pod: PodSeen) -> str:
    rank = f"rank {pod.rank}" if pod.rank is not None else "pod"
    where = f" on node {pod.node}" if pod.node else ""
    ended = ""
    if pod.exit_code is not None:
        ended = f", exit code {pod.exit_code}" + (f" ({pod.reason})" if pod.reason else "")
    return f"{rank}: pod {pod.name}{where}, {pod.phase}{ended}"


def summary(
    trainer: str,
    number: int,
    when: str,
    reason: str,
    message: str,
    version: int | None,
    pods: Sequence[PodSeen],
) -> str:
    """The ConfigMap's ``summary``: what stopped, when, why, and each rank's pod."""
    lines = [
        f"trainer Job {trainer} (the job's stopped trainer number {number}) stopped at {when}: {reason}",
        message,
        f"policy version published then: {version if version is not None else 'unknown'}",
        *(describe_pod(p) for p in pods),
    ]
    if len(pods) > MAX_LOGGED_PODS:
        lines.append(f"(the logs of the first {MAX_LOGGED_PODS} ranks are kept)")
    return "\n".join(line for line in lines if line) + "\n"


def logs_configmap(body: Mapping[str, Any], number: int, uid: str, data: Mapping[str, str]) -> Object:
    """The ConfigMap that keeps a stopped trainer Job's logs, owned by the EchoJob ``body``."""
    meta = body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.trainer_logs(meta["name"], number),
            "namespace": meta["namespace"],
            "labels": {**names.labels(meta["name"], COMPONENT), NUMBER_LABEL: str(number)},
            "annotations": {UID_ANNOTATION: uid},
            "ownerReferences": [context.owner(body)],
        },
        "data": dict(sorted(data.items())),
    }


def is_logs(obj: Mapping[str, Any]) -> bool:
    """Whether a child is a logs ConfigMap (not one the job's spec asks for)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return obj.get("kind") == "ConfigMap" and labels.get(names.COMPONENT) == COMPONENT


def number_of(obj: Mapping[str, Any]) -> int | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(NUMBER_LABEL)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def stale(configmaps: Iterable[Mapping[str, Any]], newest: int, keep: int = KEEP) -> list[str]:
    """The logs ConfigMaps to delete once ``newest`` is written: all but the last ``keep`` numbers."""
    out = []
    for obj in configmaps:
        number = number_of(obj)
        if number is not None and number <= newest - keep:
            out.append(str(obj["metadata"]["name"]))
    return sorted(out)


def pod_entry(pod: PodSeen) -> Object:
    entry: Object = {"rank": pod.rank, "name": pod.name, "node": pod.node, "phase": pod.phase,
                     "exitCode": pod.exit_code, "reason": pod.reason}  # fmt: skip
    return {k: v for k, v in entry.items() if v is not None}


def history_entry(
    number: int,
    when: str,
    reason: str,
    message: str,
    uid: str,
    version: int | None,
    configmap: str | None,
    pods: Sequence[PodSeen],
) -> Object:
    """One ``status.trainerHistory`` entry."""
    entry: Object = {
        "restart": number,
        "time": when,
        "reason": reason,
        "message": message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…",
        "uid": uid,
        "policyVersion": version,
        "logsConfigMap": configmap,
        "pods": [pod_entry(p) for p in pods[:MAX_PODS]],
    }
    return {k: v for k, v in entry.items() if v is not None}


def entry_for(history: Sequence[Mapping[str, Any]], uid: str) -> Mapping[str, Any] | None:
    return next((e for e in history if e.get("uid") == uid), None)


def next_number(history: Sequence[Mapping[str, Any]]) -> int:
    """The number of the next trainer Job stopped: one more than the last recorded."""
    return max((int(e.get("restart") or 0) for e in history), default=0) + 1


def appended(
    history: Sequence[Mapping[str, Any]], entry: Mapping[str, Any], cap: int = HISTORY
) -> list[Object]:
    """``history`` with ``entry`` (replacing one for the same trainer Job), the last ``cap`` entries."""
    kept = [dict(e) for e in history if e.get("uid") != entry.get("uid")]
    kept.append(dict(entry))
    kept.sort(key=lambda e: int(e.get("restart") or 0))
    return kept[-cap:]


def hint(entry: Mapping[str, Any]) -> str:
    """Where an Event or a condition's message sends a human for the stopped trainer's logs."""
    configmap = entry.get("logsConfigMap")
    if not configmap:
        return ""
    return f"; its pods' last log lines: kubectl get configmap {configmap} -o yaml"


# -- I/O -------------------------------------------------------------------------------------------


def history_of(mem: context.JobMemory, body: Mapping[str, Any]) -> list[Object]:
    """``status.trainerHistory`` as last written (read from the job's status after a restart)."""
    if mem.trainer_history is None:
        mem.trainer_history = [dict(e) for e in (body.get("status") or {}).get("trainerHistory") or []]
    return mem.trainer_history


def remember(
    ctx: context.Context,
    body: Mapping[str, Any],
    mem: context.JobMemory,
    trainer: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
) -> None:
    """Each status pass: remember the running trainer Job's pods (so a record names a pod deleted before
    it), and if one of its ranks is going down, read the logs now (:func:`going_down`)."""
    if trainer is None or lifecycle.trainer_phase(trainer) != "Running":
        return
    uid = str(trainer["metadata"]["uid"])
    mine = [
        pod_seen(p)
        for p in pods
        if (p["metadata"].get("labels") or {}).get(names.COMPONENT) == "trainer" and context.owned_by(p, uid)
    ]
    seen = dict(mem.trainer_pods.get(uid) or {})
    seen.update({p.key: p for p in mine})
    mem.trainer_pods = {uid: seen}  # only the current trainer Job's
    if uid in mem.captured or not going_down(trainer, mine):
        return
    number = entry_number(mem, body, uid)
    mem.captured = {uid: number}
    capture(ctx, body, uid, number, combine(mine, seen), None)


def entry_number(mem: context.JobMemory, body: Mapping[str, Any], uid: str) -> int:
    """The number of the trainer Job ``uid``'s record: recorded, read ahead of it, or the next."""
    history = history_of(mem, body)
    done = entry_for(history, uid)
    if done is not None:
        return int(done["restart"])
    return mem.captured.get(uid) or next_number(history)


Reader = Callable[[PodSeen, str, bool, int], str]
"""Reads one log: (pod, container, previous, bytes wanted) → its text; raises :class:`KubeError`."""


def read_logs(
    read: Reader, pods: Sequence[PodSeen], clock: Callable[[], float] = time.monotonic
) -> dict[str, str]:
    """Each log of ``pods`` (:func:`streams`), cut to its share; why, where it cannot be read."""
    todo = streams(pods)
    limit = per_log_bytes(len(todo))
    deadline = clock() + READ_BUDGET_S
    out: dict[str, str] = {}
    for pod, container, previous in todo:
        key = log_key(pod, container, previous)
        if pod.gone:
            out[key] = unavailable(gone_reason(pod))
            continue
        if pod.node is None:  # the API server answers an empty log for it
            out[key] = unavailable(f"pod {pod.name} was never scheduled to a node: it wrote no log")
            continue
        if clock() > deadline:
            out[key] = unavailable(
                f"not read: the operator spends at most {READ_BUDGET_S:.0f} s reading logs"
            )
            continue
        try:
            text = read(pod, container, previous, limit)
        except KubeError as exc:
            out[key] = unavailable(why_unreadable(exc))
            continue
        out[key] = fit(text, limit) if text else unavailable("the container wrote nothing")
    return out


def api_reader(ctx: context.Context, namespace: str) -> Reader:
    """Read logs through the API server (``pods/log``), bounded in lines, bytes and time."""

    def read(pod: PodSeen, container: str, previous: bool, wanted: int) -> str:
        return ctx.kube.log(
            namespace, pod.name, container, previous=previous, tail_lines=TAIL_LINES,
            # the server cuts from the start of the tail: ask for more, :func:`fit` keeps the end
            limit_bytes=min(1 << 20, max(4 * wanted, 256 * 1024)), timeout_s=READ_TIMEOUT_S,
        )  # fmt: skip

    return read


def capture(
    ctx: context.Context,
    body: Mapping[str, Any],
    uid: str,
    number: int,
    pods: Sequence[PodSeen],
    text: str | None,
) -> str | None:
    """Read ``pods``' logs into ConfigMap ``number`` (merged with what an earlier read of the same Job
    kept), with ``text`` as its summary; delete the ConfigMaps older than the last :data:`KEEP`. Returns
    its name, or None when there was no pod or it could not be written (logged: never raised)."""
    if not pods:
        return None
    meta = body["metadata"]
    namespace, job = meta["namespace"], meta["name"]
    name = names.trainer_logs(job, number)
    try:
        data = read_logs(api_reader(ctx, namespace), pods)
        if text is not None:
            data[SUMMARY_KEY] = text
        old = ctx.kube.get("v1", "ConfigMap", namespace, name)
        if old is not None and (old["metadata"].get("annotations") or {}).get(UID_ANNOTATION) == uid:
            data = merge(old.get("data") or {}, data)
        ctx.kube.apply(logs_configmap(body, number, uid, data))
        listed = ctx.kube.list("v1", "ConfigMap", namespace, names.selector(job, COMPONENT))
        for old_name in stale([c for c in listed if context.owned_by(c, meta["uid"])], number):
            ctx.kube.delete("v1", "ConfigMap", namespace, old_name)
    except KubeError as exc:
        log.warning("%s/%s: the logs of trainer Job %s were not kept: %s", namespace, job, uid, exc)
        return None
    return name


def policy_version(mem: context.JobMemory, body: Mapping[str, Any]) -> int | None:
    if mem.doc is not None:
        return int(mem.doc.policy_version)
    found = (body.get("status") or {}).get("policyVersion")
    return int(found) if found is not None else None


def record(
    ctx: context.Context,
    body: Mapping[str, Any],
    trainer: Mapping[str, Any],
    reason: str,
    message: str,
    listed: Sequence[Mapping[str, Any]] | None = None,
) -> Mapping[str, Any]:
    """Before the trainer Job ``trainer`` is stopped: keep its pods' logs and say where it stopped in
    ``status.trainerHistory``; returns the entry (the one already there if this Job was recorded).
    ``listed``: the trainer's pods, if the caller just listed them."""
    meta = body["metadata"]
    namespace, job = meta["namespace"], meta["name"]
    mem = ctx.memory(namespace, job)
    uid = str(trainer["metadata"]["uid"])
    history = history_of(mem, body)
    done = entry_for(history, uid)
    if done is not None:
        return done
    number = entry_number(mem, body, uid)
    if listed is None:
        try:
            listed = ctx.kube.list("v1", "Pod", namespace, names.selector(job, "trainer"))
        except KubeError as exc:
            log.warning("%s/%s: cannot list the trainer's pods: %s", namespace, job, exc)
            listed = []
    now = [pod_seen(p) for p in listed if context.owned_by(p, uid)]
    pods = combine(now, (mem.trainer_pods.get(uid) or {}))
    when, version = events.now_rfc3339(), policy_version(mem, body)
    text = summary(str(trainer["metadata"]["name"]), number, when, reason, message, version, pods)
    configmap = capture(ctx, body, uid, number, pods, text)
    entry = history_entry(number, when, reason, message, uid, version, configmap, pods)
    mem.trainer_history = appended(history, entry)
    try:
        ctx.kube.patch_status(GV, "EchoJob", namespace, job, {"trainerHistory": mem.trainer_history})
    except KubeError as exc:  # the pass's status write carries it
        log.warning("%s/%s: status.trainerHistory not written yet: %s", namespace, job, exc)
    return entry
