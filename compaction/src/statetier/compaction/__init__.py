"""Remote compaction for statetier checkpoints (gateway, scheduler, worker pool).

The service merges a key-group range's base and delta files into a new base off the executors,
following the ForSt remote-compaction design. Workers run the same merge code as the backend's
local compaction, so a remote result is byte-for-byte what a local one would be.
"""
