"""The video loader's receiver thread (trainer/data/receiver.py): the loop gets the stream's
items in order, then what the stream raised; close() stops the thread and closes the stream
in it; the loader's workers and thread are gone after close()."""

import threading
from multiprocessing import active_children

import pytest
from mmcurate.trainer.data.receiver import Receiver

import mmcurate
from tests.kit_video import clip_build


def counting(n, closed):
    try:
        yield from range(n)
    finally:
        closed.append(threading.current_thread().name)


def test_items_come_in_order_then_the_streams_end():
    closed = []
    receiver = Receiver(counting(50, closed), depth=3)
    assert list(receiver) == list(range(50))
    with pytest.raises(StopIteration):
        next(receiver)  # asked again, it ends again
    receiver.close()
    assert closed == ["mmcurate-video-receiver"]


def failing():
    yield "first"
    raise RuntimeError("worker 1 failed")


def test_the_streams_error_reaches_the_loop_after_its_items():
    receiver = Receiver(failing())
    assert next(receiver) == "first"
    with pytest.raises(RuntimeError, match="worker 1 failed"):
        next(receiver)
    receiver.close()


def endless(closed):
    try:
        n = 0
        while True:
            yield n
            n += 1
    finally:
        closed.append(True)


def test_close_stops_a_thread_waiting_to_hand_over_and_closes_the_stream():
    closed = []
    receiver = Receiver(endless(closed), depth=1)
    assert [next(receiver) for _ in range(3)] == [0, 1, 2]
    receiver.close()
    assert not receiver.thread.is_alive() and closed == [True]


def test_old_items_are_let_go_by_the_thread_and_the_last_ones_kept():
    receiver = Receiver(iter(range(10)), held=2)
    taken = [next(receiver) for _ in range(5)]
    assert taken == [0, 1, 2, 3, 4] and list(receiver.held) == [3, 4]
    receiver.close()


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    root = tmp_path_factory.mktemp("receiver")
    return clip_build(root, [(10 + i, (48, 32)) for i in range(6)])


def receivers():
    return [t for t in threading.enumerate() if t.name == "mmcurate-video-receiver"]


def test_a_loader_closed_mid_epoch_leaves_no_thread_or_worker(manifest):
    before = {p.pid for p in active_children()}
    loader = mmcurate.video_loader(manifest, 2, 4, workers=2)
    batches = iter(loader)
    keys = next(batches)["__key__"]
    assert len(keys) == 2 and len(receivers()) == 1
    loader.close()
    assert receivers() == []
    assert {p.pid for p in active_children()} <= before
