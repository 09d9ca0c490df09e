"""mmap'd chunk files on the spill dirs, and the space allocator that hands out regions of them.

Why chunks: a spilled key group needs a few variable-sized regions (its hash index and its record
log) that grow and shrink. Mapping one big file per chunk and carving regions out of it keeps the
number of files and mappings small, and lets one ``mmap`` serve thousands of key groups.

Why ``posix_fallocate``: a sparse file turns a full disk into SIGBUS on some later page fault,
which kills the process (log4j2 and MapDB learned this). Reserving the blocks when a chunk is
created turns it into an ``OSError(ENOSPC)`` at one place, where the caller can keep the key
group on heap instead.

Chunks are created on the spill dirs in rotation, so several local SSDs share the load. Freed
space is reused first-fit with coalescing; :meth:`SpillStorage.compact` moves the live regions
out of a fragmented chunk so that the chunk can be deleted. Regions pinned by a snapshot view are
never moved or freed until the view is closed (see :mod:`.spilled_map`).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import errno
import logging
import mmap
import os
import tempfile
import weakref
from collections.abc import Callable, Sequence

from statetier.backend.spill.lifecycle import SpillDirs

__all__ = ["Chunk", "Region", "SpaceUnavailableError", "SpillStorage", "default_spill_dirs"]

log = logging.getLogger(__name__)


def default_spill_dirs() -> list[str]:
    """Spark's local dirs (its local SSDs) if set, else the system temp dir."""
    local = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    roots = local or [tempfile.gettempdir()]
    return [os.path.join(root.strip(), "statetier-spill") for root in roots]


ALIGN = 64  # region sizes and offsets are multiples of this


class SpaceUnavailableError(OSError):
    """No spill dir could provide space (disk full, unwritable, no usable dir)."""


class Region:
    """``size`` bytes at ``offset`` of a chunk's mapping; moved by compaction, pinned by views.

    An owner that caches ``mm`` and ``offset`` sets ``moved``, which compaction calls after it
    relocated the region.
    """

    __slots__ = ("chunk", "mm", "moved", "offset", "pins", "retired", "size")

    def __init__(self, chunk: Chunk, offset: int, size: int) -> None:
        self.chunk = chunk
        self.mm = chunk.mm
        self.offset = offset
        self.size = size
        self.pins = 0  # open snapshot views reading this region
        self.retired = False  # released by its owner while pinned: freed at the last unpin
        self.moved: Callable[[], None] | None = None  # told after compaction moved the region


