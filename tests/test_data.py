"""Tests for trainscale.data: real file formats written by hand, no network beyond loopback."""

import dataclasses
import functools
import gzip
import hashlib
import http.server
import io
import socket
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from trainscale import data
from trainscale.data import DataError
from trainscale.data import catalogue as data_catalogue
from trainscale.data import fetch as data_download
from trainscale.data import formats as data_formats

MNIST_NAMES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
CIFAR_NAMES = (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin")


# --- helpers writing the real formats ----------------------------------------------------------


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """IDX encoding: big-endian magic (0x0000 08 ndim), big-endian uint32 sizes, raw bytes."""
    magic = 0x00000800 | array.ndim if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_gz(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload))


def make_mnist(root: Path, n_train: int = 50, n_test: int = 20, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for name, key in zip(MNIST_NAMES, ("train_x", "train_y", "test_x", "test_y"), strict=True):
        write_gz(root / "mnist" / name, idx_bytes(arrays[key]))
    return arrays


def cifar_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
    """CIFAR-10 binary records: label byte, then the R, G and B planes of 32x32, row-major."""
    records = np.concatenate([labels[:, None], images.reshape(len(images), -1)], axis=1)
    return records.astype(np.uint8).tobytes()


def make_cifar_files(seed: int = 2, per_file: int = 3) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        name: (
            rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8),
            rng.integers(0, 10, per_file, dtype=np.uint8),
        )
        for name in CIFAR_NAMES
    }


