"""statetier's developer tools: the demos, the benchmarks and what they run on.

Nothing here runs in a Spark job, a compaction service or the operator, so none of it ships in
their packages or images. The ``statetier`` command finds ``demo`` and ``bench`` through the
``statetier.commands`` entry points this distribution declares.
"""
