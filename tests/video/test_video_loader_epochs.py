"""mmcurate.video_loader's workers live across epochs (trainer/data/video_epochs.py): the same
worker processes serve every epoch, the batches, windows and schedule phases are those a fresh
loader gives at each place, and a resume or a `break` still continues exactly."""

from multiprocessing import active_children

import pytest

import mmcurate
from tests.kit_video import clip_build

T = 4  # the window
# 16 frames first (every clip has them), the schedule's size and 4 frames from step 5 on:
# mid-epoch 1 (4 batches an epoch), so a worker running on into epoch 1 must know its step.
SCHEDULE = [{"step": 0, "frames": 6}, {"step": 5, "size": "32x24", "frames": T}]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """8 clips of 10-17 frames, half 64x48 and half 48x64, in shards of 3 samples."""
    root = tmp_path_factory.mktemp("video_epochs")
    clips = [(10 + i, (64, 48) if i % 2 else (48, 64)) for i in range(8)]
    return clip_build(root, clips, shard_max_samples=3, files_per_task=3)


def loader_of(manifest, workers, schedule=SCHEDULE):
    return mmcurate.video_loader(manifest, 2, 6, seed=3, workers=workers, schedule=schedule)


def seen(loader, batch):
    """What a batch is: its step, bucket, shape, keys and window starts."""
    return (loader.step - 1, batch["bucket"], tuple(batch["video"].shape)) + (
        tuple(batch["__key__"]),
        tuple(batch["frame_start"]),
    )


def fresh_epoch(manifest, epoch, step):
    """Epoch `epoch` from a new loader (new workers) placed at its start (global step `step`)."""
    loader = loader_of(manifest, 2)
    loader.load_state_dict({**loader.state_dict(), "epoch": epoch, "consumed": 0, "step": step})
    with loader:
        return [seen(loader, batch) for batch in loader]


def test_the_same_workers_serve_every_epoch_with_the_batches_a_fresh_loader_gives(manifest):
    loader = loader_of(manifest, 2)
    before = {p.pid for p in active_children()}
    workers, epochs = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        epochs.append([seen(loader, batch) for batch in loader])
        workers.append({p.pid for p in active_children()} - before)
    assert len(workers[0]) == 2 and workers[0] == workers[1] == workers[2]
    step = 0
    for epoch, batches in enumerate(epochs):
        assert batches == fresh_epoch(manifest, epoch, step) and len(batches) == 4
        step += len(batches)
    assert {b[2][1] for b in epochs[0]} == {6} and {b[2][1] for b in epochs[2]} == {T}
    loader.close()
    assert not {p.pid for p in active_children()} - before  # close() stops them


@pytest.mark.parametrize("stop", [2, 5])  # mid-epoch 0; mid-epoch 1, after the switch
def test_a_break_or_a_resume_continues_exactly_with_persistent_workers(manifest, stop):
    whole = loader_of(manifest, 2)
    uninterrupted = []
    for epoch in range(2):
        whole.set_epoch(epoch)
        uninterrupted += [seen(whole, batch) for batch in whole]
    whole.close()
    stopped = loader_of(manifest, 2)
    head, pids = [], set()
    for epoch in range(2):
        stopped.set_epoch(epoch)
        for batch in stopped:
            head.append(seen(stopped, batch))
            pids = {p.pid for p in active_children()}
            if len(head) == stop:
                break
        if len(head) == stop:
            break
    state = stopped.state_dict()
    # Iterating again after the break: the rest of that epoch, from the same workers.
    rest = [seen(stopped, batch) for batch in stopped]
    assert pids and pids <= {p.pid for p in active_children()}
    stopped.close()
    resumed = loader_of(manifest, 2)
    resumed.load_state_dict(state)
    again = []
    for epoch in range(resumed.epoch, 2):
        if epoch != resumed.epoch:
            resumed.set_epoch(epoch)
        again += [seen(resumed, batch) for batch in resumed]
    resumed.close()
    assert head + again == uninterrupted
    assert head + rest == uninterrupted[: len(head) + len(rest)]
    assert len(head) + len(rest) in (4, 8)  # the epoch it stopped in, to its end


def test_told_its_epochs_the_loader_still_serves_an_epoch_past_them(manifest):
    told = mmcurate.video_loader(manifest, 2, 6, seed=3, workers=2, epochs=1)
    plain = loader_of(manifest, 2, schedule=None)
    runs = []
    for loader in (told, plain):
        with loader:
            run = []
            for epoch in range(2):  # epoch 1 is past the `epochs` told: new workers serve it
                loader.set_epoch(epoch)
                run.append([seen(loader, batch) for batch in loader])
            runs.append(run)
    assert runs[0] == runs[1] and len(runs[0][1]) == 4
