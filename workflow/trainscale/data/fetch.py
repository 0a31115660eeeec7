"""Fetching and checking the data set files: what is missing, download, verification.

Every download goes to a temporary file beside its target, is checked against the published
MD5 and only then renamed into place, so a partial or wrong file never looks like a good one.
Archives give up only the members the catalogue names. The facts (file names, URLs, MD5s) are
``trainscale.data.catalogue``'s; read through the module so one patched value holds everywhere.
"""

import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from trainscale.data import catalogue
from trainscale.data.catalogue import DataError, Source, info

_log = logging.getLogger(__name__)


def missing_files(name: str, data_dir: str | Path) -> list[Path]:
    """The required files of ``name`` that are absent, so a study can stop before any job runs."""
    root = Path(data_dir)
    return [root / f for f in info(name).files if not (root / f).is_file()]


def missing_message(name: str, data_dir: str | Path) -> str:
    """Tell the user which files are missing, where exactly to put them, and how to get them."""
    root = Path(data_dir).expanduser().absolute()
    missing = missing_files(name, root)
    total = len(info(name).files)
    if not missing:
        return f"all {total} files of dataset {name!r} are present under {root}"
    lines = [
        f"dataset {name!r}: {len(missing)} of {total} required files are missing under {root}:",
        *(f"  - {p}" for p in missing),
        "",
        "To fetch and verify them (needs internet), run:",
        "  snakemake download",
        f"which calls: python -m trainscale.data download {name} {root}",
        "",
        "Offline? Download these on a machine with internet access and copy them by hand:",
    ]
    for src in catalogue.SOURCES.get(name, ()):
        lines.append(f"  {src.urls[0]}  (md5 {src.md5})")
        lines.extend(f"    mirror: {url}" for url in src.urls[1:])
        if src.members:
            lines.append(
                f"    then unpack it: tar -xzf {src.filename} -C {root / src.dest}"
                f"  (creates {catalogue.CIFAR_SUBDIR}/ there)"
            )
        else:
            lines.append(
                f"    save it, unchanged (still gzipped), as {root / src.dest / src.filename}"
            )
    if name == "cifar10":
        lines.append(
            "  Use the BINARY version (cifar-10-binary.tar.gz), not the python pickles: "
            "trainscale never unpickles data."
        )
    lines += [
        "",
        f"For a pure-throughput study without real data, use synthetic-{name} instead.",
    ]
    return "\n".join(lines)


# --- verification ------------------------------------------------------------------------------


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cifar_bin_bytes() -> int:
    return catalogue.CIFAR_RECORDS_PER_FILE * catalogue.CIFAR_RECORD_BYTES


def verify(name: str, data_dir: str | Path) -> None:
    """Check the files on disk are the published ones, so a bad copy fails before training.

    MNIST: MD5 of each .gz file. CIFAR-10: its MD5 belongs to the archive (checked during
    download), so the extracted .bin files are checked by size. Raises DataError.
    """
    root = Path(data_dir)
    meta = info(name)
    if not meta.files:
        return
    if missing_files(name, root):
        raise DataError(missing_message(name, root))
    if name == "mnist":
        for src in catalogue.SOURCES["mnist"]:
            path = root / src.dest / src.filename
            actual = _md5(path)
            if actual != src.md5:
                raise DataError(
                    f"{path}: MD5 mismatch (expected {src.md5}, got {actual}); the file is corrupt "
                    "or not the official one. Delete it and run `snakemake download` again."
                )
    elif name == "cifar10":
        expected = _cifar_bin_bytes()
        for rel in meta.files:
            path = root / rel
            size = path.stat().st_size
            if size != expected:
                records, record_bytes = (
                    catalogue.CIFAR_RECORDS_PER_FILE,
                    catalogue.CIFAR_RECORD_BYTES,
                )
                raise DataError(
                    f"{path}: {size} bytes, expected {expected} ({records} records "
                    f"of {record_bytes} bytes); the file is truncated or not from the "
                    "CIFAR-10 binary version. Delete it and run `snakemake download` again."
                )


# --- download ----------------------------------------------------------------------------------

_NETWORK_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)


