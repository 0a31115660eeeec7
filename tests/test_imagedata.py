"""The user's image data sets (issue 19), on data the tests write in the real layouts (JPEG class
folders, WebDataset tar shards) with trainscale.data.export_data: the pre-flight config check, the
two formats decoding alike, the rank × loader-process split, named errors for bad files, the
data-wait measurement and its metrics fields, and the export target."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from trainscale.data import export_data, imagecheck, imagesets
from trainscale.data.imagesets import RankRead
from trainscale.measure import datawait, metrics
from trainscale.plan import matrix

from conftest import ROOT, run_env, snakemake, validated

N, SHARD, CLASSES, SIDE = 48, 6, 3, 24
#: Solid images whose grey level encodes their index (STEP apart: far beyond JPEG's error).
STEP = 5


@pytest.fixture(autouse=True)
def no_hang():
    """A loader that hangs fails the test instead of the suite."""

    def stop(*_):
        raise TimeoutError("the loader hung")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def indexed_images(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    x = np.repeat((np.arange(n, dtype=np.uint8) * STEP)[:, None, None, None], 3, axis=1)
    x = np.broadcast_to(x, (n, 3, SIDE, SIDE)).copy()
    return x, np.arange(n) % CLASSES


def patterned_images(n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Smooth colour patterns (JPEG keeps them close), one class each."""
    yy, xx = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    x = np.stack(
        [np.stack([yy * 200 + i * 3, xx * 180 + 20, (yy + xx) * 100 + i * 5]) for i in range(n)]
    )
    return x.clip(0, 255).astype(np.uint8), np.arange(n) % CLASSES


def write_both(root: Path, images, labels, shard=SHARD) -> dict[str, imagesets.ImageSource]:
    """Train and test splits in both layouts; the two ImageSources reading them."""
    places = {}
    for split in ("train", "test"):
        places[split] = export_data.write_split(images, labels, 255.0, split, root, shard, CLASSES)
    folders = imagesets.ImageSource(
        "imagefolder", str(places["train"][0]), str(places["test"][0]), CLASSES
    )
    shards = imagesets.ImageSource("webdataset", places["train"][1], places["test"][1], CLASSES)
    return {"imagefolder": folders, "webdataset": shards}


def indices(x, source: imagesets.ImageSource) -> list[int]:
    """The image indices of a normalised batch (its grey level / STEP)."""
    mean = np.asarray(source.mean)[None, :, None, None]
    std = np.asarray(source.std)[None, :, None, None]
    pixels = (x.numpy() * std + mean) * 255.0
    return [int(round(v / STEP)) for v in pixels.mean(axis=(1, 2, 3))]


def test_the_two_formats_decode_to_the_same_images_within_jpeg_tolerance(tmp_path):
    from trainscale.data import imagedecode
    from trainscale.data.imagedata import FolderImages

    images, labels = patterned_images()
    sources = write_both(tmp_path, images, labels)
    folder = FolderImages(sources["imagefolder"].train, (SIDE, SIDE))
    by_index = {int(Path(f).stem): i for i, f in enumerate(folder.files)}
    shards = imagedecode.existing_shards(sources["webdataset"].train)
    streamed = list(imagedecode.shard_samples(shards, (SIDE, SIDE), CLASSES))
    assert len(streamed) == len(folder) == len(images)
    for i, (image, label) in enumerate(streamed):  # unshuffled: file order = index order
        from_folder, folder_label = folder[by_index[i]]
        assert label == folder_label == labels[i]
        np.testing.assert_array_equal(image, from_folder)  # the same JPEG bytes
        original = images[i].transpose(1, 2, 0).astype(float)
        assert np.abs(image - original).mean() < 4.0  # JPEG quality 95
    # resized then centre-cropped alike (non-square target from square images)
    a = imagedecode.decode_file(folder.files[0], (16, 12))
    b = next(iter(imagedecode.shard_samples(shards, (16, 12), CLASSES)))[0]
    assert a.shape == b.shape == (16, 12, 3)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", ["imagefolder", "webdataset"])
