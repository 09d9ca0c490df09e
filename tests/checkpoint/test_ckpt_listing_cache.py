"""Several processes write one checkpoint location (the driver, state hosts, compaction
workers): a listing one of them made must never hide a file another wrote after it. s3fs keeps
listings and consults them even to read a file by name (it asks the size first), so a driver
whose retention listed an epoch's results directory while the hosts were still writing it
waited for a result it could not see (found by ``statetier bench compaction-offload``)."""

from __future__ import annotations

from tests.checkpoint.ckpt_support import Location


def test_a_file_written_elsewhere_after_a_listing_is_read(location: Location) -> None:
    driver = location.store()
    # another process: a file system instance of its own, whose writes the driver's never sees
    host = location.store(skip_instance_cache=True)
    driver.put("data/epoch-0000000001/w/results/0-of-2.json", b"{}")
    assert set(driver.list_files()) == {"data/epoch-0000000001/w/results/0-of-2.json"}
    host.put("data/epoch-0000000001/w/results/1-of-2.json", b"{ }")
    path = driver.full_path("data/epoch-0000000001/w/results/1-of-2.json")
    assert driver.fs.cat_file(path) == b"{ }"
    assert set(driver.list_files()) == {
        "data/epoch-0000000001/w/results/0-of-2.json",
        "data/epoch-0000000001/w/results/1-of-2.json",
    }