class Chunk:
    """One chunk file, mapped whole, with its sorted free extents."""

    def __init__(self, path: str, size: int, mm: mmap.mmap, fd: int) -> None:
        self.path = path
        self.size = size
        self.mm = mm
        self.fd = fd
        self.free: list[tuple[int, int]] = [(0, size)]  # (offset, size), sorted, coalesced
        self.regions: set[Region] = set()
        self.used = 0

    def take(self, size: int) -> int | None:
        """First-fit: the offset of ``size`` free bytes, or None."""
        for i, (offset, extent) in enumerate(self.free):
            if extent >= size:
                if extent == size:
                    del self.free[i]
                else:
                    self.free[i] = (offset + size, extent - size)
                self.used += size
                return offset
        return None

    def give(self, offset: int, size: int) -> None:
        """Return an extent, merging it with free neighbours."""
        self.used -= size
        i = bisect.bisect_left(self.free, (offset, 0))
        if i < len(self.free) and offset + size == self.free[i][0]:
            size += self.free[i][1]
            del self.free[i]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == offset:
            offset = self.free[i - 1][0]
            size += self.free[i - 1][1]
            del self.free[i - 1]
            i -= 1
        self.free.insert(i, (offset, size))

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _round(size: int) -> int:
    return max(ALIGN, (size + ALIGN - 1) // ALIGN * ALIGN)


class SpillStorage:
    """Regions in chunk files on ``dirs`` (used in rotation), owned by this process."""

    def __init__(
        self,
        dirs: Sequence[str],
        chunk_size: int = 64 << 20,
        *,
        on_error: Callable[[str, OSError], None] | None = None,
    ) -> None:
        self.chunk_size = chunk_size
        self._on_error = on_error
        self._logged: set[tuple[str, int | None]] = set()
        self.chunks: list[Chunk] = []
        self._next_dir = 0
        self._seq = 0
        self.dirs = SpillDirs(dirs, on_error=self._report)
        self.closed = False
        # Clean exit without an explicit close(): the weak reference keeps atexit from
        # keeping every storage ever made alive.
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            storage = ref()
            if storage is not None:
                storage.close()

        self._close_at_exit = close_at_exit
        atexit.register(close_at_exit)

    # ------------------------------------------------------------------ errors

    def _report(self, where: str, exc: OSError) -> None:
        """Log an I/O problem once per (dir, errno); always count it."""
        reason = errno.errorcode.get(exc.errno or 0, "EIO") if exc.errno else type(exc).__name__
        if (where, exc.errno) not in self._logged:
            self._logged.add((where, exc.errno))
            log.error(
                "spill dir %s unusable (%s: %s); key groups that cannot be spilled stay on heap",
                where,
                reason,
                exc.strerror or exc,
            )
        if self._on_error is not None:
            self._on_error(reason, exc)

    # ------------------------------------------------------------------ chunks

    def _new_chunk(self, size: int) -> Chunk:
        """A new chunk on the next usable dir; tries every dir once before giving up."""
        usable = self.dirs.usable
        if not usable:
            raise SpaceUnavailableError(errno.ENOENT, "no usable spill dir")
        last: OSError | None = None
        for _ in range(len(usable)):
            directory = usable[self._next_dir % len(usable)]
            self._next_dir += 1
            self._seq += 1
            path = os.path.join(directory, f"{self.dirs.owner_prefix}-{self._seq:06d}.chunk")
            try:
                return self._create(path, size)
            except OSError as exc:
                self._report(directory, exc)
                last = exc
        assert last is not None
        raise SpaceUnavailableError(last.errno or errno.EIO, f"no spill space: {last}") from last

    @staticmethod
    def _create(path: str, size: int) -> Chunk:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Reserve the blocks now: ENOSPC here, not SIGBUS on a later page fault.
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return Chunk(path, size, mm, fd)

    # ------------------------------------------------------------------ regions

    def allocate(self, size: int) -> Region:
        """A region of at least ``size`` bytes; SpaceUnavailableError when none can be had."""
        if self.closed:
            raise SpaceUnavailableError(errno.EBADF, "spill storage is closed")
        size = _round(size)
        for chunk in self.chunks:
            offset = chunk.take(size)
            if offset is not None:
                return self._region(chunk, offset, size)
        chunk_size = max(
            self.chunk_size, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        )
        chunk = self._new_chunk(chunk_size)
        self.chunks.append(chunk)
        offset = chunk.take(size)
        assert offset is not None
        return self._region(chunk, offset, size)

    @staticmethod
    def _region(chunk: Chunk, offset: int, size: int) -> Region:
        region = Region(chunk, offset, size)
        chunk.regions.add(region)
        return region

    def free(self, region: Region) -> None:
        """Give ``region`` back, or retire it until its last snapshot view is closed."""
        if region.pins:
            region.retired = True
            return
        chunk = region.chunk
        if region not in chunk.regions:
            return  # already freed
        chunk.regions.discard(region)
        chunk.give(region.offset, region.size)
        if not chunk.regions and len(self.chunks) > 1:
            # An empty chunk is deleted, unless it is the only one (spills come in waves).
            self.chunks.remove(chunk)
            chunk.close()

    def unpin(self, region: Region) -> None:
        region.pins -= 1
        if region.pins == 0 and region.retired:
            region.retired = False
            self.free(region)

    def compact(self, max_utilization: float = 0.5) -> int:
        """Move live regions out of sparsely used chunks and delete those chunks.

        A chunk qualifies when less than ``max_utilization`` of it is used and nothing in it is
        pinned. Regions move to other chunks only (never into a new file), so compaction never
        needs more disk than it frees. Returns the number of chunks deleted.
        """
        released = 0
        for chunk in sorted(self.chunks, key=lambda c: c.used):
            if len(self.chunks) < 2 or chunk.used >= max_utilization * chunk.size:
                continue
            if any(r.pins for r in chunk.regions):
                continue
            others = [c for c in self.chunks if c is not chunk]
            if sum(c.size - c.used for c in others) < chunk.used:
                continue
            for region in sorted(chunk.regions, key=lambda r: -r.size):
                for target in others:
                    offset = target.take(region.size)
                    if offset is not None:
                        target.mm[offset : offset + region.size] = chunk.mm[
                            region.offset : region.offset + region.size
                        ]
                        chunk.regions.discard(region)
                        chunk.give(region.offset, region.size)
                        region.chunk, region.mm, region.offset = target, target.mm, offset
                        target.regions.add(region)
                        if region.moved is not None:
                            region.moved()
                        break
            if not chunk.regions:
                self.chunks.remove(chunk)
                chunk.close()
                released += 1
        return released

    # ------------------------------------------------------------------ figures and lifecycle

    def disk_bytes(self) -> int:
        """Bytes reserved on disk by this process's chunk files."""
        return sum(c.size for c in self.chunks)

    def used_bytes(self) -> int:
        return sum(c.used for c in self.chunks)

    def close(self) -> None:
        """Unmap and delete every chunk file and the owner locks (clean exit)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._close_at_exit)
        for chunk in self.chunks:
            try:
                chunk.close()
            except (OSError, ValueError, BufferError) as exc:
                log.warning("could not remove spill chunk %s: %s", chunk.path, exc)
        self.chunks = []
        self.dirs.close()
