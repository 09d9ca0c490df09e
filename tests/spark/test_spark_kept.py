"""What a state host keeps between tasks is bounded: a host on a Spark Connect server serves
every query of the server's life, each with its own function, settings and store, and keeps the
most recently used of each only (statetier.backend.spark.kept)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from statetier.backend.spark.kept import KEPT_PER_TABLE, Kept


def maker(made: list[str], key: str) -> Callable[[], str]:
    """Makes ``key``'s value and notes that it did."""

    def make() -> str:
        made.append(key)
        return key.upper()

    return make


def test_a_kept_value_is_made_once_while_it_is_used() -> None:
    made: list[str] = []
    kept: Kept[str, str] = Kept(limit=3)
    for _ in range(5):
        assert kept.get("a", maker(made, "a")) == "A"
    assert made == ["a"] and len(kept) == 1


def test_the_least_recently_used_goes_first_and_is_made_again_when_asked() -> None:
    made: list[str] = []
    kept: Kept[str, str] = Kept(limit=3)
    for key in "abcad":  # "a" used again: "b" is the least recently used when "d" comes
        kept.get(key, maker(made, key))
    assert len(kept) == 3 and "b" not in kept and all(k in kept for k in "acd")
    assert kept.get("b", maker(made, "b")) == "B"  # made again; "c" goes
    assert made == ["a", "b", "c", "d", "b"] and "c" not in kept


def test_a_host_keeps_many_queries_but_not_all() -> None:
    kept: Kept[str, str] = Kept()
    made: list[str] = []
    for query in range(10 * KEPT_PER_TABLE):
        kept.get(str(query), maker(made, str(query)))
    assert len(kept) == KEPT_PER_TABLE and len(made) == 10 * KEPT_PER_TABLE
    assert all(str(q) in kept for q in range(9 * KEPT_PER_TABLE, 10 * KEPT_PER_TABLE))


def test_a_table_of_no_entries_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one entry, not 0"):
        Kept(limit=0)
