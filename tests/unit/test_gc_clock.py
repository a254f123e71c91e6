"""The worker's garbage-collector account: what its batch log line reports."""

import gc

from services.common.lifecycle import GcClock


def test_gc_clock_counts_full_collections_and_time():
    clock = GcClock()
    gc.disable()  # only the collections this test asks for
    try:
        junk = [[i] for i in range(50_000)]  # something for the collector to scan
        gc.collect(1)
        assert clock.full_collections == 0 and clock.seconds > 0
        gc.collect()
        gc.collect()
        assert clock.full_collections == 2
        del junk
    finally:
        gc.enable()
        clock.close()