def test_two_ranks_with_loader_processes_see_every_sample_exactly_once(tmp_path, fmt):
    from trainscale.data.imagedata import train_loader

    source = write_both(tmp_path, *indexed_images())[fmt]
    batch = 4
    for epoch in (1, 2):  # the second epoch restarts the persistent loader processes
        seen, steps = [], set()
        for rank in (0, 1):
            loader = train_loader(
                RankRead(source, (SIDE, SIDE), batch, rank, 2, loader_workers=2), seed=3
            )
            got = [indices(x, source) for x, _ in loader.epoch(epoch)]
            assert len(got) == loader.steps
            steps.add(loader.steps)
            seen += [i for b in got for i in b]
        assert steps == {N // 2 // batch}  # every rank the same number of full batches
        assert sorted(seen) == list(range(N)), (fmt, epoch)


@pytest.mark.parametrize("fmt", ["imagefolder", "webdataset"])
def test_evaluation_splits_the_test_set_over_ranks_without_repeats(tmp_path, fmt):
    from trainscale.data.imagedata import eval_loader

    source = write_both(tmp_path, *indexed_images())[fmt]
    seen = []
    for rank in (0, 1):
        loader = eval_loader(RankRead(source, (SIDE, SIDE), 5, rank, 2, loader_workers=1))
        for x, y in loader.epoch(1):
            seen += indices(x, source)
            assert y.dtype.is_floating_point is False
    assert sorted(seen) == list(range(N))


def test_a_corrupt_jpeg_is_named_and_nothing_hangs(tmp_path):
    from trainscale.data.imagedata import train_loader

    source = write_both(tmp_path, *indexed_images())["imagefolder"]
    bad = sorted(Path(source.train).rglob("*.jpg"))[7]
    bad.write_bytes(bad.read_bytes()[:40] + b"\x00garbage" * 10)
    loader = train_loader(RankRead(source, (SIDE, SIDE), 4, 0, 1, loader_workers=2))
    with pytest.raises(imagesets.ImageDataError, match=str(bad.name)):
        for _ in loader.epoch(1):
            pass


def test_a_missing_shard_is_named_before_and_while_reading(tmp_path):
    from trainscale.data.imagedata import train_loader

    source = write_both(tmp_path, *indexed_images())["webdataset"]
    shard = Path(tmp_path / "webdataset" / "train-000003.tar")
    raw = shard.read_bytes()
    shard.unlink()
    with pytest.raises(imagesets.ImageDataError, match="train-000003.tar does not exist"):
        train_loader(RankRead(source, (SIDE, SIDE), 4, 0, 1, loader_workers=1))
    shard.write_bytes(raw)
    loader = train_loader(RankRead(source, (SIDE, SIDE), 4, 0, 1, loader_workers=1))
    shard.unlink()  # gone after the loader was built: the read names it
    with pytest.raises(Exception, match="train-000003.tar"):
        for _ in loader.epoch(1):
            pass


def test_a_shard_set_too_small_for_the_ranks_is_named(tmp_path):
    from trainscale.data.imagedata import train_loader

    source = write_both(tmp_path, *indexed_images(12), shard=12)["webdataset"]
    with pytest.raises(imagesets.ImageDataError, match="give some rank no full batch"):
        train_loader(RankRead(source, (SIDE, SIDE), 4, 0, 2))


# --- config ------------------------------------------------------------------------------------


def study(datasets: dict, names: list[str], **top) -> dict:
    m = {"strategy": ["torch-ddp"], "model": ["seed-small"], "dataset": names, "workers": [2]}
    return {"study": "u", "matrix": m, "datasets": datasets, **top}


def folder_entry(root: Path) -> dict:
    return {
        "format": "imagefolder",
        "train": str(root / "imagefolder" / "train"),
        "test": str(root / "imagefolder" / "test"),
        "image_size": [32, 32],
    }


def shard_entry(root: Path) -> dict:
    return {
        "format": "webdataset",
        "train": str(root / "webdataset" / "train-{000000..000007}.tar"),
        "test": str(root / "webdataset" / "test-*.tar"),
        "image_size": [32, 32],
        "classes": CLASSES,
    }


def test_user_data_sets_become_run_specs_and_paths_stay_as_they_were(tmp_path):
    write_both(tmp_path, *indexed_images())
    cfg = study(
        {"mine": folder_entry(tmp_path), "shards": shard_entry(tmp_path)},
        ["mine", "shards", "digits"],
        loader_workers=2,
    )
    cfg["matrix"]["batch_size"] = [4]  # 8 shards of 6 images feed 2 ranks × 2 loaders
    assert imagecheck.problems(cfg) == []
    runs, _ = matrix.build_runs(validated(cfg))
    by = {r.dataset: r for r in runs}
    assert by["mine"].image_source.format == "imagefolder"
    assert by["mine"].image_source.classes == CLASSES and by["mine"].image_size == (32, 32)
    assert by["shards"].loader_workers == 2 and by["digits"].loader_workers == 0
    assert by["digits"].image_source is None and by["digits"].image_size is None
    assert by["digits"].path.endswith(
        "dataset~digits/scale~1/batch_size~4/batch_mode~global/"
        "workers~2/nodes~1/precision~fp32/repeat~0"
    )
    for r in runs:
        assert matrix.RunSpec.from_json(r.to_json()) == r
    block = imagesets.data_block(by["shards"].to_dict())
    assert block == {"format": "webdataset", "input_shape": [3, 32, 32], "loader_workers": 2}
    assert imagesets.data_block(by["digits"].to_dict())["input_shape"] == [1, 8, 8]
    assert imagesets.info_of(imagesets.shape_name(by["mine"].to_dict())).shape == (3, 32, 32)


def test_image_size_resizes_a_built_in_data_set():
    cfg = validated(
        {
            "study": "s003",
            "matrix": {"strategy": ["torch"], "model": ["vgg19"], "dataset": ["cifar10"]},
            "datasets": {"cifar10": {"image_size": [224, 224]}},
        }
    )
    (run,), dropped = matrix.build_runs(cfg)
    assert run.image_size == (224, 224) and not dropped
    assert imagesets.data_block(run.to_dict()) == {
        "format": "memory",
        "input_shape": [3, 224, 224],
        "loader_workers": 0,
    }
    import torch

    from trainscale.data.imagedata import resize_batch

    assert resize_batch(torch.zeros(2, 3, 32, 32), run.image_size).shape == (2, 3, 224, 224)


def preflight(tmp_path: Path, entry: dict, names=("mine",)) -> str:
    problems = imagecheck.problems(study({"mine": entry}, list(names)))
    assert problems, entry
    return "\n".join(problems)


def test_preflight_names_the_key_and_the_fix(tmp_path):
    write_both(tmp_path, *indexed_images())
    good = folder_entry(tmp_path)
    text = preflight(tmp_path, {**good, "train": str(tmp_path / "nowhere")})
    assert "datasets.mine.train: folder" in text and "does not exist" in text
    only = tmp_path / "imagefolder" / "test" / "extra"
    only.mkdir()
    assert "extra has no images" in preflight(tmp_path, good)
    first = sorted((tmp_path / "imagefolder" / "test" / "0").glob("*.jpg"))[0]
    (only / "a.jpg").write_bytes(first.read_bytes())
    text = preflight(tmp_path, good)
    assert "datasets.mine.test: its classes differ from train's" in text and "extra" in text
    (only / "a.jpg").unlink()
    only.rmdir()
    assert "datasets.mine.classes: 5" in preflight(tmp_path, {**good, "classes": 5})
    for bad in (tmp_path / "imagefolder" / "train" / "0").glob("*.jpg"):
        bad.write_bytes(b"not a jpeg")
    assert "cannot be decoded as an image" in preflight(tmp_path, good)
    text = preflight(tmp_path, {k: v for k, v in good.items() if k != "image_size"})
    assert "datasets.mine: missing image_size" in text


def test_preflight_of_webdataset_shards(tmp_path):
    write_both(tmp_path, *indexed_images())
    good = shard_entry(tmp_path)
    assert imagecheck.problems(study({"mine": good}, ["mine"])) == []
    text = preflight(tmp_path, {k: v for k, v in good.items() if k != "classes"})
    assert "missing classes" in text and "do not list their classes" in text
    text = preflight(tmp_path, {**good, "train": good["train"].replace("7}", "9}")})
    assert "datasets.mine.train: 2 of 10 shards" in text and "train-000008.tar" in text
    text = preflight(tmp_path, {**good, "classes": 2})
    assert "label b'2', not a class index in 0..1" in text
    text = preflight(tmp_path, {**good, "test": str(tmp_path / "none-*.tar")})
    assert "datasets.mine.test: no shard matches" in text


def test_preflight_of_names_and_built_in_entries():
    text = "\n".join(imagecheck.problems(study({}, ["mnst"])))
    assert "matrix.dataset[0]" in text and "did you mean 'mnist'" in text
    text = "\n".join(
        imagecheck.problems(study({"cifar10": {"format": "imagefolder"}}, ["cifar10"]))
    )
    assert "datasets.cifar10: format cannot be set for the built-in" in text


def test_a_bad_data_set_stops_snakemake_before_any_job(tmp_path):
    cfg = study({"mine": folder_entry(tmp_path / "absent")}, ["mine"])
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = snakemake(tmp_path, "-n", "--configfile", str(path))
    assert p.returncode != 0
    assert "datasets.mine.train: folder" in p.stderr + p.stdout
    assert not (tmp_path / "results").exists()


def test_shards_that_cannot_feed_every_rank_stop_the_study_before_any_job(tmp_path):
    """One train shard, two workers: rank 1 would get no shard. The pre-flight check applies
    the loaders' own test per cell, names the shard count, the cell and the fix; `snakemake -n`
    stops there. Leaving the cell out (a smaller workers list, or matrix.exclude) resolves it."""
    write_both(tmp_path, *indexed_images(12), shard=12)
    entry = {**shard_entry(tmp_path), "train": str(tmp_path / "webdataset" / "train-*.tar")}
    cfg = study({"mine": entry}, ["mine"], loader_workers=1)
    cfg["matrix"]["batch_size"] = [8]
    with pytest.raises(matrix.ConfigError) as e:
        matrix.build_runs(validated(cfg))
    text = str(e.value)
    assert text.startswith("datasets.mine.train: 1 shards give some rank no full batch of 4")
    assert "strategy=torch-ddp, workers=2" in text and "fewer workers or loader_workers" in text
    cfg["matrix"]["workers"] = [1, 2]
    cfg["matrix"]["exclude"] = [{"workers": 2}]
    (run,), _ = matrix.build_runs(validated(cfg))
    assert run.workers == 1
    cfg["matrix"].pop("exclude")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = snakemake(tmp_path, "-n", "--configfile", str(path))
    assert p.returncode != 0 and not (tmp_path / "results").exists()
    assert "1 shards give some rank no full batch" in p.stderr + p.stdout


def test_the_shard_check_counts_samples_only_where_shard_counts_cannot_settle_it(tmp_path):
    write_both(tmp_path, *indexed_images(24), shard=6)  # 4 train shards of 6
    pattern = str(tmp_path / "webdataset" / "train-*.tar")
    assert imagesets.short_of_shards(pattern, 4, 0, 6) is None  # one shard, one batch each
    assert "4 shards" in imagesets.short_of_shards(pattern, 4, 0, 7)  # 6 samples < 7
    assert imagesets.short_of_shards(pattern, 2, 2, 6) is None
    assert "8 readers" in imagesets.short_of_shards(pattern, 8, 0, 1)  # rank 4.. has none
    assert imagesets.short_of_shards(str(tmp_path / "none-*.tar"), 2, 0, 1) is not None


# --- metrics -----------------------------------------------------------------------------------


def test_data_wait_is_the_time_spent_waiting_for_the_next_batch():
    import time

    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    batches = datawait.DataWait(slow())
    steps = 0.0
    started = time.perf_counter()
    for _ in batches:
        t = time.perf_counter()
        time.sleep(0.02)  # the step: not waiting
        steps += time.perf_counter() - t
    whole = time.perf_counter() - started
    assert batches.batches == 3
    # every sleep in the batches counts, and no part of the steps does: bounds that hold
    # however long a loaded machine oversleeps
    assert 0.15 <= batches.seconds <= whole - steps
    fields = datawait.epoch_fields(batches.seconds, [batches.seconds, 0.5])
    assert fields == {"data_wait_seconds": batches.seconds, "data_wait_seconds_max": 0.5}


def test_data_fields_are_in_the_metrics_record(tmp_path):
    write_both(tmp_path, *indexed_images())
    cfg = study({"mine": folder_entry(tmp_path)}, ["mine"], loader_workers=1)
    run = matrix.build_runs(validated(cfg))[0][0]
    spec = run.to_dict()
    epochs = [
        {
            "epoch": e,
            "seconds": 2.0,
            "samples": 48,
            "steps": 6,
            "samples_per_second": 24.0,
            "train_loss": 1.0,
            "step_seconds_p50": 0.3,
            "step_seconds_p95": 0.4,
            **datawait.epoch_fields(w, [w, w * 2]),
        }
        for e, w in ((1, 1.5), (2, 0.1), (3, 0.3))
    ]
    rec = metrics.ok_record(spec, epochs, None)
    rec["data"] = {"train_samples": 48, "test_samples": 48, **imagesets.data_block(spec)}
    rec["model"]["params"] = 1000
    metrics.validate(rec)
    assert rec["data_wait_share"] == pytest.approx((0.2 + 0.6) / 4.0)
    assert "data_wait_share" not in metrics.ok_record(spec, [dict(epochs[0])] * 0, None)
    assert metrics.oversubscribed(2, 1, 4, loader_workers=1) is False
    assert metrics.oversubscribed(2, 1, 4, loader_workers=2) is True


# --- export ------------------------------------------------------------------------------------


def test_export_writes_a_built_in_data_set_in_both_layouts(tmp_path):
    out = tmp_path / "digits"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainscale.data.export_data",
            "digits",
            "unused",
            str(out),
            "--shard-size",
            "40",
            "--limit",
            "100",
        ],
        capture_output=True,
        text=True,
        env=run_env(),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert len(list((out / "imagefolder" / "train").rglob("*.jpg"))) == 100
    assert len(list((out / "webdataset").glob("train-*.tar"))) == 3
    entries = yaml.safe_load((out / "datasets.yaml").read_text())["datasets"]
    assert entries["digits-shards"]["classes"] == 10
    assert imagecheck.problems(study(entries, sorted(entries))) == []
    assert imagesets.count(imagesets.source_of("digits-shards", entries), "train") == 100


