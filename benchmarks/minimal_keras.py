"""A minimal hand-written Keras model.fit under MirroredStrategy (TensorFlow's distributed-training
tutorial's), the yardstick for the tf-mirrored runner.

Launched by benchmarks/harness_overhead.py; prints one JSON line: {"throughput": steady samples/s}.
Same data arrays and normalisation, same model, same optimizer, global batch, thread budget and
devices as the runner (on CPU: `--workers` logical devices), and nothing else: a tutorial
pipeline (from_tensor_slices, shuffle, batch, prefetch) and one callback that reads the clock.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from trainscale import data  # noqa: E402
from trainscale.models import keras_models  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", default="seed-small")
p.add_argument("--dataset", default="digits")
p.add_argument("--scale", type=int, default=16)
p.add_argument("--batch", type=int, default=128, help="global batch")
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--workers", type=int, default=2, help="devices (logical ones on CPU)")
a = p.parse_args()

threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
tf.config.threading.set_intra_op_parallelism_threads(a.workers * threads)
tf.config.threading.set_inter_op_parallelism_threads(a.workers)
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    devices = [f"/gpu:{i}" for i in range(a.workers)]
    strategy = tf.distribute.MirroredStrategy(devices)
else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * a.workers
    )
    devices = [f"/cpu:{i}" for i in range(a.workers)]
    strategy = tf.distribute.MirroredStrategy(devices, tf.distribute.ReductionToOneDevice())

arr = data.load(a.dataset, "data", seed=0)
mean, std = np.float32(arr.mean), np.float32(arr.std)
x = (arr.train_x.transpose(0, 2, 3, 1).astype(np.float32) / arr.x_max - mean) / std
n = len(arr.train_y) * a.scale
ds = (
    tf.data.Dataset.from_tensor_slices((x, arr.train_y))
    .repeat(a.scale)
    .shuffle(n, seed=0)
    .batch(a.batch, drop_remainder=True)
    .prefetch(tf.data.AUTOTUNE)
)

keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras_models.build(a.model, arr.info.shape, arr.info.num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


class Clock(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds.append(time.perf_counter() - self.t0)


seconds: list[float] = []
model.fit(ds, epochs=a.epochs, callbacks=[Clock()], verbose=0)
steps = n // a.batch
steady = seconds[1:]  # epoch 1 is warm-up, as in the runner's steady throughput
samples = steps * a.batch
print(
    json.dumps(
        {
            "throughput": samples * len(steady) / sum(steady),
            "best": samples / min(steady),
            "epoch_samples_per_second": [samples / s for s in seconds],
        }
    ),
    flush=True,
)
