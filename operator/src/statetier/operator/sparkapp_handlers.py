"""kopf handlers for SparkApplications: admission webhooks, events, checkpoint retention.

The webhooks run before the Spark Operator sees the object: validation rejects bad
``statetier.io/*`` annotations, mutation adds the spill volume and the backend settings. The
watch handlers report what was configured (an event) and count managed applications.

Only an application whose checkpoints are to be deleted (``checkpoint-retention: delete`` and a
``checkpoint-uri``) carries kopf's finalizer: its deletion waits for the operator, which deletes
the checkpoints within ``--checkpoint-delete-timeout`` and lets go whatever happened. The
default, ``retain``, needs nothing done on deletion, so no finalizer makes such a deletion wait
for an operator that may not run; when the operator sees the deletion it posts
``CheckpointsRetained``. kopf adds its finalizer for every non-optional ``on.delete`` handler
whose filter matches an object, and removes it when none matches any more (an application
switched back to ``retain``, or one finalized by an earlier version), the next time it
processes the object.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fsspec
import kopf
from statetier.operator import annotations as ann
from statetier.operator import metrics, settings
from statetier.operator.sparkapp import GROUP, PLURAL, VERSION

RESOURCE = "sparkapplication"
OPTED_IN = {ann.PREFIX + "enabled": "true"}
RETENTION = ann.PREFIX + "checkpoint-retention"
URI = ann.PREFIX + "checkpoint-uri"
DELETES_CHECKPOINTS: dict[str, Any] = {
    **OPTED_IN,
    RETENTION: "delete",
    URI: kopf.PRESENT,
}


def _opted_in(annotations: kopf.Annotations, **_: Any) -> bool:
    return ann.enabled(dict(annotations))


@kopf.index(GROUP, VERSION, PLURAL, when=_opted_in)
def managed_applications(name: str, namespace: str | None, **_: Any) -> dict[tuple[str, str], bool]:
    """The opted-in SparkApplications that exist now. kopf keeps the index: an application
    leaves it when it is deleted or opts out (it no longer passes the filter)."""
    return {(namespace or "", name): True}


@kopf.on.event(GROUP, VERSION, PLURAL)
def observe(body: kopf.Body, type: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """Count managed applications; post an event when the configuration summary changes.

    ``kwargs["managed_applications"]`` is the index above (kopf passes indices by name). kopf
    updates its indices from an event before it calls the handlers of that event, so the count
    includes (or no longer includes) this application."""
    managed: kopf.Index[tuple[str, str], bool] = kwargs["managed_applications"]
    annotations = body.get("metadata", {}).get("annotations") or {}
    metrics.MANAGED_APPLICATIONS.set(len(managed))
    summary = annotations.get(ann.STATUS)
    if type != "DELETED" and summary and memo.get("posted") != summary:
        memo["posted"] = summary
        with metrics.reconciling(RESOURCE):
            kopf.info(body, reason="StatetierConfigured", message=summary)


def _delete_tree(uri: str) -> bool:
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        return False
    fs.rm(path, recursive=True)
    return True


def _retention(body: kopf.Body) -> tuple[str, str | None]:
    """(checkpoint retention, checkpoint URI) from the application's annotations."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return annotations.get(RETENTION, "retain"), annotations.get(URI) or None


@kopf.on.event(GROUP, VERSION, PLURAL, annotations=OPTED_IN)
def report_retained(body: kopf.Body, type: str, **_: Any) -> None:
    """Say that an opted-in application's checkpoints stay, when the operator sees it go."""
    retention, uri = _retention(body)
    if type != "DELETED" or (retention == "delete" and uri):
        return
    message = f"checkpoints kept at {uri}" if uri else f"no {URI}: no checkpoints to delete"
    kopf.info(body, reason="CheckpointsRetained", message=message)


@kopf.on.delete(GROUP, VERSION, PLURAL, annotations=DELETES_CHECKPOINTS)
async def delete_checkpoints(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Delete the checkpoints, then let the deletion go on whatever happened."""
    uri = _retention(body)[1]
    assert uri is not None  # the filter requires it
    timeout = settings.of(memo).checkpoint_delete_timeout
    try:
        with metrics.reconciling(RESOURCE):
            deleted = await asyncio.wait_for(asyncio.to_thread(_delete_tree, uri), timeout)
    except Exception as exc:
        metrics.ERRORS.labels(RESOURCE, "retention").inc()
        message = (
            f"could not delete the checkpoints at {uri} within {timeout:g}s: "
            f"{type(exc).__name__}: {exc}; they are left in place"
        )
        kopf.warn(body, reason="CheckpointDeleteFailed", message=message)
        logger.warning(message)
        return
    message = f"checkpoints at {uri} deleted" if deleted else f"no checkpoints at {uri}"
    kopf.info(body, reason="CheckpointsDeleted", message=message)
