"""The message codec: a dataclass's fields travel by their names and annotated types, a nested
message marked FLAT inline, one marked LOCAL not at all; a bad field is named."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from typing import Any

import pytest
from statetier.backend.wire import (
    FLAT,
    LOCAL,
    Fields,
    MessageError,
    decode_fields,
    encode_fields,
)


class Mood(str, enum.Enum):
    CALM = "calm"
    BUSY = "busy"
    GONE = "gone"


@dataclasses.dataclass(frozen=True)
class Inner:
    at: int | None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Outer:
    count: int
    ratio: float
    on: bool
    name: str
    maybe: str | None
    names: tuple[str, ...]
    labels: dict[str, str]
    options: dict[str, Any]
    mood: Mood
    inner: Inner = dataclasses.field(metadata=FLAT)
    seen: float = dataclasses.field(default=0.0, metadata=LOCAL)
    later: int = 5


OUTER = Outer(
    count=3, ratio=0.5, on=True, name="n", maybe=None, names=("a", "b"), labels={"k": "v"},
    options={"deep": [1, {"x": None}]}, mood=Mood.BUSY, inner=Inner(at=7, note="hi"), seen=9.0,
)  # fmt: skip


def decode(data: Any) -> Outer:
    return decode_fields(Outer, Fields("test message", data))


def test_a_message_travels_by_its_fields_names_nested_inline_and_local_ones_stay() -> None:
    data = json.loads(json.dumps(encode_fields(OUTER)))
    assert data == {
        "count": 3, "ratio": 0.5, "on": True, "name": "n", "maybe": None, "names": ["a", "b"],
        "labels": {"k": "v"}, "options": {"deep": [1, {"x": None}]}, "mood": "busy", "at": 7,
        "note": "hi", "later": 5,
    }  # fmt: skip
    assert decode(data) == dataclasses.replace(OUTER, seen=0.0)  # the receiver's default
    del data["later"], data["note"], data["maybe"]
    assert decode(data) == dataclasses.replace(OUTER, seen=0.0, later=5, inner=Inner(7))


MISSING = object()


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("count", MISSING, "test message: field 'count' is missing"),
        ("count", 1.0, "field 'count' must be an integer, got 1.0"),
        ("ratio", "x", "field 'ratio' must be a number, got 'x'"),
        ("on", 0, "field 'on' must be true or false, got 0"),
        ("maybe", 1, "field 'maybe' must be a string, got 1"),
        ("names", "ab", "field 'names' must be a list of strings, got 'ab'"),
        ("labels", {"k": 1}, "field 'labels' must be an object of strings"),
        ("mood", "sad", "field 'mood' must be calm, busy or gone, got 'sad'"),
        ("at", "now", "field 'at' must be an integer, got 'now'"),
    ],
)
def test_a_bad_field_is_named_with_its_value(name: str, value: Any, error: str) -> None:
    data = {k: v for k, v in encode_fields(OUTER).items() if k != name}
    if value is not MISSING:
        data[name] = value
    with pytest.raises(MessageError, match=re.escape(error)):
        decode(data)


def test_text_that_is_no_json_says_so() -> None:
    with pytest.raises(MessageError, match=r"^test message: not JSON: "):
        Fields.parse("test message", b"{")
    with pytest.raises(MessageError, match=r"^test message: expected a JSON object, got \[1\]"):
        Fields.parse("test message", b"[1]")


def test_a_field_of_another_kind_needs_its_own_writer_and_reader() -> None:
    @dataclasses.dataclass(frozen=True)
    class Nested:
        inners: tuple[Inner, ...]

    nested = Nested((Inner(1), Inner(None, "x")))
    with pytest.raises(TypeError, match=r"Nested\.inners: no reader for"):
        decode_fields(Nested, Fields("nested", {"inners": []}))
    data = encode_fields(nested, inners=lambda xs: [encode_fields(x) for x in xs])
    assert data == {"inners": [{"at": 1, "note": ""}, {"at": None, "note": "x"}]}

    def inners(fields: Fields) -> tuple[Inner, ...]:
        return tuple(decode_fields(Inner, Fields("inner", i)) for i in fields.items("inners"))

    assert decode_fields(Nested, Fields("nested", data), inners=inners) == nested
