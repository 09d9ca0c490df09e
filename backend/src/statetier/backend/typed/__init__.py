"""Typed state values: a declared value type, its stored schema and how it may evolve.

A state declared with :class:`~statetier.backend.typed.serializer.TypedSerializer` stores its
values by field name and records their schema (:class:`~statetier.backend.typed.schema.ValueType`)
in every checkpoint manifest, so that a restore can tell which type changes old values survive
(:mod:`statetier.backend.typed.evolution`) and tools can read the values without the job's code.
"""