def write_cifar(root: Path, files: dict[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    base = root / "cifar10" / "cifar-10-batches-bin"
    base.mkdir(parents=True, exist_ok=True)
    for name, (x, y) in files.items():
        (base / name).write_bytes(cifar_bytes(x, y))
    return base


def md5(payload: bytes) -> str:
    return hashlib.md5(payload, usedforsecurity=False).hexdigest()


# --- static facts ------------------------------------------------------------------------------


def test_info_covers_every_dataset():
    for name in data.DATASETS:
        meta = data.info(name)
        assert meta.name == name
        assert len(meta.shape) == (3 if meta.input == "image" else 0)  # tokens: (seq_len,)
        assert (meta.input == "tokens") == (name in data.TOKEN_SETS)
        assert meta.synthetic == name.startswith("synthetic-")
        assert bool(meta.files) == (name in ("mnist", "cifar10"))
    assert data.info("synthetic-imagenet").shape == (3, 224, 224)
    assert data.info("synthetic-imagenet").num_classes == 1000
    assert data.info("cifar10").files[0] == "cifar10/cifar-10-batches-bin/data_batch_1.bin"


def test_info_unknown_names_the_choices():
    with pytest.raises(ValueError, match="synthetic-imagenet"):
        data.info("imagenet")


@pytest.mark.parametrize("module", [data, data_catalogue, data_download, data_formats])
def test_module_imports_no_framework(module):
    source = Path(module.__file__).read_text()
    assert "import torch" not in source
    assert "tensorflow" not in source.replace("TensorFlow", "")
    assert "pickle" not in source.replace("pickles", "").replace("unpickle", "")


# --- MNIST -------------------------------------------------------------------------------------


def test_mnist_roundtrip(tmp_path):
    arrays = make_mnist(tmp_path)
    loaded = data.load("mnist", tmp_path)
    assert loaded.train_x.shape == (50, 1, 28, 28)
    assert loaded.test_x.shape == (20, 1, 28, 28)
    assert loaded.train_x.dtype == np.uint8
    assert loaded.train_y.dtype == np.int64
    np.testing.assert_array_equal(loaded.train_x[:, 0], arrays["train_x"])
    np.testing.assert_array_equal(loaded.train_y, arrays["train_y"])
    np.testing.assert_array_equal(loaded.test_x[:, 0], arrays["test_x"])
    np.testing.assert_array_equal(loaded.test_y, arrays["test_y"])
    assert loaded.x_max == 255
    assert loaded.mean == (0.1307,)
    assert loaded.std == (0.3081,)
    loaded.train_x[0, 0, 0, 0] = 7  # writable, not a view onto the file buffer


@pytest.mark.parametrize(
    ("name", "payload_fn", "match"),
    [
        (
            "train-images-idx3-ubyte.gz",
            lambda a: idx_bytes(a["train_x"], magic=0x00000801),
            "magic",
        ),
        ("train-labels-idx1-ubyte.gz", lambda a: idx_bytes(a["train_y"], magic=0x803), "magic"),
        ("t10k-images-idx3-ubyte.gz", lambda a: idx_bytes(a["test_x"])[:-5], "truncated"),
        ("t10k-labels-idx1-ubyte.gz", lambda a: idx_bytes(a["test_y"])[:6], "header"),
        ("t10k-labels-idx1-ubyte.gz", lambda a: idx_bytes(a["test_y"]) + b"\0", "unexpected"),
        ("train-labels-idx1-ubyte.gz", lambda a: idx_bytes(a["train_y"][:-1]), "labels"),
        ("train-labels-idx1-ubyte.gz", lambda a: idx_bytes(a["train_y"] + 10), "out of range"),
        (
            "train-images-idx3-ubyte.gz",
            lambda a: idx_bytes(a["train_x"].reshape(50, 16, 49)),
            "16x49",
        ),
    ],
)
def test_mnist_corrupt_files_name_the_file(tmp_path, name, payload_fn, match):
    arrays = make_mnist(tmp_path)
    path = tmp_path / "mnist" / name
    write_gz(path, payload_fn(arrays))
    with pytest.raises(DataError, match=match) as err:
        data.load("mnist", tmp_path)
    assert str(path) in str(err.value)


def test_mnist_truncated_gzip_names_the_file(tmp_path):
    make_mnist(tmp_path)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="gzip") as err:
        data.load("mnist", tmp_path)
    assert str(path) in str(err.value)


def test_mnist_not_gzip_names_the_file(tmp_path):
    make_mnist(tmp_path)
    path = tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(b"<html>403 Forbidden</html>")
    with pytest.raises(DataError) as err:
        data.load("mnist", tmp_path)
    assert str(path) in str(err.value)


# --- CIFAR-10 ----------------------------------------------------------------------------------


def test_cifar_roundtrip_and_channel_order(tmp_path):
    files = make_cifar_files()
    base = write_cifar(tmp_path, files)
    # One hand-built record: R plane all 11, G 22, B 33, except pixel (y=2, x=5) of G is 200.
    planes = np.stack([np.full((32, 32), v, np.uint8) for v in (11, 22, 33)])
    planes[1, 2, 5] = 200
    raw = bytes([7]) + bytes([11] * 1024) + bytes([22] * 1024) + bytes([33] * 1024)
    raw = bytearray(raw)
    raw[1 + 1024 + 2 * 32 + 5] = 200  # label byte, R plane, then row 2 column 5 of G
    (base / "test_batch.bin").write_bytes(bytes(raw) + cifar_bytes(*files["test_batch.bin"]))

    loaded = data.load("cifar10", tmp_path)
    assert loaded.train_x.shape == (15, 3, 32, 32)
    assert loaded.test_x.shape == (4, 3, 32, 32)
    assert loaded.train_x.dtype == np.uint8
    assert loaded.train_y.dtype == np.int64
    expected_x = np.concatenate([files[n][0] for n in CIFAR_NAMES[:5]])
    expected_y = np.concatenate([files[n][1] for n in CIFAR_NAMES[:5]])
    np.testing.assert_array_equal(loaded.train_x, expected_x)
    np.testing.assert_array_equal(loaded.train_y, expected_y)
    np.testing.assert_array_equal(loaded.test_x[0], planes)
    assert loaded.test_y[0] == 7
    assert loaded.test_x[0, 0, 0, 0] == 11  # R first
    assert loaded.test_x[0, 1, 2, 5] == 200
    np.testing.assert_array_equal(loaded.test_x[1:], files["test_batch.bin"][0])
    assert loaded.mean == (0.4914, 0.4822, 0.4465)
    assert loaded.std == (0.2470, 0.2435, 0.2616)
    loaded.test_x[0, 0, 0, 0] = 1  # writable


def test_cifar_truncated_names_the_file(tmp_path):
    base = write_cifar(tmp_path, make_cifar_files())
    path = base / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match="3073-byte records") as err:
        data.load("cifar10", tmp_path)
    assert str(path) in str(err.value)


def test_cifar_bad_label_names_the_file(tmp_path):
    files = make_cifar_files()
    x, y = files["test_batch.bin"]
    files["test_batch.bin"] = (x, y + 10)
    base = write_cifar(tmp_path, files)
    with pytest.raises(DataError, match="out of range") as err:
        data.load("cifar10", tmp_path)
    assert str(base / "test_batch.bin") in str(err.value)


def test_cifar_verify_checks_sizes(tmp_path, monkeypatch):
    base = write_cifar(tmp_path, make_cifar_files(per_file=3))
    with pytest.raises(DataError, match="30730000") as err:
        data.verify("cifar10", tmp_path)
    assert str(base / "data_batch_1.bin") in str(err.value)
    monkeypatch.setattr(data_catalogue, "CIFAR_RECORDS_PER_FILE", 3)
    data.verify("cifar10", tmp_path)


