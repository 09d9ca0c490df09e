"""A user's mistake that every attempt of a task repeats, carried to the driver as one line.

A restore that refuses the function's state (a value type changed in a way stored values do not
survive, another kind or serializer: :class:`StateRegistrationError`) happens in the state host,
inside a Spark task. Spark would show it at the driver as a task failure: the task's Python
stack and the host's inside it, wrapped in the Java stacks of the job's abort. The line that
matters is lost in them. So the host sends such an error as its message alone
(``protocol.REFUSED``), the task raises it behind a tag, and the driver finds the tag in
whatever Spark raised and raises the line alone, as the same error the LocalRunner raises.
"""

from __future__ import annotations

import re

from statetier.backend.keyed_backend import StateRegistrationError

__all__ = ["REFUSALS", "TAG", "StateRefusedError", "refused_line", "refusal_at_driver"]

TAG = "[STATETIER_STATE_REFUSED] "
REFUSALS = (StateRegistrationError,)  # deterministic: a retry of the task is refused again
_TAGGED = re.compile(re.escape(TAG) + r"([^\n]*)")


class StateRefusedError(RuntimeError):
    """Raised in the task: the state host refused the function's state (one line, tagged)."""

    def __init__(self, line: str) -> None:
        super().__init__(TAG + line)


def refused_line(error: BaseException) -> str:
    """What the host sends of a refusal: its message, one line."""
    return " ".join(str(error).split("\n"))


def refusal_at_driver(error: BaseException) -> StateRegistrationError | None:
    """The refusal a failed Spark job carries (in its message, at any depth), as the one-line
    error to raise instead; None when the job failed for another reason."""
    found = _TAGGED.search(str(error))
    return None if found is None else StateRegistrationError(found.group(1).strip())
