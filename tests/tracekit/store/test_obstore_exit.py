"""The exit guard for obstore's async requests (tracekit/store/obstore_exit.py): the exit wait holds
while a thread-safe wake-up of zarr's loop is in progress, and obstore's own wake-ups go through it."""

import threading

from tracekit.store import obstore_exit
from tracekit.store.location import resolve


def test_the_exit_wait_holds_while_a_wake_up_is_in_progress():
    in_flight = obstore_exit._InFlight()
    entered, release = threading.Event(), threading.Event()
    calls = []

    def slow_wake_up(x):  # stands for call_soon_threadsafe blocked in its self-pipe write
        entered.set()
        release.wait(30)
        calls.append(x)

    wrapped = in_flight.wrap(slow_wake_up)
    worker = threading.Thread(target=wrapped, args=(7,))
    worker.start()
    assert entered.wait(30)
    assert not in_flight.wait_idle(0.01)  # still inside the call: exit must not go on
    release.set()
    assert in_flight.wait_idle(30) and calls == [7]
    worker.join()


def test_a_failing_wake_up_still_counts_down():
    in_flight = obstore_exit._InFlight()

    def closed_loop():
        raise RuntimeError("Event loop is closed")

    wrapped = in_flight.wrap(closed_loop)
    try:
        wrapped()
    except RuntimeError:
        pass
    assert in_flight.count == 0 and in_flight.wait_idle(0)


def test_obstores_result_hand_offs_pass_through_the_guard(s3):
    from zarr.core.sync import _get_loop

    location = resolve(s3.url("guarded"))
    location.put_missing([("k", b"bytes")])  # sets up the obstore client, which installs the guard
    loop = _get_loop()
    guarded = loop.call_soon_threadsafe
    threads = []

    def spy(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return guarded(*args, **kwargs)

    loop.call_soon_threadsafe = spy
    try:
        assert location.read_bytes("k") == b"bytes"
    finally:
        loop.call_soon_threadsafe = guarded
    # the result came back from one of obstore's own threads, through the counted call
    assert False in threads and guarded.__name__ == "counted"