# --- tf.data -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["imagefolder", "webdataset"])
def test_tf_data_splits_over_ranks_once_and_decodes_as_pillow_does(tmp_path, fmt):
    pytest.importorskip("tensorflow")
    import torch

    from trainscale.data import imagedata_tf

    source = write_both(tmp_path, *indexed_images())[fmt]
    seen, steps = [], set()
    for rank in (0, 1):
        train, n = imagedata_tf.train_dataset(RankRead(source, (SIDE, SIDE), 4, rank, 2, 2), seed=1)
        steps.add(n)
        for x, _ in train.take(n):
            seen += indices(torch.from_numpy(x.numpy().transpose(0, 3, 1, 2)), source)
    assert steps == {N // 2 // 4} and sorted(seen) == list(range(N))
    images, labels = patterned_images()
    source = write_both(tmp_path / "p", images, labels)[fmt]
    (x, y), *_ = list(
        imagedata_tf.eval_dataset(RankRead(source, (16, 12), 100)).as_numpy_iterator()
    )
    from trainscale.data.imagedata import eval_loader

    (tx, ty), *_ = list(eval_loader(RankRead(source, (16, 12), 100)).epoch(1))
    assert x.shape == (12, 16, 12, 3) and list(y) == list(ty.numpy())
    std = np.asarray(source.std)  # both normalised alike; resamplers differ by a few levels
    diff = np.abs(x - tx.numpy().transpose(0, 2, 3, 1)) * std * 255
    assert diff.mean() < 3.0, diff.mean()


@pytest.mark.alone
def test_loader_processes_hide_the_decode_behind_the_step(tmp_path):
    """What the data-wait metric is for: on decode-heavy images, the steady epoch's wait with
    2 loader processes is well below the wait with none (decode in the step loop)."""
    import time

    from PIL import Image

    from trainscale.data.imagedata import train_loader

    rng = np.random.default_rng(0)
    for i in range(48):
        folder = tmp_path / "train" / str(i % 2)
        folder.mkdir(parents=True, exist_ok=True)
        # noise: slow to decode. 960 × 720: the loader processes' start in the steady epoch (about
        # 0.25 s on 2 loaded cores) stays well under the decode they hide (at 640 × 480 it did not)
        pixels = rng.integers(0, 256, (720, 960, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=95)
    source = imagesets.ImageSource("imagefolder", str(tmp_path / "train"), "", 2)
    waits = {}
    for workers in (0, 2):
        loader = train_loader(RankRead(source, (64, 64), 8, loader_workers=workers))
        for epoch in (1, 2):
            batches = datawait.DataWait(loader.epoch(epoch))
            for _ in batches:
                time.sleep(0.15)  # the training step
        waits[workers] = batches.seconds  # the steady (second) epoch
    assert waits[2] < 0.6 * waits[0], waits


def test_export_data_is_a_snakemake_target(tmp_path):
    (tmp_path / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    p = snakemake(tmp_path, "-n", "export_data", "--quiet", "host", "--config",
                  "export_data={dataset: cifar10}")  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "results/export/cifar10" in p.stdout + p.stderr
