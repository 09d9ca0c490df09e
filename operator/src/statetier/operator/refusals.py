"""A request refused for the user's mistake (a bad ``statetier.io/*`` annotation, a bad
CompactionService spec) is a warning, not an error.

kopf denies an admission when its handler raises :class:`kopf.AdmissionError`, and logs every
such denial at error severity (``Handler '...' failed permanently: ...``), where alerting on
error logs would page for a typo in someone's manifest. :func:`refuse` marks the refusal in a
context variable of the admission's task before raising, and a filter on kopf's object logger
turns that one record into a warning (the handler must be async: kopf runs async handlers in
the admission's own task, sync ones in a thread with a copy of the context).

An UPDATE refused this way also gets a Warning Event on the stored object (``kubectl describe``
shows it to whoever owns the object, not only to the client that sent the update); kopf's own
event poster runs only in its watch tasks, so the operator's client posts it. A refused CREATE
gets none: the object does not exist, and the client that sent it already has the message.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import NoReturn

import kopf
from statetier.operator import kube

__all__ = ["install", "refuse"]

_REFUSAL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "statetier_refusal", default=None
)


class _RefusalAsWarning(logging.Filter):
    """Turns kopf's error record of a refusal :func:`refuse` marked into a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        refusal = _REFUSAL.get()
        if refusal and record.levelno == logging.ERROR and record.getMessage().endswith(refusal):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER = _RefusalAsWarning()


def install() -> None:
    """Put the filter on kopf's object logger (once, however often it is called)."""
    logging.getLogger("kopf.objects").addFilter(_FILTER)


_POSTING: set[asyncio.Task[None]] = set()  # kept referenced until done


async def _post(client: kube.Kube, body: kopf.Body, reason: str, message: str) -> None:
    try:
        await client.post_event(dict(body), "Warning", reason, message)
    except kube.ApiError as exc:
        logging.getLogger(__name__).warning("could not post the %s event: %s", reason, exc)


def refuse(
    body: kopf.Body, operation: str | None, memo: kopf.Memo, reason: str, message: str
) -> NoReturn:
    """Deny the admission with ``message`` (HTTP 422), logged as a warning; on UPDATE also a
    Warning Event ``reason`` on the object, posted in the background so the answer to the
    apiserver never waits for it (a failure to post is logged)."""
    _REFUSAL.set(message)
    if operation == "UPDATE" and "kube" in memo:
        task = asyncio.create_task(_post(kube.of(memo), body, reason, message))
        _POSTING.add(task)
        task.add_done_callback(_POSTING.discard)
    raise kopf.AdmissionError(message, code=422)
