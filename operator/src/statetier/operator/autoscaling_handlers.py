"""The autoscaling loop of a CompactionService: a kopf daemon per service that has it enabled.

Every ``periodSeconds`` it reads ``GET /v1/stats`` of the gateway (the Service endpoint, or
``autoscaling.gatewayURL`` when the operator runs outside the cluster), asks
:mod:`statetier.operator.autoscaling` for a replica count and, when it differs, writes it to
``spec.workers.replicas`` (what ``kubectl scale`` writes through the scale subresource), so the
ordinary reconciliation rolls it out and drift correction keeps it. Each change is an event
(reason ``Scaled``); every period's observation and decision goes to ``status.autoscaling`` and
to the metrics. A gateway that cannot be read changes nothing (reason ``GatewayUnreachable``).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import aiohttp
import kopf
from statetier.operator import autoscaling, compaction_service, kube, metrics
from statetier.operator.compaction_service import GROUP, PLURAL, VERSION

Obj = dict[str, Any]


def _enabled(spec: kopf.Spec, **_: Any) -> bool:
    return autoscaling.settings_of(dict(spec)).enabled


async def _stats(url: str) -> Obj:
    timeout = aiohttp.ClientTimeout(total=3)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{url.rstrip('/')}/v1/stats") as response,
    ):
        response.raise_for_status()
        body = await response.json()
        return dict(body)


@kopf.daemon(GROUP, VERSION, PLURAL, when=_enabled, cancellation_timeout=5.0)
async def autoscale(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Scale the workers from the gateway's queue until autoscaling is disabled or deleted."""
    namespace = namespace or "default"
    spec = compaction_service.with_defaults(dict(body.get("spec") or {}))
    recommender = autoscaling.Recommender(autoscaling.settings_of(spec).window)
    last_reason = ""
    while not stopped:
        spec = compaction_service.with_defaults(dict(body.get("spec") or {}))  # a live view
        settings = autoscaling.settings_of(spec)
        recommender.window = settings.window
        url = settings.gateway_url or compaction_service.endpoint(name, namespace, spec)
        workers = spec["workers"]
        current = compaction_service.desired_workers(spec)
        api = kube.of(memo)
        try:
            stats = await _stats(url)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            metrics.AUTOSCALER_DECISIONS.labels("unreachable").inc()
            if last_reason != "GatewayUnreachable":
                kopf.warn(body, reason="GatewayUnreachable", message=f"{url}: {exc}")
                unreachable = {"reason": "GatewayUnreachable", "message": str(exc)}
                await api.patch_compaction_service(
                    namespace, name, {"status": {"autoscaling": unreachable}}, status=True
                )
            last_reason = "GatewayUnreachable"
            await stopped.wait(settings.period)
            continue
        queued, running = int(stats.get("queued", 0)), int(stats.get("running", 0))
        recommendation = autoscaling.recommend(
            queued, running, workers["targetQueuePerWorker"], workers["min"], workers["max"]
        )
        decision = recommender.decide(time.monotonic(), current, recommendation)
        labels = (namespace, name)
        metrics.AUTOSCALER_RECOMMENDED.labels(*labels).set(recommendation)
        metrics.AUTOSCALER_LOAD.labels(*labels).set(queued + running)
        message = (
            f"{queued} queued + {running} running jobs, target {workers['targetQueuePerWorker']} "
            f"per worker: recommend {recommendation}, workers {current} -> {decision.replicas}"
        )
        status: Obj = {
            "queued": queued,
            "running": running,
            "recommended": recommendation,
            "reason": decision.reason,
            "message": message,
        }
        if decision.replicas != current:
            scaled = {"spec": {"workers": {"replicas": decision.replicas}}}
            await api.patch_compaction_service(namespace, name, scaled)
            direction = "up" if decision.replicas > current else "down"
            metrics.AUTOSCALER_DECISIONS.labels(direction).inc()
            status["lastScaleTime"] = datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            kopf.info(body, reason="Scaled", message=message)
            logger.info("autoscaled %s/%s: %s", namespace, name, message)
        else:
            metrics.AUTOSCALER_DECISIONS.labels("unchanged").inc()
        await api.patch_compaction_service(
            namespace, name, {"status": {"autoscaling": status}}, status=True
        )
        last_reason = decision.reason
        await stopped.wait(settings.period)
