"""Containers (config `container`) and the study's variables for every rank (config `env`):
how a job's launch enters the image, and what the record says about it.

- `apptainer`: each process a launcher form starts on a node runs under
  `apptainer exec --nv --bind ... --pwd <workdir> IMAGE` (srun, where a run spans nodes, stays
  outside: it starts one contained process per task).
- `pyxis` (NVIDIA's SPANK plugin for enroot, on DGX/SuperPOD clusters): srun enters the image
  itself (`--container-image`, `--container-mounts`, `--container-workdir`), so every run is
  started by srun, a one-node run too (`--overlap`: inside the job step Snakemake's jobstep
  executor runs it in).

Inside, `env NAME=value ...` sets the run's thread budget and config `env` before Python
starts, so an image's own environment cannot override them. The job's working directory and
trainscale's package directory are bound at their own paths (the runs import trainscale from
the checkout, PYTHONPATH, and write their records under the working directory), before the
user's `mounts`. The interpreter is the image's `python`.

The Snakefile passes both settings to every job as JSON in TRAINSCALE_CONTAINER and
TRAINSCALE_ENV (`to_environ`), outside the run spec: changing them re-runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

RUNTIMES = ("apptainer", "pyxis")
#: the directory trainscale is imported from (the runs' PYTHONPATH): bound into the image
PACKAGE_DIR = str(Path(__file__).resolve().parents[2])
#: set inside the image by `reenter`, so that a job enters it once
INSIDE_ENV = "TRAINSCALE_IN_IMAGE"
#: where the Snakefile hands config `container` and `env` to its jobs (JSON)
CONTAINER_ENV, VARIABLES_ENV = "TRAINSCALE_CONTAINER", "TRAINSCALE_ENV"
#: the interpreter a contained run starts: the image's
PYTHON = "python"


@dataclass(frozen=True)
class Container:
    """Config `container`, with the two paths every contained process needs bound."""

    image: str
    runtime: str = "apptainer"
    mounts: tuple[str, ...] = ()  # the user's, SRC[:DST[:OPTIONS]]
    workdir: str = ""  # the job's working directory: bound, and where the run starts
    package: str = ""  # trainscale's package directory (PYTHONPATH): bound

    def binds(self) -> list[str]:
        """SRC:DST of every mount, the working and package directories first, once each."""
        out: list[str] = []
        for m in (self.workdir, self.package, *self.mounts):
            if not m:
                continue
            bind = m if ":" in m else f"{m}:{m}"
            if bind not in out:
                out.append(bind)
        return out


def entry(c: Container) -> list[str]:
    """The argv before a program that runs it inside the image on this node (apptainer); none
    for pyxis, whose srun options enter the image (`srun_options`)."""
    if c.runtime != "apptainer":
        return []
    binds = [a for b in c.binds() for a in ("--bind", b)]
    pwd = ["--pwd", c.workdir] if c.workdir else []
    return ["apptainer", "exec", "--nv", *binds, *pwd, c.image]


def srun_options(c: Container) -> list[str]:
    """pyxis's srun options (none for apptainer)."""
    if c.runtime != "pyxis":
        return []
    opts = [f"--container-image={c.image}", f"--container-mounts={','.join(c.binds())}"]
    return [*opts, f"--container-workdir={c.workdir}"] if c.workdir else opts


def wrap(argv: list[str], prefix: list[str], c: Container, one_node_srun: list[str]) -> list[str]:
    """A launcher form's command line (`[srun OPTIONS] PROGRAM ...`) run inside `c`, the
    variables of `prefix` (`env NAME=value ...`) set in the image. Without srun (one node),
    pyxis gets `one_node_srun` to enter the image."""
    cut = 0
    if argv and argv[0] == "srun":
        cut = 1 + next((i for i, a in enumerate(argv[1:]) if not a.startswith("-")), len(argv))
    head, body = argv[:cut], argv[cut:]
    if c.runtime == "pyxis":
        return [*(head or one_node_srun), *srun_options(c), *prefix, *body]
    return [*head, *entry(c), *prefix, *body]


def reenter(module: str, args: list[str], environ: Mapping[str, str] | None = None) -> None:
    """For a job that is not a run but must see the runs' software (DeepSpeed's op build,
    which compiles against the image's torch): exec `python -m module args` inside the study's
    image, once (INSIDE_ENV marks the second start); no container: return at once."""
    environ = os.environ if environ is None else environ
    c, _ = from_environ(environ, os.getcwd(), PACKAGE_DIR)
    if c is None or environ.get(INSIDE_ENV):
        return
    prefix = ["env", f"{INSIDE_ENV}=1", f"PYTHONPATH={c.package}"]
    cpus = environ.get("SLURM_CPUS_PER_TASK") or "1"
    srun = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}"]
    argv = wrap([PYTHON, "-m", module, *args], prefix, c, srun)
    os.execvp(argv[0], argv)


def to_environ(container: Mapping | None, variables: Mapping) -> dict[str, str]:
    """The job environment that hands config `container` and `env` to every job: the variables
    themselves (every job and rank inherits them, srun passes them on) and both as JSON for the
    supervisor, which builds the command line (`from_environ`)."""
    out = {k: str(v) for k, v in variables.items()}
    out[VARIABLES_ENV] = json.dumps({k: str(v) for k, v in variables.items()}, sort_keys=True)
    if container:
        out[CONTAINER_ENV] = json.dumps(dict(container), sort_keys=True)
    return out


def from_environ(
    environ: Mapping[str, str], workdir: str, package: str
) -> tuple[Container | None, tuple[tuple[str, str], ...]]:
    """(the container a job's runs enter, or None; the study's variables, sorted) from the
    job environment `to_environ` made."""
    variables = tuple(sorted(json.loads(environ.get(VARIABLES_ENV) or "{}").items()))
    raw = environ.get(CONTAINER_ENV)
    if not raw:
        return None, variables
    cfg = json.loads(raw)
    container = Container(
        image=cfg["image"],
        runtime=cfg.get("runtime") or "apptainer",
        mounts=tuple(cfg.get("mounts") or ()),
        workdir=workdir,
        package=package,
    )
    return container, variables


def describe(c: Container | None, cache_dir: str | os.PathLike = ".cache") -> dict | None:
    """The record's `env.container`: the image as configured, its digest and the runtime."""
    if c is None:
        return None
    return {"image": c.image, "digest": digest(c.image, cache_dir), "runtime": c.runtime}


def digest(image: str, cache_dir: str | os.PathLike = ".cache") -> str | None:
    """`sha256:...` of the image: the digest a reference pins (`docker://repo@sha256:...`,
    `nvcr.io#repo@sha256:...`), else that of a local image file (SIF, enroot squashfs),
    hashed once per path, size and modification time (cached in `cache_dir`); None for a
    reference by tag or a sandbox directory (nothing fixed to name)."""
    if "@sha256:" in image:
        return "sha256:" + image.rsplit("@sha256:", 1)[1]
    path = Path(image.removeprefix("file://"))
    if not path.is_file():
        return None
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache = Path(cache_dir) / "container-digests.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        known[key] = f"sha256:{h.hexdigest()}"
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only cache: hashed again next time
    return known[key]
