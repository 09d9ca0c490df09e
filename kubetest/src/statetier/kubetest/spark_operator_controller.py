"""A double of the Kubeflow Spark Operator v2.5.2's SparkApplication controller: the state
machine that moves ``status.applicationState.state``, as a real client of the API over HTTP.

statetier's upgrade modes wait on what this controller writes (``SUSPENDED`` before a savepoint
is taken), so the tests need it to write what v2.5.2 writes, when it writes it. Read from
release v2.5.2 and rewritten here:

* :func:`invalidates`: the update predicate of ``internal/controller/sparkapplication/
  event_filter.go``: a spec change other than ``suspend`` and ``timeToLiveSeconds`` forces the
  status to ``INVALIDATING`` (the ``PartialRestart`` feature gate, off by default, is not
  modelled); when that status write conflicts, the event is dropped, as upstream drops it;
* :func:`reconcile`: ``Reconcile`` and its ``reconcile*SparkApplication`` functions in
  ``controller.go``: ``suspend: true`` moves any state but COMPLETED, FAILED, SUSPENDING and
  SUSPENDED to SUSPENDING; then NEW (``""``), RESUMING and PENDING_RERUN submit (SUBMITTED, or
  SUBMISSION_FAILED with upstream's message when :func:`.spark_operator.submit` refuses the
  application), INVALIDATING -> PENDING_RERUN, SUSPENDING -> SUSPENDED, SUSPENDED -> RESUMING
  once ``suspend`` is false, SUBMISSION_FAILED and FAILING -> FAILED when no retry is due;
  the status fields and their resets (``resetSparkApplicationStatus``) are upstream's, with
  the JSON of its Go types (``omitempty``; an unset ``metav1.Time`` is ``null``).

There is no kubelet, so there is no driver pod: a test reports the driver running with
:meth:`SparkOperatorController.driver_running` (upstream reads the driver pod's phase), which
moves SUBMITTED to RUNNING; deleting the application's resources (invalidation, suspension)
forgets the driver, as deleting its pod would. A RUNNING application without a driver goes
FAILING with ``driver pod not found``, as upstream does.

Not modelled: the driver pod creation grace period (a SUBMITTED application without a driver
stays SUBMITTED), retries (``restartPolicy`` OnFailure/Always: an application due a retry
keeps its state), executors, SUCCEEDING and COMPLETED, TTL deletion, Events, metrics, the web
UI service and ingress, batch schedulers.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from statetier.kubetest.spark_operator import SubmissionError, driver_pod_name, submit

__all__ = ["SparkOperatorController", "invalidates", "reconcile"]

Obj = dict[str, Any]
_APPS = "/apis/sparkoperator.k8s.io/v1beta2"
_TERMINATED = ("COMPLETED", "FAILED")
_NOT_INVALIDATING = ("suspend", "timeToLiveSeconds")


def _now() -> str:
    """``metav1.Now()`` as it serialises: RFC 3339, whole seconds, UTC."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def invalidates(old: Obj, new: Obj) -> bool:
    """Whether an update from ``old`` to ``new`` makes upstream's event filter force the status
    to INVALIDATING: the spec changed in more than ``suspend`` and ``timeToLiveSeconds``."""
    kept = {k: v for k, v in (old.get("spec") or {}).items() if k not in _NOT_INVALIDATING}
    now = {k: v for k, v in (new.get("spec") or {}).items() if k not in _NOT_INVALIDATING}
    return kept != now


def _status(app: Obj) -> Obj:
    """The status as the Go struct holds it (every field present, zero values filled in)."""
    given = app.get("status") or {}
    state = given.get("applicationState") or {}
    return {
        "sparkApplicationId": given.get("sparkApplicationId", ""),
        "submissionID": given.get("submissionID", ""),
        "lastSubmissionAttemptTime": given.get("lastSubmissionAttemptTime"),
        "terminationTime": given.get("terminationTime"),
        "driverInfo": dict(given.get("driverInfo") or {}),
        "applicationState": {
            "state": state.get("state", ""),
            "errorMessage": state.get("errorMessage", ""),
        },
        "executorState": dict(given.get("executorState") or {}),
        "executionAttempts": int(given.get("executionAttempts") or 0),
        "submissionAttempts": int(given.get("submissionAttempts") or 0),
    }


