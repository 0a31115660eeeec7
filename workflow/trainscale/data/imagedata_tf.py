"""tf.data input pipeline for the user's image data sets (the Keras loops' counterpart of
trainscale.data.imagedata).

JPEG folders: file names and labels listed once (trainscale.data.imagesets), then tf.data reads,
decodes (`decode_image`, JPEG or PNG), resizes to cover `image_size`, crops the centre and
normalises in a parallel map, batches and prefetches (AUTOTUNE). WebDataset shards: the same
webdataset pipeline as PyTorch's (trainscale.data.imagedecode.shard_samples, split over ranks)
yields the encoded bytes through `from_generator`, and tf.data decodes them in the same parallel
map.

`loader_workers` is the parallel map's width (0: decoded one at a time, on tf.data's own
thread); tf.data runs it on threads of the training process, not in separate processes.

    read = RankRead(source, size, batch, rank, world, workers)
    train, steps = imagedata_tf.train_dataset(read, seed)
    for x, y in DataWait(train.take(steps)): ...
"""

from __future__ import annotations

import tensorflow as tf

from trainscale.data.imagedecode import equal_steps, existing_shards, rank_samples
from trainscale.data.imagesets import ImageDataError, RankRead, folder_classes, folder_files


def _calls(loader_workers: int) -> int | None:
    return loader_workers if loader_workers > 0 else None


class Decode:
    """Encoded image bytes (or, `from_path`, a file name) -> normalised float32 (H, W, 3):
    cover-resize and centre crop, as trainscale.data.imagedecode.decode_image does with Pillow."""

    def __init__(self, size: tuple[int, int], mean, std, from_path: bool = False) -> None:
        self.size, self.from_path = tuple(size), from_path
        self.mean = tf.constant(mean, tf.float32)
        self.std = tf.constant(std, tf.float32)

    def __call__(self, raw: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        height, width = self.size
        if self.from_path:
            raw = tf.io.read_file(raw)
        img = tf.io.decode_image(raw, channels=3, expand_animations=False)
        shape = tf.cast(tf.shape(img)[:2], tf.float32)
        scale = tf.maximum(height / shape[0], width / shape[1])
        cover = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), [height, width])
        img = tf.image.resize(img, cover, method="bilinear", antialias=True)
        top, left = (cover[0] - height) // 2, (cover[1] - width) // 2
        img = tf.image.crop_to_bounding_box(img, top, left, height, width)
        return (img / 255.0 - self.mean) / self.std, tf.cast(label, tf.int64)


def _folder(root: str, classes: list[str], rank: int, world_size: int, equal: bool):
    files, labels = folder_files(root, classes)
    if not files:
        raise ImageDataError(f"{root}: no images in its class folders; add images")
    if equal:  # every rank the same number of samples: the tail is left out
        keep = len(files) // world_size * world_size
        files, labels = files[:keep], labels[:keep]
    ds = tf.data.Dataset.from_tensor_slices((files, labels)).shard(world_size, rank)
    return ds, len(files) // world_size if equal else None


def train_dataset(
    read: RankRead,
    seed: int = 0,
) -> tuple[tf.data.Dataset, int]:
    """(batches of rank `rank`, reshuffled each pass; full batches only; steps per epoch, the
    same on every rank). Iterate `dataset.take(steps)` each epoch."""
    folders = read.source.format == "imagefolder"
    decode = Decode(read.size, read.source.mean, read.source.std, from_path=folders)
    if folders:
        ds, samples = _folder(
            read.source.train, folder_classes(read.source.train), read.rank, read.world_size, True
        )
        ds = ds.shuffle(samples, seed=seed, reshuffle_each_iteration=True)
        steps = samples // read.batch_size
    else:
        shards = existing_shards(read.source.train)
        steps = equal_steps(shards, read.world_size, 0, read.batch_size)
        ds = _shards(read, shards, seed)
    if steps == 0:
        raise ImageDataError(
            f"{read.source.train}: too few samples for one batch of {read.batch_size} on each of "
            f"{read.world_size} ranks; use a smaller batch or fewer workers"
        )
    ds = ds.map(decode, num_parallel_calls=_calls(read.loader_workers))
    return ds.batch(read.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE), steps


def eval_dataset(
    read: RankRead,
) -> tf.data.Dataset:
    """The test split of rank `rank`, in order; every test sample on exactly one rank."""
    folders = read.source.format == "imagefolder"
    decode = Decode(read.size, read.source.mean, read.source.std, from_path=folders)
    if folders:
        classes = folder_classes(read.source.train)
        ds, _ = _folder(read.source.test, classes, read.rank, read.world_size, False)
    else:
        ds = _shards(read, existing_shards(read.source.test), None)
    ds = ds.map(decode, num_parallel_calls=_calls(read.loader_workers))
    return ds.batch(read.batch_size).prefetch(tf.data.AUTOTUNE)


def _shards(read: RankRead, shards: list[str], seed: int | None):
    """(encoded image, label) of rank `read.rank`'s shards, from the webdataset pipeline."""

    def samples():
        yield from rank_samples(read, shards, seed, decode=False)

    signature = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64))
    return tf.data.Dataset.from_generator(samples, output_signature=signature)
