"""The video loader workers' reused batch buffers (trainer/data/batch_buffers.py): a buffer is
written again only when no other process holds its batch, so a batch a training script keeps
(whole, as a view, or passed to another process) never changes; let go, buffers are reused."""

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from mmcurate.trainer.data.batch_buffers import SENT_KEY, BatchBuffers, Sent, holders

import mmcurate
from tests.kit_video import clip_build


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """10 clips of 12-21 numbered frames (every window differs), one frame size: every batch
    can take any free buffer."""
    root = tmp_path_factory.mktemp("batch_buffers")
    return clip_build(root, [(12 + i, (64, 48)) for i in range(10)])


def segment(batch) -> str:
    """The shared-memory segment a received batch lives in."""
    return batch["video"].untyped_storage()._share_filename_cpu_()[1].decode()


def run(manifest, epochs, keep):
    """Every batch of `epochs` epochs: (segment, a copy at receipt, what `keep` holds of it)."""
    # prefetch_bytes 1: 2 batches queued a worker, so each keeps 2 + 3 buffers
    options = {"seed": 5, "workers": 2, "epochs": epochs, "prefetch_bytes": 1}
    loader = mmcurate.video_loader(manifest, 2, 8, **options)
    seen = []
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                assert SENT_KEY not in batch
                seen.append((segment(batch), batch["video"].clone(), keep(batch)))
    return seen


def test_let_go_batches_reuse_their_buffers(manifest):
    """At most prefetch + 2 of a worker's buffers are in use when it needs one (queued, and
    the two the loop and the loader hold): with 5 kept, every worker reuses one of its 5."""
    seen = run(manifest, 6, keep=lambda batch: None)
    assert len(seen) == 30 and len({name for name, _, _ in seen}) <= 2 * 5


def test_a_held_batch_is_never_written_again(manifest):
    """Held whole: every batch keeps its own segment and, at the end, its first contents."""
    seen = run(manifest, 4, keep=lambda batch: batch["video"])
    assert len({name for name, _, _ in seen}) == len(seen)
    for _, first, held in seen:
        assert torch.equal(held, first)
    # the check can fail: the batches differ
    assert any(not torch.equal(seen[0][1], first) for _, first, _ in seen)


def test_a_held_view_keeps_its_batch(manifest):
    seen = run(manifest, 3, keep=lambda batch: batch["video"][0, 2:5])
    for _, first, held in seen:
        assert torch.equal(held, first[0, 2:5])


def hand_over(batches, answers):
    """A worker's side, in a child process: the buffer of a batch it sent is offered again
    only once the parent has let go of that batch."""
    buffers = BatchBuffers(4)
    first = buffers.take((2, 3))
    first.tensor.fill_(7)
    batches.put({"video": first.tensor, SENT_KEY: Sent(first)})
    answers.get()  # the parent holds the batch (until it has this answer)
    batches.put(buffers.take((2, 3)) is first)
    answers.get()  # the parent let go
    batches.put((buffers.reuse, buffers.take((2, 3)) is first))


def test_a_buffer_comes_back_only_after_the_other_process_lets_go():
    torch.multiprocessing.set_sharing_strategy("file_system")
    context = torch.multiprocessing.get_context("fork")
    batches, answers = context.Queue(), context.Queue()
    child = context.Process(target=hand_over, args=(batches, answers))
    child.start()
    try:
        batch = batches.get(timeout=60)
        assert batch[SENT_KEY] == ()  # the marker arrives as nothing
        answers.put("holding")
        reused_while_held = batches.get(timeout=60)
        assert int(batch["video"].sum()) == 7 * 6
        del batch
        answers.put("let go")
        reuse, reused_after = batches.get(timeout=60)
    finally:
        child.join(60)
    assert reuse and not reused_while_held and reused_after


def test_a_buffer_is_free_once_pickled_and_only_this_process_holds_it():
    torch.multiprocessing.set_sharing_strategy("file_system")
    buffers = BatchBuffers(2)
    buffer = buffers.take((4,))
    assert not buffer.free()  # not sent yet: waiting in a queue's buffer, say
    payload = ForkingPickler.dumps({"video": buffer.tensor, SENT_KEY: Sent(buffer)})
    assert buffer.sent and holders(buffer.tensor) == 2  # in transit
    pickle.loads(payload)  # received (here: this process)
    assert buffers.take((4,)) is buffer
    assert buffers.take((5,)) is not buffer


def test_with_another_sharing_strategy_every_batch_gets_a_fresh_buffer():
    before = torch.multiprocessing.get_sharing_strategy()
    strategies = torch.multiprocessing.get_all_sharing_strategies()
    assert "file_descriptor" in strategies
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    try:
        buffers = BatchBuffers(3)
        first = buffers.take((4,))
        BatchBuffers.unused(first)
        assert not buffers.reuse and buffers.take((4,)) is not first
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


def test_buffers_kept_stay_within_most():
    torch.multiprocessing.set_sharing_strategy("file_system")
    buffers = BatchBuffers(3)
    for size in range(1, 8):
        buffers.take((size,))
    assert len(buffers.held) == 3
