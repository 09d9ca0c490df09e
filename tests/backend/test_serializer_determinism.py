"""The default serializer writes the same bytes in every process and from every thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from statetier.backend.serializers import MsgpackSerializer

VALUE = {"tags": {"red", "green", "blue", "cyan"}, "pair": ("a", frozenset({"x", "y", "z"}))}

SCRIPT = """
import sys
from statetier.backend.serializers import MsgpackSerializer
value = {"tags": {"red", "green", "blue", "cyan"}, "pair": ("a", frozenset({"x", "y", "z"}))}
sys.stdout.write(MsgpackSerializer().dumps(value).hex())
"""


def test_set_bytes_do_not_depend_on_the_hash_seed() -> None:
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert MsgpackSerializer().loads(bytes.fromhex(outputs.pop())) == VALUE


def test_concurrent_threads_get_their_own_buffers() -> None:
    serializer = MsgpackSerializer()
    failures: list[object] = []

    def work(offset: int) -> None:
        for i in range(offset, offset + 5000):
            value = (i, [i, str(i)], {"k": {i, i + 1}})
            if serializer.loads(serializer.dumps(value)) != value:
                failures.append(value)

    threads = [threading.Thread(target=work, args=(n * 10_000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