def _as_json(status: Obj) -> Obj:
    """The status as Go's encoding/json writes it: ``omitempty`` fields left out when zero,
    the two ``metav1.Time`` fields and ``driverInfo`` and ``applicationState`` always."""
    out: Obj = {}
    for key, value in status.items():
        if key == "applicationState":
            state = {"state": value["state"]}
            if value["errorMessage"]:
                state["errorMessage"] = value["errorMessage"]
            out[key] = state
        elif key in ("lastSubmissionAttemptTime", "terminationTime", "driverInfo") or value:
            out[key] = value
    return out


def _state(status: Obj, state: str, error: str = "") -> None:
    """Replace ``applicationState`` as upstream assigns a new ``ApplicationState`` struct."""
    status["applicationState"] = {"state": state, "errorMessage": error}


def _reset(status: Obj) -> None:
    """``resetSparkApplicationStatus``: what a new run or a suspension forgets, by state."""
    state = status["applicationState"]["state"]
    if state not in ("SUCCEEDING", "FAILING", "INVALIDATING", "SUSPENDED"):
        return
    status["sparkApplicationId"] = ""
    status["applicationState"]["errorMessage"] = ""
    status["driverInfo"] = {}
    status["executorState"] = {}
    if state in ("SUCCEEDING", "FAILING", "INVALIDATING"):
        status["terminationTime"] = None
    if state == "INVALIDATING":
        status.update(submissionAttempts=0, executionAttempts=0, lastSubmissionAttemptTime=None)


def _submit(app: Obj, status: Obj) -> None:
    """``submitSparkApplication``: a new submission ID and attempt, then SUBMITTED or
    SUBMISSION_FAILED with the submitter's error."""
    status["submissionID"] = str(uuid.uuid4())
    status["driverInfo"]["podName"] = driver_pod_name(app)
    status["lastSubmissionAttemptTime"] = _now()
    status["submissionAttempts"] += 1
    try:
        submit(app)
    except SubmissionError as exc:
        _state(status, "SUBMISSION_FAILED", f"failed to submit spark application: {exc}")
        return
    _state(status, "SUBMITTED")
    status["executionAttempts"] += 1


def _retry_due(app: Obj, status: Obj) -> bool:
    """``ShouldRetry`` for the two failure states the double reaches."""
    policy = (app.get("spec") or {}).get("restartPolicy") or {}
    if policy.get("type") == "Always":
        return True
    if policy.get("type") != "OnFailure":
        return False
    if status["applicationState"]["state"] == "FAILING":
        limit, count = policy.get("onFailureRetries"), status["executionAttempts"]
    else:
        limit, count = policy.get("onSubmissionFailureRetries"), status["submissionAttempts"]
    return limit is not None and count <= int(limit)


def reconcile(app: Obj, driver_running: bool) -> tuple[Obj, bool]:
    """One ``Reconcile`` of ``app``: the status upstream writes (as JSON) and whether it
    deletes the application's resources (its driver) on the way."""
    status = _status(app)
    state = status["applicationState"]["state"]
    suspend = bool((app.get("spec") or {}).get("suspend"))
    if suspend and state not in (*_TERMINATED, "SUSPENDED", "SUSPENDING"):
        status["applicationState"]["state"] = "SUSPENDING"
        return _as_json(status), False
    deletes = False
    if state in ("", "RESUMING", "PENDING_RERUN"):
        _submit(app, status)
    elif state in ("SUBMITTED", "RUNNING", "UNKNOWN"):
        _driver_state(status, driver_running)
    elif state == "INVALIDATING":
        _reset(status)
        status["applicationState"]["state"] = "PENDING_RERUN"
        deletes = True
    elif state == "SUSPENDING":
        _state(status, "SUSPENDED")
        _reset(status)
        deletes = True
    elif state == "SUSPENDED":
        _reset(status)
        if not suspend:
            _state(status, "RESUMING")
    elif state in ("SUBMISSION_FAILED", "FAILING") and not _retry_due(app, status):
        status["applicationState"]["state"] = "FAILED"
        if state == "SUBMISSION_FAILED":
            status["terminationTime"] = _now()
    return _as_json(status), deletes


