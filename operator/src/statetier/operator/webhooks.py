"""Admission webhooks: SparkApplication validation and mutation, CompactionService validation.

They are a module of their own because kopf refuses to start with admission handlers and no
webhook server: ``statetier-operator run --no-webhooks`` (e.g. when another replica or a
separate Deployment serves them) simply does not import this module.

Mutation reads CompactionService endpoints from a kopf index kept by
:mod:`statetier.operator.compaction_service_handlers`, so an admission never waits on an API call.

The webhook configurations are not kopf's to manage: the operator applies them itself
(:mod:`statetier.operator.webhook_server`, from
:mod:`statetier.operator.webhook_configuration`, with the matchConditions kopf would drop) and
leaves them in place on stop, so while no operator runs the apiserver fails closed
(``failurePolicy: Fail``) instead of admitting an opted-in SparkApplication unmutated. Each
webhook judges CREATE and UPDATE only, and its conditions skip objects being deleted,
metadata-only updates and SparkApplications without ``statetier.io/`` annotations: none of
these waits for an operator that is not there. ``persistent=True`` keeps the handlers'
declaration true for ``kopf run`` with kopf's managed mode.
"""

from __future__ import annotations

from typing import Any, Literal

import kopf
from statetier.operator import annotations as ann
from statetier.operator import (
    compaction_service,
    compaction_token,
    metrics,
    refusals,
    settings,
    sparkapp,
)
from statetier.operator.sparkapp import GROUP, PLURAL, VERSION


def _compaction_endpoint(
    namespace: str, ref: str | None, index: kopf.Index[Any, Any]
) -> tuple[str | None, str | None]:
    """The referenced CompactionService's endpoint from the index, or why there is none."""
    if not ref:
        return None, None
    ref_ns, _, ref_name = ref.rpartition("/")
    key = (ref_ns or namespace, ref_name)
    if key not in index:
        return None, (
            f"CompactionService {key[0]}/{key[1]} not found: compaction runs locally "
            "until it exists and the application is updated"
        )
    endpoints = [e for e in index[key] if e]
    if not endpoints:
        return (
            None,
            f"CompactionService {key[0]}/{key[1]} has no endpoint yet: compaction runs locally",
        )
    return str(endpoints[0]), None


def _compaction_token(
    namespace: str, ref: str | None, index: kopf.Index[Any, Any], warnings: list[str]
) -> tuple[str, str] | None:
    """(Secret, key) of the referenced CompactionService's token, from the index. A Secret is
    readable only by pods of its own namespace: a service elsewhere needs a copy here."""
    if not ref:
        return None
    ref_ns, _, ref_name = ref.rpartition("/")
    key = (ref_ns or namespace, ref_name)
    found = list(index.get(key, ()))
    if not found:
        return None
    secret, field = found[0]
    if key[0] != namespace:
        warnings.append(
            compaction_token.copy_warning(f"{key[0]}/{key[1]}", str(secret), str(field), namespace)
        )
    return str(secret), str(field)


OPERATIONS: list[Literal["CREATE", "UPDATE"]] = ["CREATE", "UPDATE"]


@kopf.on.validate(
    GROUP, VERSION, PLURAL, id="validate-sparkapplication", operations=OPERATIONS, persistent=True
)
async def validate(
    annotations: kopf.Annotations, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Reject bad statetier.io/* annotations, naming each and its allowed values: the user's
    mistake, so a warning (:mod:`statetier.operator.refusals`)."""
    problems = ann.problems(dict(annotations))
    if problems:
        metrics.ADMISSIONS.labels("validate", "rejected").inc()
        refusals.refuse(
            body, kwargs.get("operation"), memo, "InvalidAnnotation", "; ".join(problems)
        )
    metrics.ADMISSIONS.labels("validate", "allowed").inc()


@kopf.on.mutate(
    GROUP, VERSION, PLURAL, id="mutate-sparkapplication", operations=OPERATIONS, persistent=True
)
def mutate(
    body: kopf.Body,
    patch: kopf.Patch,
    namespace: str | None,
    warnings: list[str],
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """Add the spill volume, its mount and the backend settings to an opted-in application.

    ``kwargs["compaction_endpoints"]`` and ``kwargs["compaction_tokens"]`` are the indices of
    CompactionService endpoints and token Secrets (kopf passes indices by name), so admission
    never waits on an API call.
    """
    compaction_endpoints: kopf.Index[Any, Any] = kwargs["compaction_endpoints"]
    compaction_tokens: kopf.Index[Any, Any] = kwargs["compaction_tokens"]
    annotations = dict(body.get("metadata", {}).get("annotations") or {})
    if not ann.enabled(annotations):
        metrics.ADMISSIONS.labels("mutate", "skipped").inc()
        return
    try:
        app = ann.parse(annotations)
    except ValueError:
        # The validating webhook rejects it with the full message; do not half-configure it.
        metrics.ADMISSIONS.labels("mutate", "skipped").inc()
        return
    endpoint, problem = _compaction_endpoint(
        namespace or "default", app.compaction_service, compaction_endpoints
    )
    token_warnings: list[str] = []
    token = _compaction_token(
        namespace or "default", app.compaction_service, compaction_tokens, token_warnings
    )
    port = settings.of(memo).executor_metrics_port
    result = sparkapp.mutate(dict(body), app, endpoint, problem, token, metrics_port=port)
    warnings.extend(result.warnings + (token_warnings if endpoint else []))
    if result.empty:
        metrics.ADMISSIONS.labels("mutate", "unchanged").inc()
        return
    for key, value in result.spec_changes.items():
        patch.spec[key] = value
    for key, value in result.annotations.items():
        patch.metadata.annotations[key] = value
    metrics.ADMISSIONS.labels("mutate", "mutated").inc()


@kopf.on.validate(
    compaction_service.GROUP,
    compaction_service.VERSION,
    compaction_service.PLURAL,
    id="validate-compactionservice",
    operations=OPERATIONS,
    persistent=True,
)
async def validate_compaction_service(
    spec: kopf.Spec, body: kopf.Body, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Reject what the schema cannot check. min above max is the CRD's CEL rule's to refuse
    (the apiserver runs it before any validating webhook); this repeats it for objects stored
    before the rule existed, and checks the image and prefixes."""
    problems = compaction_service.spec_problems(compaction_service.with_defaults(dict(spec)))
    if problems:
        metrics.ADMISSIONS.labels("validate", "rejected").inc()
        refusals.refuse(body, kwargs.get("operation"), memo, "InvalidSpec", "; ".join(problems))
    metrics.ADMISSIONS.labels("validate", "allowed").inc()
