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
    upgrade,
)
from statetier.operator.sparkapp import GROUP, PLURAL, VERSION

Obj = dict[str, Any]


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


def restore_from_uri(
    namespace: str, value: str | None, index: kopf.Index[Any, Any]
) -> tuple[str | None, str | None]:
    """(savepoint URI, problem) of a ``statetier.io/restore-from`` value: a URI as it is, a
    StateSnapshot name resolved from the index of snapshots to its ``status.uri``, refused
    (with the fix) unless it Succeeded."""
    if not value or "://" in value:
        return value, None
    found = list(index.get((namespace, value), ()))
    key = f"{ann.PREFIX}restore-from"
    if not found:
        return None, (
            f"annotation {key}={value!r}: no StateSnapshot {namespace}/{value}: create it, or "
            "give a savepoint URI"
        )
    phase, uri = found[0]
    if phase != "Succeeded" or not uri:
        return None, (
            f"annotation {key}={value!r}: StateSnapshot {namespace}/{value} is "
            f"{phase or 'Pending'}, not Succeeded: wait for it "
            f"(kubectl wait --for=condition=Ready statesnapshot/{value}) or name another"
        )
    return str(uri), None


def _annotations_of(obj: Any) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def _restore_changed(annotations: dict[str, str], old: Any) -> bool:
    """Whether the request sets restore-from anew (a create, or a changed value): an update
    that keeps it is not refused because its snapshot was deleted since."""
    key = f"{ann.PREFIX}restore-from"
    previous = _annotations_of(old)
    return key in annotations and annotations.get(key) != previous.get(key)


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
    if kwargs.get("old"):
        problems += upgrade.last_state_problems(_annotations_of(kwargs["old"]), dict(annotations))
    if not problems and _restore_changed(dict(annotations), kwargs.get("old")):
        namespace = body.get("metadata", {}).get("namespace") or "default"
        value = annotations.get(f"{ann.PREFIX}restore-from")
        problem = restore_from_uri(namespace, value, kwargs["snapshot_uris"])[1]
        problems += [problem] if problem else []
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
    """Add the spill volume, its mount and the backend settings to an opted-in application;
    on a spec change with ``statetier.io/upgrade-mode``, move its state as the mode says
    (:mod:`statetier.operator.upgrade`).

    ``kwargs["compaction_endpoints"]``, ``kwargs["compaction_tokens"]`` and
    ``kwargs["snapshot_uris"]`` are kopf indices (kopf passes indices by name), so admission
    never waits on an API call.
    """
    annotations = _annotations_of(body)
    if not ann.enabled(annotations) or ann.problems(annotations):
        # The validating webhook rejects bad ones with the full message; do not half-configure.
        metrics.ADMISSIONS.labels("mutate", "skipped").inc()
        return
    result = _configure(body, annotations, namespace or "default", memo, kwargs)
    old = kwargs.get("old")
    if old:
        new_spec = {**dict(body.get("spec") or {}), **result.spec_changes}
        changed = upgrade.spec_changed(dict(old.get("spec") or {}), new_spec)
        name = body["metadata"]["name"]
        plan = upgrade.admit(
            _annotations_of(old), annotations, changed, name, namespace or "default"
        )
        if plan.annotations:
            moved = {k: v for k, v in {**annotations, **plan.annotations}.items() if v is not None}
            result = _configure(body, moved, namespace or "default", memo, kwargs)
        for key, value in plan.annotations.items():
            patch.metadata.annotations[key] = value
        if plan.suspend and (body.get("spec") or {}).get("suspend") is not True:
            patch.spec["suspend"] = True
    warnings.extend(result.warnings)
    if result.empty and not patch:
        metrics.ADMISSIONS.labels("mutate", "unchanged").inc()
        return
    spec = dict(body.get("spec") or {})
    for key, value in result.spec_changes.items():
        patch.spec[key] = _replacing(spec.get(key), value)
    for key, value in result.annotations.items():
        patch.metadata.annotations[key] = value
    metrics.ADMISSIONS.labels("mutate", "mutated").inc()


def _configure(
    body: kopf.Body, annotations: dict[str, str], namespace: str, memo: kopf.Memo, kwargs: Any
) -> sparkapp.Mutation:
    """The mutation for ``annotations`` (the application's, or those an upgrade moved), with
    its warnings."""
    app = ann.parse(annotations)
    endpoint, problem = _compaction_endpoint(
        namespace, app.compaction_service, kwargs["compaction_endpoints"]
    )
    token_warnings: list[str] = []
    token = _compaction_token(
        namespace, app.compaction_service, kwargs["compaction_tokens"], token_warnings
    )
    port = settings.of(memo).executor_metrics_port
    restore, restore_problem = restore_from_uri(
        namespace, app.restore_from, kwargs["snapshot_uris"]
    )
    extra = token_warnings if endpoint else []
    if restore_problem:
        # Validation refuses a new value; one kept since its snapshot went stays as written.
        extra.append(restore_problem)
        restore = _written_restore(dict(body))
    result = sparkapp.mutate(
        dict(body), app, endpoint, problem, token, metrics_port=port, restore_from=restore
    )
    result.warnings.extend(extra)
    return result


def _replacing(old: Any, new: Any) -> Any:
    """``new`` as a merge patch over ``old``: kopf merges a mapping into the field, so a key
    the mutation dropped (a restore-from an upgrade left behind) is set to None to go."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    gone: dict[str, Any] = {k: None for k in old if k not in new}
    return {**gone, **{k: _replacing(old.get(k), v) for k, v in new.items()}}


def _written_restore(body: Obj) -> str | None:
    """The restore-from URI an earlier mutation wrote into the application's sparkConf."""
    conf = (body.get("spec") or {}).get("sparkConf") or {}
    value = conf.get(sparkapp.spark_key("checkpoint.restore-from"))
    return str(value) if value else None


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