# --- digits and synthetic ----------------------------------------------------------------------


def test_digits_split():
    a = data.load("digits", "unused")
    assert a.train_x.shape == (1437, 1, 8, 8)
    assert a.test_x.shape == (360, 1, 8, 8)
    assert a.train_x.dtype == np.uint8 and a.test_x.dtype == np.uint8
    assert a.train_y.dtype == np.int64
    assert a.train_x.max() <= 16 and a.test_x.max() <= 16
    assert a.x_max == 16
    # Stratified: each class keeps its share of the 1797 samples in the 360-sample test split.
    full = np.bincount(np.concatenate([a.train_y, a.test_y]))
    assert np.abs(np.bincount(a.test_y) - full * 360 / 1797).max() <= 1
    scaled = a.train_x / 16.0
    assert a.mean == pytest.approx((scaled.mean(),))
    assert a.std == pytest.approx((scaled.std(),))
    b = data.load("digits", "unused", seed=5)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.test_y, b.test_y)


@pytest.mark.parametrize("name", ["synthetic-mnist", "synthetic-cifar10"])
def test_synthetic(name):
    meta = data.info(name)
    a = data.load(name, "unused", seed=3)
    assert a.train_x.shape == (meta.train_samples, *meta.shape)
    assert a.test_x.shape == (meta.test_samples, *meta.shape)
    assert a.train_x.dtype == np.uint8 and a.train_y.dtype == np.int64
    assert a.train_y.min() >= 0 and a.train_y.max() < meta.num_classes
    assert a.mean == (0.5,) * meta.shape[0] and a.std == (0.25,) * meta.shape[0]
    b = data.load(name, "unused", seed=3)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.test_y, b.test_y)
    c = data.load(name, "unused", seed=4)
    assert not np.array_equal(a.train_x[:10], c.train_x[:10])
    assert not np.array_equal(a.train_y, c.train_y)


def test_synthetic_imagenet_labels():
    a = data.load("synthetic-imagenet", "unused", seed=0)
    assert a.train_x.shape == (1280, 3, 224, 224)
    assert a.test_x.shape == (256, 3, 224, 224)
    assert a.train_y.max() < 1000 and a.train_y.max() > 900


# --- missing files -----------------------------------------------------------------------------


def test_missing_files_and_message(tmp_path):
    assert data.missing_files("digits", tmp_path) == []
    assert data.missing_files("synthetic-imagenet", tmp_path) == []
    missing = data.missing_files("mnist", tmp_path)
    assert missing == [tmp_path / "mnist" / n for n in MNIST_NAMES]
    message = data.missing_message("mnist", tmp_path)
    for path in missing:
        assert str(path) in message
    assert "snakemake download" in message
    assert f"python -m trainscale.data download mnist {tmp_path}" in message
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz" in message
    assert "f68b3c2dcbeaaa9fbdd348bbdeb94873" in message

    make_mnist(tmp_path)
    assert data.missing_files("mnist", tmp_path) == []
    (tmp_path / "mnist" / MNIST_NAMES[2]).unlink()
    assert data.missing_files("mnist", tmp_path) == [tmp_path / "mnist" / MNIST_NAMES[2]]

    cifar = data.missing_message("cifar10", tmp_path)
    assert str(tmp_path / "cifar10" / "cifar-10-batches-bin" / "test_batch.bin") in cifar
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz" in cifar
    assert "snakemake download" in cifar
    assert f"tar -xzf cifar-10-binary.tar.gz -C {tmp_path / 'cifar10'}" in cifar


def test_load_missing_raises_helpful_error(tmp_path):
    with pytest.raises(DataError, match="snakemake download") as err:
        data.load("cifar10", tmp_path)
    assert str(tmp_path / "cifar10" / "cifar-10-batches-bin" / "data_batch_1.bin") in str(err.value)


def test_cli_check(tmp_path, capsys, monkeypatch):
    assert data.main(["check", "mnist", str(tmp_path)]) == 1
    assert "snakemake download" in capsys.readouterr().err
    arrays_dir = tmp_path / "ok"
    make_mnist(arrays_dir)
    with pytest.raises(SystemExit):
        data.main(["check", "nope", str(tmp_path)])
    # Test files are not the published ones: the MD5 check must catch that ...
    assert data.main(["check", "mnist", str(arrays_dir)]) == 1
    assert "MD5 mismatch" in capsys.readouterr().err
    # ... and pass once the expected checksums are those of these files.
    patch_sources(monkeypatch, "http://127.0.0.1:9/", arrays_dir)
    assert data.main(["check", "mnist", str(arrays_dir)]) == 0
    assert data.main(["check", "digits", str(tmp_path)]) == 0


