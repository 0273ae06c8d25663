"""The streaming loader's epoch plan: equal ranks on uneven shards, exact mid-epoch resume
(pure plan, real DataLoader workers, and torchrun DDP on CPU with gloo)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import Batch, ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.data.plan import (
    Layout,
    WeightedManifest,
    batches_per_rank,
    consumed_per_worker,
    epoch_pieces,
    worker_batches,
    worker_plan,
)
from mmcurate.trainer.models import build_model
from PIL import Image

from tests.kit_shards import UNEVEN, write_uneven_shards
from tests.kit_trainer import logged_steps, printed_summaries, run_torchrun


@pytest.fixture(scope="module")
def uneven_manifest(tmp_path_factory) -> Path:
    return write_uneven_shards(tmp_path_factory.mktemp("uneven"))


def round_robin(per_worker: list[list[list[int]]]) -> list[list[int]]:
    """Batches in the order a DataLoader takes them from workers (exhausted ones skipped)."""
    out, queues = [], [list(batches) for batches in per_worker]
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def pieces_of(sizes, seed: int = 7, epoch: int = 0):
    return epoch_pieces([WeightedManifest(tuple(range(len(sizes))), tuple(sizes))], seed, epoch)


def rank_batches(sizes, rank, world, workers, batch, buffer, consumed=0) -> list[list[int]]:
    per_worker = []
    for w in range(workers):  # a resumed DataLoader's worker w plays worker w + consumed
        layout = Layout(rank, world, (w + consumed) % workers, workers)
        plan = worker_plan(pieces_of(sizes), 7, 0, layout, batch, buffer, consumed)
        emitted = plan.emit
        per_worker.append([emitted[i : i + batch] for i in range(0, len(emitted), batch)])
    return round_robin(per_worker)


def test_consumed_per_worker_matches_round_robin():
    for total in range(0, 23):
        for workers in range(1, 5):
            counts = worker_batches(total, workers)
            assert sum(counts) == total and max(counts) - min(counts) <= 1
            order = round_robin([[w] * c for w, c in enumerate(counts)])
            for k in range(total + 1):
                expected = [order[:k].count(w) for w in range(workers)]
                assert consumed_per_worker(counts, k) == expected


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (3, 2), (2, 3)])
def test_uneven_shards_give_every_rank_equal_batches_and_each_sample_once(world, workers):
    batch, total = 8, sum(UNEVEN)
    ranks = [rank_batches(UNEVEN, r, world, workers, batch, 64) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1  # equal steps: DDP cannot hang
    assert len(ranks[0]) == batches_per_rank(total, world, batch) == total // (world * batch)
    seen = [p for r in ranks for b in r for p in b]
    assert all(len(b) == batch for r in ranks for b in r)
    assert sorted(seen) == list(range(len(ranks[0]) * world * batch))  # once each


def test_resume_after_any_step_continues_the_exact_sequence():
    full = rank_batches(UNEVEN, 1, 2, 3, 8, 50)
    for k in range(len(full) + 1):
        assert rank_batches(UNEVEN, 1, 2, 3, 8, 50, consumed=k) == full[k:]


def test_shuffle_buffer_mixes_within_a_worker_and_changes_per_epoch():
    layout = Layout(0, 1, 0, 1)
    no_shuffle = worker_plan(pieces_of(UNEVEN, 0), 0, 0, layout, 8, 0).emit
    shuffled = worker_plan(pieces_of(UNEVEN, 0), 0, 0, layout, 8, 100).emit
    assert no_shuffle == sorted(no_shuffle) and shuffled != no_shuffle
    assert sorted(shuffled) == no_shuffle
    assert worker_plan(pieces_of(UNEVEN, 0, 1), 0, 1, layout, 8, 100).emit != shuffled


def test_accumulation_rounds_rank_batches_to_whole_steps():
    assert batches_per_rank(1024, 2, 16, multiple=3) == 30  # 32 batches -> 10 steps of 3


@pytest.fixture(scope="module")
def tiny_transform():
    cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
    _, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
    return ImageTransform(preprocess), tokenizer


def loader_keys(manifest: Path, transform, tokenizer, resume: int = 0) -> list[list[str]]:
    dataset = ShardDataset(
        read_manifest(str(manifest)),
        transform,
        tokenizer,
        batch_size=16,
        seed=3,
        shuffle_buffer=200,
    )
    dataset.resume_at(0, resume)
    return [batch.keys for batch in make_loader(dataset, workers=2)]


def test_real_workers_resume_mid_epoch_exactly(uneven_manifest, tiny_transform):
    full = loader_keys(uneven_manifest, *tiny_transform)
    assert len(full) == 64 and len({k for b in full for k in b}) == 1024
    assert loader_keys(uneven_manifest, *tiny_transform, resume=23) == full[23:]


@pytest.mark.parametrize("finish_in_workers", [False, True])
def test_ring_slots_carry_the_same_batches_and_stay_valid_while_held(
    uneven_manifest, tiny_transform, finish_in_workers
):
    """Batches through the reused shared-memory slots equal those passed the ordinary way
    (uint8 and float), and a batch is still intact after `hold - 1` more are drawn."""
    manifest = read_manifest(str(uneven_manifest))

    def batches(hold: int | None) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
        dataset = ShardDataset(
            manifest,
            *tiny_transform,
            batch_size=16,
            seed=1,
            decode_threads=1,  # the same crop for the same sample in both runs
            finish_in_workers=finish_in_workers,
        )
        torch.manual_seed(0)  # the workers' seeds, so both runs draw the same crops
        out, previous = [], None
        for batch in make_loader(dataset, workers=2, hold=hold):
            if previous is not None and hold:  # drawn one batch ago: still its own data
                assert torch.equal(previous[0], out[-1][0]), "a held slot was overwritten"
            previous = batch
            out.append((batch.images.clone(), batch.tokens.clone(), batch.keys))
        return out

    plain, ringed = batches(None), batches(2)
    assert len(plain) == len(ringed) == 64
    for (images, tokens, keys), (r_images, r_tokens, r_keys) in zip(plain, ringed, strict=True):
        assert keys == r_keys and torch.equal(images, r_images) and torch.equal(tokens, r_tokens)
    assert plain[0][0].dtype == (torch.float32 if finish_in_workers else torch.uint8)


def test_a_ring_slot_is_written_again_only_once_given_back():
    import multiprocessing

    from mmcurate.trainer.data.ring import Ring

    free = multiprocessing.get_context("fork").Semaphore(2)
    first = Batch(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4, 77), ["a"] * 4)
    ring = Ring(2, first, free)
    assert ring.store(ring.claim(), first).ring is ring  # the tensors go once
    assert ring.store(ring.claim(), first).ring is None
    assert not free.acquire(block=False)  # both slots held: the worker waits
    free.release()  # the training process gives the oldest back
    assert ring.claim() == 0
    bigger = Batch(torch.zeros(5, 3, 8, 8, dtype=torch.uint8), torch.zeros(5, 77), ["b"] * 5)
    assert ring.store(0, bigger) is None  # another shape goes whole; the slot is free again
    assert ring.claim() == 0


def broken_tokenizer(texts: list[str]) -> torch.Tensor:
    raise RuntimeError("the tokenizer broke")


def test_a_failing_loader_worker_fails_the_training_loop(tmp_path, tiny_transform):
    """A worker's exception (here: a bug, not bad data) reaches the training process with
    its traceback."""
    manifest_path = write_uneven_shards(tmp_path, sizes=(32,))
    dataset = ShardDataset(
        read_manifest(str(manifest_path)), tiny_transform[0], broken_tokenizer, batch_size=16
    )
    with pytest.raises(RuntimeError, match="(?s)loader worker 0 failed.*the tokenizer broke"):
        list(make_loader(dataset, workers=2, hold=1))


def test_an_endless_stream_without_a_full_batch_is_refused(tmp_path, tiny_transform):
    manifest_path = write_uneven_shards(tmp_path, sizes=(10,))
    dataset = ShardDataset(read_manifest(str(manifest_path)), *tiny_transform, batch_size=16)
    with pytest.raises(
        ValueError, match=r"no full step \(1 batches of 16\) in an epoch of 10 samples"
    ):
        dataset.set_epoch(0, epochs=None)
    dataset.set_epoch(0, epochs=1)  # one epoch of nothing ends at once
    assert list(dataset) == []


def test_transform_split_matches_open_clip_preprocess(tiny_transform):
    """Bytes -> uint8 in the workers, finish() on the device: open_clip's transform on the
    same crop box, resized by torch's uint8 kernels instead of PIL's."""
    from mmcurate.trainer.data.transform import crop_box
    from skimage import data as skdata
    from torchvision.transforms import Compose
    from torchvision.transforms.functional import resized_crop

    transform, _ = tiny_transform
    crop, *rest = transform.full.transforms
    buf = io.BytesIO()
    Image.fromarray(skdata.astronaut()).resize((300, 260)).save(buf, "JPEG", quality=90)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    for seed in range(5):
        torch.manual_seed(seed)
        ours = transform.finish(transform(buf.getvalue()).unsqueeze(0))[0]
        torch.manual_seed(seed)  # the box the worker drew
        box = crop_box(image.height, image.width, crop.scale, crop.ratio)
        cropped = resized_crop(image, *box, crop.size, crop.interpolation, antialias=True)
        theirs = Compose(rest)(cropped)
        assert ours.dtype == torch.float32 and ours.shape == theirs.shape
        levels = ((ours - theirs) * transform.std * 255).abs()  # in 8-bit steps
        assert levels.mean() < 1.0 and levels.max() < 40, (levels.mean(), levels.max())


@pytest.mark.parametrize("height,width", [(256, 309), (260, 300), (256, 384), (900, 200)])
def test_crop_boxes_are_drawn_as_torchvision_random_resized_crop_draws_them(height, width):
    """crop_box (one draw from torch's generator per image instead of up to 42) follows
    RandomResizedCrop.get_params: the same box statistics over 2,000 draws, the same central
    crop where every try misses (3:2 and tall images at open_clip's scale 0.9-1), boxes
    inside the image, the same boxes again from the same seed."""
    from mmcurate.trainer.data.transform import crop_box
    from torchvision.transforms import RandomResizedCrop

    scale, ratio = (0.9, 1.0), (3 / 4, 4 / 3)
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    torch.manual_seed(0)
    boxes = [RandomResizedCrop.get_params(image, scale, ratio) for _ in range(2000)]
    theirs = torch.tensor(boxes, dtype=torch.float64)
    ours = torch.tensor([crop_box(height, width, scale, ratio) for _ in range(2000)]).double()
    assert (ours >= 0).all() and (ours[:, 2:] > 0).all()
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()
    assert torch.allclose(ours.mean(0), theirs.mean(0), atol=1.0), (ours.mean(0), theirs.mean(0))
    assert torch.allclose(ours.std(0), theirs.std(0), atol=1.0), (ours.std(0), theirs.std(0))
    torch.manual_seed(1)
    first = [crop_box(height, width, scale, ratio) for _ in range(5)]
    torch.manual_seed(1)
    assert [crop_box(height, width, scale, ratio) for _ in range(5)] == first


def test_images_written_into_their_rows_equal_the_stacked_batch(tiny_transform):
    """What the decode threads do with a ring slot (each image into its row, normalized there
    for CPU training) gives the very batch stacking and finishing the whole batch gives;
    an image that does not fit its row is left as it is."""
    transform, _ = tiny_transform
    images = [torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8) for _ in range(4)]
    stacked = torch.stack(images)
    for finish, dtype in ((True, torch.float32), (False, torch.uint8)):
        slot = torch.empty((4, 3, 64, 64), dtype=dtype)
        rows = list(slot)
        assert all(transform.place(i, r, finish) is r for i, r in zip(images, rows, strict=True))
        assert torch.equal(slot, transform.finish(stacked) if finish else stacked)
        assert transform.place(rows[0], rows[0], finish) is rows[0]  # already there
    small = torch.zeros((3, 8, 8), dtype=torch.uint8)
    assert transform.place(small, torch.empty((3, 64, 64)), True) is small


@pytest.mark.parametrize("world", [1, 2])
def test_torchrun_stop_and_resume_sees_one_epoch_exactly(uneven_manifest, tmp_path, world):
    output = tmp_path / "run"
    config = tmp_path / "train.yaml"
    tree = {
        "data": {"manifest": str(uneven_manifest), "batch_size": 16, "workers": 2, "seed": 5},
        "run": {"output": str(output), "log_every": 5, "sample_log": True, "epochs": 1},
    }
    config.write_text(yaml.safe_dump(tree))
    stop_at = 11  # mid-epoch, and not a multiple of the two workers
    first = run_torchrun(config, world, f"run.max_steps={stop_at}")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_torchrun(config, world, "run.resume=true")
    assert second.returncode == 0, second.stderr[-3000:]
    ranks = logged_steps(output)
    assert sorted(ranks) == list(range(world))
    steps_per_rank = 1024 // (16 * world)
    keys = []
    for rows in ranks.values():
        assert [r["step"] for r in rows] == list(range(1, steps_per_rank + 1))  # equal steps
        keys += [key for r in rows for key in r["keys"]]
    assert len(keys) == 1024 and len(set(keys)) == 1024  # no repeats, no losses
    summaries = printed_summaries(second.stdout)
    assert len(summaries) == world and {s["steps"] for s in summaries} == {steps_per_rank}
    assert {s["world"] for s in summaries} == {world}


def test_ray_train_launch_runs_two_ranks(uneven_manifest, tmp_path, ray_session):
    from mmcurate.trainer.launch import launch_ray

    cfg = TrainConfig.model_validate(
        {
            "data": {"manifest": str(uneven_manifest), "batch_size": 32, "workers": 1},
            "run": {"output": str(tmp_path / "run"), "max_steps": 4, "sample_log": True},
            "launch": {"mode": "ray", "workers": 2, "cpus_per_worker": 1},
        }
    )
    summary = launch_ray(cfg)
    assert summary["world"] == 2 and summary["steps"] == 4 and summary["samples"] == 4 * 64
    ranks = logged_steps(tmp_path / "run")
    keys = [k for rows in ranks.values() for row in rows for k in row["keys"]]
    assert sorted(ranks) == [0, 1] and len(set(keys)) == len(keys) == 4 * 64
    assert (tmp_path / "run" / "checkpoints" / "step-4.pt").is_file()


def tiny_learner(loss: str = "clip"):
    from mmcurate.trainer.dist.world import Dist
    from mmcurate.trainer.step import build_learner

    cfg = TrainConfig.model_validate(
        {"data": {"manifest": "x"}, "model": {"loss": loss}, "run": {"output": "x"}}
    )
    torch.manual_seed(0)
    learner, (preprocess, tokenizer) = build_learner(cfg, Dist(), total_steps=10)
    return learner, ImageTransform(preprocess), tokenizer


def random_batch(tokenizer, n: int, seed: int):
    from mmcurate.trainer.data.dataset import Batch

    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 64, 64, generator=gen)
    words = ["red", "green", "blue", "cat", "dog", "tree", "car", "sky"]
    texts = [f"a {words[i % 8]} {words[(i * 3 + seed) % 8]}" for i in range(n)]
    return Batch(images, tokenizer(texts), [str(i) for i in range(n)])


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_accumulated_gradients_equal_one_big_batch(loss):
    from mmcurate.trainer.data.dataset import Batch
    from mmcurate.trainer.step import accumulated_backward, clip_features, contrastive_loss

    learner, _, tokenizer = tiny_learner(loss)
    small = [random_batch(tokenizer, 8, seed) for seed in (1, 2, 3)]
    big = Batch(torch.cat([b.images for b in small]), torch.cat([b.tokens for b in small]), [])
    learner.model.zero_grad()
    contrastive_loss(learner, clip_features(learner.model, big.images, big.tokens)).backward()
    expected = {n: p.grad.clone() for n, p in learner.model.named_parameters()}
    learner.model.zero_grad()
    accumulated_backward(learner, small)
    for name, param in learner.model.named_parameters():
        assert torch.allclose(param.grad, expected[name], atol=1e-5, rtol=1e-3), name
    if loss == "siglip":
        assert "logit_bias" in dict(learner.model.named_parameters())


def test_siglip_and_accumulation_train_through_the_loader(uneven_manifest, tmp_path):
    from mmcurate.trainer.train import train

    tree = {
        "data": {"manifest": str(uneven_manifest), "batch_size": 16, "workers": 1},
        "model": {"loss": "siglip"},
        "optim": {"accum_freq": 3},
        "run": {"output": str(tmp_path), "epochs": 1, "log_every": 100},
    }
    summary = train(TrainConfig.model_validate(tree))
    # 64 batches of 16 -> 21 steps of 3 batches (the last batch of the epoch is not read)
    assert summary["steps"] == 21 and summary["samples"] == 21 * 48
    assert summary["last_loss"] < summary["first_loss"]


def test_device_decode_gives_the_same_batches(uneven_manifest, tiny_transform):
    """data.gpu_decode: workers pass JPEG bytes and the training device decodes and crops
    them (here the CPU, through the same code path nvJPEG takes on CUDA)."""
    from mmcurate.trainer.data.prefetch import DevicePrefetcher

    transform, tokenizer = tiny_transform
    manifest = read_manifest(str(uneven_manifest))
    batches = []
    for device_decode in (False, True):
        dataset = ShardDataset(
            manifest, transform, tokenizer, batch_size=16, device_decode=device_decode
        )
        loader = make_loader(dataset, workers=1)
        batches.append(list(DevicePrefetcher(loader, torch.device("cpu"), transform))[:6])
    for cpu, device in zip(*batches, strict=True):
        assert cpu.keys == device.keys and device.images.shape == (16, 3, 64, 64)
        # solid-colour squares: any crop gives the same pixels, so the two paths agree
        assert torch.allclose(cpu.images, device.images, atol=0.05)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_iteration_runs_epochs_back_to_back_in_order(uneven_manifest, tiny_transform, workers):
    """The workers go on to the next epoch themselves: one iteration over three epochs (and
    one resumed a batch before an epoch's end) yields exactly the epochs' batches in order,
    through the reused shared-memory slots."""
    manifest = read_manifest(str(uneven_manifest))
    dataset = ShardDataset(manifest, *tiny_transform, batch_size=64, seed=2)
    loader = make_loader(dataset, workers, hold=1)
    expected = []
    for epoch in (0, 1, 2, 3):
        dataset.set_epoch(epoch)
        expected.append([b.keys for b in loader])
    dataset.set_epoch(0, epochs=3)
    assert [b.keys for b in loader] == expected[0] + expected[1] + expected[2]
    dataset.set_epoch(0, epochs=2)
    dataset.resume_at(0, 15)
    assert [b.keys for b in loader] == expected[0][15:] + expected[1]
    dataset.set_epoch(1, epochs=None)  # endless, as the trainer runs with run.max_steps
    endless = iter(loader)
    taken = [next(endless).keys for _ in range(40)]
    endless.close()
    assert taken == expected[1] + expected[2] + expected[3][:8]


def test_torchrun_accumulation_and_siglip_on_two_ranks(uneven_manifest, tmp_path):
    """DDP with accum_freq 2: the temperature gets its gradient in the last, synced pass."""
    config = tmp_path / "train.yaml"
    tree = {
        "data": {"manifest": str(uneven_manifest), "batch_size": 16, "workers": 1},
        "model": {"loss": "siglip"},
        "optim": {"accum_freq": 2},
        "run": {"output": str(tmp_path / "run"), "max_steps": 3, "log_every": 1},
    }
    config.write_text(yaml.safe_dump(tree))
    result = run_torchrun(config, 2)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = printed_summaries(result.stdout)
    assert len(summaries) == 2 and {s["steps"] for s in summaries} == {3}
    assert {s["world"] for s in summaries} == {2}
    assert {s["samples"] for s in summaries} == {3 * 2 * 16 * 2}


def test_a_short_shard_and_an_undecodable_jpeg_are_replaced(tmp_path, tiny_transform):
    """A shard holding fewer samples than the manifest says, and a JPEG that only its header
    makes look valid: batches stay full and every step still comes."""
    from mmcurate.trainer.data.prefetch import DevicePrefetcher

    manifest_path = write_uneven_shards(tmp_path, sizes=(40, 24))
    doc = json.loads(manifest_path.read_text())
    doc["shards"][1]["samples"] = 40  # the shard holds 24: 16 are missing
    doc["samples"] = 80
    manifest_path.write_text(json.dumps(doc))
    transform, tokenizer = tiny_transform
    dataset = ShardDataset(
        read_manifest(str(manifest_path)), transform, tokenizer, batch_size=16, device_decode=True
    )
    batches = list(DevicePrefetcher(make_loader(dataset, 0), torch.device("cpu"), transform))
    assert len(batches) == 5 and all(b.images.shape == (16, 3, 64, 64) for b in batches)
    assert dataset.counters.substituted == 16
    jpeg = io.BytesIO()
    Image.new("RGB", (72, 72), "red").save(jpeg, "JPEG")
    truncated = jpeg.getvalue()[: len(jpeg.getvalue()) // 3]
    good = torch.frombuffer(bytearray(jpeg.getvalue()), dtype=torch.uint8)
    bad = torch.frombuffer(bytearray(truncated), dtype=torch.uint8)
    images = transform.decode_on([good, bad, good], torch.device("cpu"))
    assert images.shape == (3, 3, 64, 64)


def test_mixing_weights_set_each_source_share_of_an_epoch():
    """Weight 0.5 takes a different half of a source each epoch (one shard cut), weight 2
    every sample twice; the sources' pieces are shuffled together."""
    small = WeightedManifest((0, 1, 2), (10, 10, 10), weight=2.0)
    big = WeightedManifest((3, 4, 5, 6), (25, 25, 25, 25), weight=0.5)
    epochs = [epoch_pieces([small, big], seed=1, epoch=e) for e in range(3)]
    for pieces in epochs:
        per_shard = {}
        for piece in pieces:
            per_shard[piece.shard] = per_shard.get(piece.shard, 0) + piece.size
        assert sum(per_shard.get(s, 0) for s in (0, 1, 2)) == 60  # 2 x 30
        assert {per_shard[s] for s in (0, 1, 2)} == {20}
        assert sum(per_shard.get(s, 0) for s in (3, 4, 5, 6)) == 50  # 0.5 x 100
    halves = [frozenset((p.shard, p.stop) for p in pieces if p.shard >= 3) for pieces in epochs]
    assert len(set(halves)) > 1  # a different half in different epochs
    assert [p.shard for p in epochs[0]] != sorted(p.shard for p in epochs[0])  # mixed


def test_training_mixes_two_manifests_by_weight(uneven_manifest, tmp_path):
    from mmcurate.trainer.train import train

    (tmp_path / "other").mkdir()
    other = write_uneven_shards(tmp_path / "other", sizes=(64,), prefix="m")
    tree = {
        "data": {
            "manifest": str(uneven_manifest),
            "weight": 0.25,
            "mix": [{"manifest": str(other), "weight": 2}],
            "batch_size": 16,
            "workers": 1,
        },
        "run": {"output": str(tmp_path / "run"), "epochs": 1, "sample_log": True},
    }
    summary = train(TrainConfig.model_validate(tree))
    assert summary["samples"] == 256 + 128 and summary["steps"] == 24  # 0.25 x 1024 + 2 x 64
    log = (tmp_path / "run" / "samples" / "rank-0.jsonl").read_text().splitlines()
    keys = [k for row in map(json.loads, log) for k in row["keys"]]
    mixed = [k for k in keys if k.startswith("m")]
    assert len(mixed) == 128 and all(mixed.count(k) == 2 for k in set(mixed))  # each twice
    assert len({k for k in keys if k.startswith("k")}) == 256  # a quarter, each once


ORPHANING_TRAINER = """
import os, sys
import multiprocessing
from pathlib import Path
from tests.kit_shards import write_uneven_shards
from mmcurate.trainer.config import TrainConfig
from mmcurate.trainer.data.dataset import ImageTransform, ShardDataset, make_loader
from mmcurate.trainer.data.manifest import read_manifest
from mmcurate.trainer.models import build_model
import torch

cfg = TrainConfig.model_validate({"data": {"manifest": "x"}, "run": {"output": "x"}})
_, preprocess, tokenizer = build_model(cfg.model, torch.device("cpu"))
manifest = write_uneven_shards(Path(sys.argv[1]), sizes=(40, 40))
dataset = ShardDataset(read_manifest(str(manifest)), ImageTransform(preprocess), tokenizer,
                       batch_size=4)
dataset.set_epoch(0, epochs=None)  # endless: the workers never run out on their own
batches = iter(make_loader(dataset, workers=2, hold=1))
next(batches)
pids = " ".join(str(p.pid) for p in multiprocessing.active_children())
Path(sys.argv[1], "pids").write_text(pids)
os._exit(0)  # as a killed trainer: no exit handler stops the daemon workers
"""


def test_loader_workers_exit_when_the_training_process_is_gone(tmp_path):
    out = tmp_path / "trainer.log"  # a file, not a pipe: orphans would hold a pipe open
    with out.open("w") as log:
        code = subprocess.call(
            [sys.executable, "-c", ORPHANING_TRAINER, str(tmp_path)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    assert code == 0, out.read_text()[-2000:]
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 2  # the two loader workers, nothing else
    deadline = time.monotonic() + 120  # a bound, not a timing claim: they check every 5 s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