def _driver_state(status: Obj, driver_running: bool) -> None:
    """``updateDriverState`` without pods: a reported driver is RUNNING; none after RUNNING
    is ``driver pod not found`` (in SUBMITTED, upstream's grace period is not modelled)."""
    state = status["applicationState"]["state"]
    if driver_running:
        status["applicationState"]["state"] = "RUNNING"
    elif state != "SUBMITTED":
        status["applicationState"] = {"state": "FAILING", "errorMessage": "driver pod not found"}
        status["terminationTime"] = _now()


class _ConflictError(Exception):
    """The status write met a newer object (HTTP 409)."""


class SparkOperatorController:
    """The controller double watching SparkApplications of the API at ``url`` (the emulator's),
    in a background thread from ``with`` until its end; see the module docstring."""

    def __init__(self, url: str, drivers: set[tuple[str, str]] | None = None) -> None:
        """``drivers`` are the (namespace, name) of the applications whose driver pod runs:
        the cluster's, so a test that stops and starts the controller passes the same set."""
        self.url = url.rstrip("/")
        self._seen: dict[tuple[str, str], Obj] = {}
        self._drivers = drivers if drivers is not None else set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-operator", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def driver_running(self, name: str, namespace: str = "default") -> None:
        """What the kubelet would report: the application's driver pod runs (a pod event)."""
        with self._lock:
            self._drivers.add((namespace, name))
        self._reconcile((namespace, name))

    # ------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, body: Obj | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, method=method, data=data)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                raise _ConflictError from None
            if exc.code == 404:
                return None
            raise

    def _path(self, key: tuple[str, str], sub: str = "") -> str:
        return f"{_APPS}/namespaces/{key[0]}/sparkapplications/{key[1]}{sub}"

    def _events(self, version: str) -> Iterator[Obj]:
        query = f"watch=true&resourceVersion={version}&timeoutSeconds=1"
        url = f"{self.url}{_APPS}/sparkapplications?{query}"
        with urllib.request.urlopen(url, timeout=10) as stream:
            for line in stream:
                if line.strip():
                    yield json.loads(line)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        """List, then watch from the list's version, as an informer does."""
        while not self._stop.is_set():
            try:
                listed = self._request("GET", f"{_APPS}/sparkapplications")
                if listed is None:  # the CRD is not applied yet
                    self._stop.wait(0.2)
                    continue
                version = listed["metadata"]["resourceVersion"]
                for app in listed["items"]:
                    self._on_event("ADDED", app)
                while not self._stop.is_set():
                    for event in self._events(version):
                        version = event["object"]["metadata"].get("resourceVersion", version)
                        self._on_event(event["type"], event["object"])
            except Exception as exc:  # a controller logs and starts over
                self.errors.append(repr(exc))
                self._stop.wait(0.5)

    def _on_event(self, kind: str, app: Obj) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = (app["metadata"].get("namespace", ""), app["metadata"]["name"])
        old = self._seen.get(key)
        if kind == "DELETED":
            self._seen.pop(key, None)
            with self._lock:
                self._drivers.discard(key)
            return
        self._seen[key] = app
        if kind == "MODIFIED" and old is not None and invalidates(old, app):
            forced = copy.deepcopy(app)
            forced.setdefault("status", {}).setdefault("applicationState", {})
            forced["status"]["applicationState"]["state"] = "INVALIDATING"
            try:
                self._request("PUT", self._path(key, "/status"), forced)
            except _ConflictError:
                return  # upstream logs it and drops the event
        self._reconcile(key)

    def _reconcile(self, key: tuple[str, str]) -> None:
        """``retry.RetryOnConflict`` around one reconcile: read, decide, write the status."""
        for _ in range(5):
            app = self._request("GET", self._path(key))
            if app is None or app["metadata"].get("deletionTimestamp"):
                return
            with self._lock:
                status, deletes = reconcile(app, key in self._drivers)
                if deletes:
                    self._drivers.discard(key)
            if status == app.get("status"):
                return
            with contextlib.suppress(_ConflictError):
                self._request("PUT", self._path(key, "/status"), {**app, "status": status})
                return