# --- download over loopback --------------------------------------------------------------------


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serve tmp_path/served over HTTP on 127.0.0.1 only; yields (base_url, directory)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(QuietHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", served
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def patch_sources(monkeypatch, base_url: str, md5_from: Path | None = None) -> None:
    """Point the MNIST sources at base_url; take the expected MD5s from files in md5_from."""
    sources = []
    for src in data.SOURCES["mnist"]:
        checksum = src.md5
        if md5_from is not None:
            checksum = md5((md5_from / "mnist" / src.filename).read_bytes())
        sources.append(dataclasses.replace(src, urls=(base_url + src.filename,), md5=checksum))
    monkeypatch.setitem(data.SOURCES, "mnist", tuple(sources))


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_download_mnist_verifies_and_lands_atomically(tmp_path, server, monkeypatch):
    base_url, served = server
    arrays = make_mnist(served)
    patch_sources(monkeypatch, base_url + "mnist/", served)
    dest = tmp_path / "data"

    written = data.download("mnist", dest, timeout=5)
    assert written == [dest / "mnist" / n for n in MNIST_NAMES]
    for name in MNIST_NAMES:
        assert (dest / "mnist" / name).read_bytes() == (served / "mnist" / name).read_bytes()
    assert leftovers(dest / "mnist") == []
    np.testing.assert_array_equal(data.load("mnist", dest).test_y, arrays["test_y"])

    # Present and verified: nothing is fetched again, even with the server gone.
    patch_sources(monkeypatch, closed_port_url(), served)
    assert data.download("mnist", dest, timeout=5) == []


def test_download_checksum_mismatch_leaves_nothing(tmp_path, server, monkeypatch):
    base_url, served = server
    make_mnist(served)
    patch_sources(monkeypatch, base_url + "mnist/")  # the published MD5s: never match test data
    dest = tmp_path / "data"
    with pytest.raises(DataError) as err:
        data.download("mnist", dest, timeout=5)
    message = str(err.value)
    assert "train-images-idx3-ubyte.gz" in message
    assert "f68b3c2dcbeaaa9fbdd348bbdeb94873" in message  # expected
    assert md5((served / "mnist" / MNIST_NAMES[0]).read_bytes()) in message  # actual
    assert list((dest / "mnist").iterdir()) == []


def test_download_offline_says_where_to_put_files(tmp_path, monkeypatch):
    patch_sources(monkeypatch, closed_port_url())
    dest = tmp_path / "data"
    with pytest.raises(DataError, match="offline") as err:
        data.download("mnist", dest, timeout=5)
    message = str(err.value)
    assert str(dest / "mnist" / "train-images-idx3-ubyte.gz") in message
    assert "snakemake download" in message
    assert list((dest / "mnist").iterdir()) == []
    assert data.main(["download", "mnist", str(dest), "--timeout", "5"]) == 1


def test_download_falls_back_to_mirror(tmp_path, server, monkeypatch):
    base_url, served = server
    make_mnist(served)
    patch_sources(monkeypatch, base_url + "mnist/", served)
    mirrored = tuple(
        dataclasses.replace(s, urls=(base_url + "absent/" + s.filename, *s.urls))
        for s in data.SOURCES["mnist"]
    )
    monkeypatch.setitem(data.SOURCES, "mnist", mirrored)  # first URL answers 404
    assert len(data.download("mnist", tmp_path / "data", timeout=5)) == 4


def test_download_nothing_for_bundled_or_synthetic(tmp_path):
    assert data.download("digits", tmp_path) == []
    assert data.download("synthetic-cifar10", tmp_path) == []
    assert not any(tmp_path.iterdir())


def build_cifar_archive(path: Path, files: dict, extra: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (x, y) in files.items():
            payload = cifar_bytes(x, y)
            entry = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            entry.size = len(payload)
            tar.addfile(entry, io.BytesIO(payload))
        for entry in extra:
            tar.addfile(entry, io.BytesIO(b"x" * entry.size) if entry.isreg() else None)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def evil_members() -> list[tarfile.TarInfo]:
    escape = tarfile.TarInfo("../escaped.bin")
    escape.size = 4
    absolute = tarfile.TarInfo("/tmp/trainscale-absolute-evil.bin")
    absolute.size = 4
    deep = tarfile.TarInfo("cifar-10-batches-bin/../../escaped2.bin")
    deep.size = 4
    link = tarfile.TarInfo("cifar-10-batches-bin/passwd")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    readme = tarfile.TarInfo("cifar-10-batches-bin/readme.html")
    readme.size = 4
    return [escape, absolute, deep, link, readme]


def patch_cifar(monkeypatch, url: str, checksum: str) -> None:
    (src,) = data.SOURCES["cifar10"]
    monkeypatch.setitem(
        data.SOURCES, "cifar10", (dataclasses.replace(src, urls=(url,), md5=checksum),)
    )
    monkeypatch.setattr(data_catalogue, "CIFAR_RECORDS_PER_FILE", 3)


def test_download_cifar_extracts_only_expected_members(tmp_path, server, monkeypatch):
    base_url, served = server
    files = make_cifar_files(per_file=3)
    archive = build_cifar_archive(served / "cifar-10-binary.tar.gz", files, evil_members())
    patch_cifar(monkeypatch, base_url + "cifar-10-binary.tar.gz", md5(archive))
    dest = tmp_path / "deep" / "data"

    written = data.download("cifar10", dest, timeout=5)
    base = dest / "cifar10" / "cifar-10-batches-bin"
    assert written == [base / n for n in CIFAR_NAMES]
    assert sorted(p.name for p in base.iterdir()) == sorted(CIFAR_NAMES)
    assert sorted(p.name for p in (dest / "cifar10").iterdir()) == ["cifar-10-batches-bin"]
    assert not (tmp_path / "deep" / "escaped.bin").exists()
    assert not (dest / "escaped.bin").exists()
    assert not (tmp_path / "deep" / "escaped2.bin").exists()
    assert not Path("/tmp/trainscale-absolute-evil.bin").exists()
    loaded = data.load("cifar10", dest)
    np.testing.assert_array_equal(loaded.test_x, files["test_batch.bin"][0])

    # Already present and verified: skipped without touching the network.
    patch_cifar(monkeypatch, closed_port_url(), md5(archive))
    assert data.download("cifar10", dest, timeout=5) == []


def test_download_cifar_bad_checksum_leaves_nothing(tmp_path, server, monkeypatch):
    base_url, served = server
    build_cifar_archive(served / "cifar-10-binary.tar.gz", make_cifar_files(), [])
    patch_cifar(monkeypatch, base_url + "cifar-10-binary.tar.gz", "0" * 32)
    dest = tmp_path / "data"
    with pytest.raises(DataError, match="cifar-10-binary.tar.gz") as err:
        data.download("cifar10", dest, timeout=5)
    assert "0" * 32 in str(err.value)
    assert list((dest / "cifar10").iterdir()) == []


def test_download_cifar_refuses_linked_member(tmp_path, server, monkeypatch):
    base_url, served = server
    files = make_cifar_files()
    del files["test_batch.bin"]
    link = tarfile.TarInfo("cifar-10-batches-bin/test_batch.bin")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    archive = build_cifar_archive(served / "cifar-10-binary.tar.gz", files, [link])
    patch_cifar(monkeypatch, base_url + "cifar-10-binary.tar.gz", md5(archive))
    dest = tmp_path / "data"
    with pytest.raises(DataError, match="not a regular file"):
        data.download("cifar10", dest, timeout=5)
    assert list((dest / "cifar10").iterdir()) == []


def test_the_digits_split_is_kept_in_the_user_cache_and_read_back_the_same(tmp_path, monkeypatch):
    """Runs read the split from ~/.cache/trainscale instead of importing scikit-learn (~1.5 s
    a run); what they read is exactly scikit-learn's split, and a damaged file is made again."""
    import numpy as np

    from trainscale.data import formats as data_formats

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = data_formats.digits_cache()
    assert cache is not None and cache.parent == tmp_path / "trainscale" and not cache.exists()
    made = data.load("digits", tmp_path / "data")
    assert cache.exists()
    cache_read = data.load("digits", tmp_path / "data")
    cache.write_bytes(b"PK\x03\x04 cut short")
    remade = data.load("digits", tmp_path / "data")
    for other in (cache_read, remade):
        for name in ("train_x", "train_y", "test_x", "test_y"):
            a, b = getattr(made, name), getattr(other, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert (other.mean, other.std, other.x_max) == (made.mean, made.std, made.x_max)
    assert (len(made.train_y), len(made.test_y)) == (1437, 360)
    with np.load(cache) as z:  # written again, whole
        assert len(z["test_y"]) == 360
