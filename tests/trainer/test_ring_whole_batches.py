"""trainer/data/ring.py: a batch a loader worker sends whole (one that does not fit its ring)
still opens in the training process when that worker has finished long before the training
process reads it. Its shared memory is unlinked when the process that made it and every
process that opened it are gone, so a worker waits for the loader's end before it exits."""

import time

import torch
from mmcurate.trainer.data.batch import Batch
from mmcurate.trainer.data.ring import RingLoader


class OneWholeBatch:
    """Each worker sends one batch outside any ring (no ring is set up) and ends."""

    def start_worker(self, worker, workers, slots, free):
        self.worker = worker

    def __iter__(self):
        images = torch.full((2, 3, 4, 4), self.worker, dtype=torch.uint8)
        yield Batch(images, torch.zeros((2, 5), dtype=torch.long), [f"w{self.worker}"])


def test_a_whole_batch_from_a_finished_worker_still_opens():
    torch.multiprocessing.set_sharing_strategy("file_system")
    batches = iter(RingLoader(OneWholeBatch(), workers=2, hold=1, depth=1))
    first = next(batches)
    # Worker 1 has sent its batch and finished by now; before the fix it had also exited,
    # and with it the only process holding that batch's shared memory.
    time.sleep(2)
    second = next(batches)
    assert (first.keys, second.keys) == (["w0"], ["w1"])
    assert int(second.images.float().mean()) == 1
    assert list(batches) == []
