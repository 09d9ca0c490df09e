"""Compaction carries a typed state's schema forward: in the process and on the service.

A job writes a typed state as ``V1``, is restored as ``WithScore`` (a field added with a
default), and writes deltas until its chains are compacted: the manifest that names the
compacted bases records the new schema, and a restore from it reads every value in the new
shape (the old values with the default, the rewritten ones as written). The merge copies value
bytes as they are, so the compaction service's worker needs neither the job's classes nor the
schema; the manifest's entry is the driver's.
"""

from __future__ import annotations

from typing import Any

from statetier.backend import TypedSerializer, ValueStateDescriptor
from statetier.backend.compaction_client import RemoteCompactor
from statetier.backend.config import load_config
from statetier.backend.local_runner import LocalRunner
from statetier.tools.compaction_launch import Processes, SeaweedFS

from tests.backend.test_schema_evolution import KEYS, READ, V1, Probe, WithScore


def _runner(uri: str, value_type: Any, options: dict[str, Any] | None = None) -> LocalRunner:
    descriptor: ValueStateDescriptor[Any] = ValueStateDescriptor(
        "session", serializer=TypedSerializer(value_type)
    )
    return LocalRunner(
        lambda: Probe(descriptor),
        1,
        max_parallelism=8,
        checkpoint_uri=uri,
        storage_options=options,
        config=load_config({"compaction.delta-trigger": 2, "compaction.size-ratio": 1e6}, env={}),
    )


def _evolve_and_compact(uri: str, options: dict[str, Any] | None, compactor: Any = None) -> None:
    """V1 for every key; then, as WithScore, three epochs rewriting a few keys each, until the
    chains are compacted; then a restore from the manifest naming the compacted bases."""
    writer = _runner(uri, V1, options)
    writer.run_epoch((key, V1(key, i)) for i, key in enumerate(KEYS))
    writer.close()

    evolved = _runner(uri, WithScore, options)
    assert evolved.checkpointer is not None and evolved.store is not None
    if compactor is not None:
        evolved.checkpointer.compactor = compactor
    for epoch in range(3):
        evolved.run_epoch((key, WithScore(key, -1, float(epoch))) for key in KEYS[epoch::6])
    evolved.checkpointer.drain()
    evolved.checkpoint()  # names the compacted bases
    manifest = evolved.store.manifest()
    evolved.close()

    chains = [c for c in manifest.chains() if c.state == "session"]
    assert chains and all("/compacted/" in c.base.path for c in chains), chains
    schema = TypedSerializer(WithScore).schema
    assert schema is not None
    assert manifest.states["session"]["schemas"] == {"value": schema.to_json()}

    expected = {key: WithScore(key, i) for i, key in enumerate(KEYS)}
    for epoch in range(3):
        expected.update({key: WithScore(key, -1, float(epoch)) for key in KEYS[epoch::6]})
    restored = _runner(uri, WithScore, options)
    assert dict(restored.process((key, READ) for key in KEYS)) == expected
    restored.close()


def test_local_compaction_carries_the_new_schema_forward(tmp_path: Any) -> None:
    _evolve_and_compact(f"file://{tmp_path}/ckpt", None)


def test_the_compaction_service_carries_the_new_schema_forward(
    procs: Processes, seaweed: SeaweedFS, prefix: str
) -> None:
    gateway, _ = procs.gateway([prefix])
    procs.worker(gateway, [prefix])
    remote = RemoteCompactor([gateway], timeout=60, poll_interval=0.05, failure_strategy="fail")
    _evolve_and_compact(f"{prefix}/schema", seaweed.options, remote)
    assert remote.remote_jobs > 0 and remote.fallbacks == 0
