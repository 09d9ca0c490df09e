"""kopf handlers for SparkApplications: admission webhooks, events, checkpoint retention.

The webhooks run before the Spark Operator sees the object: validation rejects bad
``statetier.io/*`` annotations, mutation adds the spill volume and the backend settings. The
watch handlers report what was configured (an event) and count managed applications. On
deletion a finalizer applies the checkpoint retention, bounded in time so that an unreachable
object store can delay the deletion but never block it.
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


@kopf.on.delete(GROUP, VERSION, PLURAL, annotations=OPTED_IN)
async def apply_retention(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Keep or delete the checkpoints, then let the deletion go on whatever happened."""
    annotations = dict(body.get("metadata", {}).get("annotations") or {})
    retention = annotations.get(ann.PREFIX + "checkpoint-retention", "retain")
    uri = annotations.get(ann.PREFIX + "checkpoint-uri")
    if retention != "delete" or not uri:
        kopf.info(body, reason="CheckpointsRetained", message=f"checkpoints kept at {uri}")
        return
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
