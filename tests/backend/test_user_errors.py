"""A user's mistake gets a one- or two-line error naming what is wrong and the fix, raised where
the mistake is made (issue 45): each case runs the real code path and checks the message."""

from __future__ import annotations

from pathlib import Path

import pytest
from statetier.backend import LocalRunner
from statetier.backend.config import ConfigError
from statetier.tools.wordcount import WordCount


def one_or_two_lines(message: str) -> str:
    """``message``, checked to be an error a user reads at a glance."""
    assert 0 < len(message.splitlines()) <= 2, message
    return message


@pytest.mark.parametrize("chain", ["file://{root}/a::file:{root}/b", "memory://x::file://{root}"])
def test_a_chained_checkpoint_uri_is_refused_before_anything_is_written(
    tmp_path: Path, chain: str
) -> None:
    uri = chain.format(root=tmp_path)
    with pytest.raises(ConfigError) as info:
        LocalRunner(WordCount, 1, checkpoint_uri=uri)
    message = one_or_two_lines(str(info.value))
    assert repr(uri) in message and "'::'" in message and "give one location" in message
    assert list(tmp_path.iterdir()) == []