def _fetch(url: str, target: Path, timeout: float) -> str:
    """Stream ``url`` into ``target``, returning its MD5."""
    digest = hashlib.md5(usedforsecurity=False)
    request = urllib.request.Request(url, headers={"User-Agent": "trainscale-data/0.1"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(target, "wb") as out:
        for chunk in iter(lambda: response.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _download_verified(name: str, src: Source, root: Path, timeout: float) -> Path:
    """Download ``src`` to a temporary file next to its target and return it once its MD5 matches.

    The temporary file lives in the target directory so the final rename is atomic; it is
    removed on any failure, so a partial or wrong download never looks like a good file.
    """
    directory = root / src.dest
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{src.filename}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    errors: list[str] = []
    try:
        for url in src.urls:
            _log.info("downloading %s", url)
            try:
                actual = _fetch(url, tmp, timeout)
            except _NETWORK_ERRORS as exc:
                errors.append(f"  {url}: {exc}")
                continue
            if actual != src.md5:
                raise DataError(
                    f"{directory / src.filename}: MD5 mismatch for the download from {url} "
                    f"(expected {src.md5}, got {actual}); the file was discarded."
                )
            return tmp
        raise DataError(
            f"could not download {src.filename} for dataset {name!r}: no source could be "
            "reached (are we offline?). Tried:\n"
            + "\n".join(errors)
            + "\n\n"
            + missing_message(name, root)
        )
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _extract_members(src: Source, archive: Path, root: Path) -> list[Path]:
    """Extract only ``src.members`` from ``archive`` into ``root/src.dest``.

    Nothing but the expected regular-file members is extracted, with tarfile's "data" filter
    as a second line of defence against path traversal, links and device files.
    """
    directory = root / src.dest
    staging = Path(tempfile.mkdtemp(dir=directory, prefix=".extract-"))
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                by_name = {m.name: m for m in tar.getmembers()}
                chosen = []
                for member in src.members:
                    entry = by_name.get(member)
                    if entry is None:
                        raise DataError(f"{src.filename}: the archive has no member {member!r}")
                    if not entry.isreg():
                        raise DataError(
                            f"{src.filename}: member {member!r} is not a regular file; refusing it"
                        )
                    chosen.append(entry)
                tar.extractall(staging, members=chosen, filter="data")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise DataError(f"{src.filename}: cannot read the archive ({exc})") from exc
        if src.dest == catalogue.CIFAR_DIR:
            expected = _cifar_bin_bytes()
            for member in src.members:
                size = (staging / member).stat().st_size
                if size != expected:
                    raise DataError(
                        f"{src.filename}: member {member} is {size} bytes, expected {expected}"
                    )
        written = []
        for member in src.members:
            final = directory / member
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / member, final)
            written.append(final)
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def download(name: str, data_dir: str | Path, timeout: float = 60) -> list[Path]:
    """Fetch the files of ``name`` into ``data_dir``, verify them, and return what was written.

    Files already present and verified are skipped (the returned list is then empty). Every
    download goes to a temporary file, is checked against the published MD5 and only then
    renamed into place. Raises DataError on a checksum mismatch (nothing is left behind) or when
    no source can be reached (the message says where to put the files by hand).
    """
    root = Path(data_dir)
    meta = info(name)
    if not meta.files:
        return []  # bundled (digits) or generated (synthetic): nothing to fetch
    written: list[Path] = []
    for src in catalogue.SOURCES[name]:
        if src.members:
            targets = [root / src.dest / m for m in src.members]
            if all(t.is_file() for t in targets) and _verified(name, root):
                _log.info("%s: already present and verified", name)
                continue
            archive = _download_verified(name, src, root, timeout)
            try:
                written += _extract_members(src, archive, root)
            finally:
                archive.unlink(missing_ok=True)
        else:
            final = root / src.dest / src.filename
            if final.is_file():
                if _md5(final) == src.md5:
                    _log.info("%s: already present and verified", final)
                    continue
                _log.info("%s: MD5 mismatch, downloading it again", final)
            tmp = _download_verified(name, src, root, timeout)
            os.replace(tmp, final)
            written.append(final)
    verify(name, root)
    return written


def _verified(name: str, root: Path) -> bool:
    try:
        verify(name, root)
    except DataError:
        return False
    return True


# --- loading -----------------------------------------------------------------------------------
