"""Expected throughputs per cell with tolerances, checked in ReFrame's manner.

    python -m trainscale.compare --reference references.yaml results/<study>

A references file (YAML):

    tolerance: [-0.05, null]      # default for every entry: (lower, upper) fractions
    references:
      - cell: {strategy: torch-ddp, model: seed-small, dataset: digits, workers: 2}
        throughput: 12000         # expected samples/s over all workers
        tolerance: [-0.10, 0.50]  # optional, this entry's own

- cell: a partial mapping of matrix values (strategy, model, dataset, scale, batch_size,
  batch_mode, workers, nodes, precision); it applies to every cell of the study that has them.
- tolerance: as ReFrame's (reference, lower_thres, upper_thres): the measured value must lie in
  [ref · (1 + lower), ref · (1 + upper)]; null leaves that side unbounded. Default [-0.05, null]:
  at most 5 % slower, any amount faster.
- measured value: the cell's mean throughput over its ok repeats (one repeat is enough here,
  as in ReFrame; no confidence interval).
- verdict: slower below the lower bound, faster above the upper bound (both fail the check),
  same inside; not comparable when no cell matches (missing) or the cell has no ok run (failed).
- exit status: 1 when any cell is outside its bounds, 0 otherwise, 2 on a bad references file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainscale.analysis.aggregate import CELL
from trainscale.compare import verdicts as ts_compare
from trainscale.compare.cellrow import Comparison
from trainscale.compare.sides import Side

DEFAULT_TOLERANCE = (-0.05, None)


class ReferenceFileError(ValueError):
    """A references file that is missing, not YAML, or not in the documented shape."""


def _unknown(key: str, known: list[str], where: str) -> ReferenceFileError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
    return ReferenceFileError(f"{where}.{key}: unknown key; {hint}")


def _tolerance(value, where: str) -> tuple[float | None, float | None]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(v is None or isinstance(v, int | float) for v in value)
    ):
        raise ReferenceFileError(
            f"{where}: {value!r} is not [lower, upper] (fractions or null, e.g. [-0.05, null])"
        )
    lo, hi = value
    if (lo is not None and lo > 0) or (hi is not None and hi < 0):
        raise ReferenceFileError(f"{where}: {value!r}: lower must be ≤ 0 and upper ≥ 0")
    return lo, hi


@dataclass(frozen=True)
class Reference:
    """An entry of a references file."""

    cell: dict[str, object]  # the matrix values it names: every cell they match is checked
    throughput: float  # samples/s
    tolerance: tuple[float | None, float | None]  # (lower, upper) bounds of ratio − 1


def parse(path: str | Path) -> list[Reference]:
    """The entries of a references file, checked."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ReferenceFileError(f"{path}: cannot read the references file ({e})") from None
    except yaml.YAMLError as e:
        raise ReferenceFileError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict):
        raise ReferenceFileError(f"{path}: expected a mapping with a 'references' list")
    for k in doc:
        if k not in ("tolerance", "references"):
            raise _unknown(k, ["references", "tolerance"], str(path))
    default = _tolerance(doc["tolerance"], f"{path}: tolerance") if "tolerance" in doc else None
    refs = doc.get("references")
    if not isinstance(refs, list) or not refs:
        raise ReferenceFileError(f"{path}: references: give a non-empty list of entries")
    out = []
    for i, r in enumerate(refs):
        where = f"{path}: references[{i}]"
        if not isinstance(r, dict):
            raise ReferenceFileError(f"{where}: expected a mapping with cell and throughput")
        for k in r:
            if k not in ("cell", "throughput", "tolerance"):
                raise _unknown(k, ["cell", "throughput", "tolerance"], where)
        cell = r.get("cell")
        if not isinstance(cell, dict) or not cell:
            raise ReferenceFileError(f"{where}.cell: give matrix values, e.g. {{workers: 2}}")
        for k in cell:
            if k not in CELL:
                raise _unknown(k, list(CELL), f"{where}.cell")
        x = r.get("throughput")
        if isinstance(x, bool) or not isinstance(x, int | float) or x <= 0:
            raise ReferenceFileError(f"{where}.throughput: {x!r} is not a positive samples/s")
        tol = (
            _tolerance(r["tolerance"], f"{where}.tolerance")
            if "tolerance" in r
            else default or DEFAULT_TOLERANCE
        )
        out.append(Reference(cell, float(x), tol))
    return out


def _matches(cell: dict[str, object], key: tuple) -> bool:
    values = dict(zip(CELL, key, strict=True))
    return all(str(values[k]) == str(v) for k, v in cell.items())


def check(study: dict, path: str | Path) -> Comparison:
    """The study's card checked against every reference, in the shape of compare's result."""
    refs = parse(path)
    cells = ts_compare.cells_of(study)
    rows, outside = [], []
    for ref in refs:
        lo, hi = ref.tolerance
        ordered = sorted(cells, key=lambda k: tuple(map(str, k)))
        keys = [k for k in ordered if _matches(ref.cell, k)]
        if not keys:
            rows.append(_row(ref, None, None, "missing in STUDY"))
            continue
        for key in keys:
            p = cells[key]
            if p.ok == 0 or p.mean is None:
                rows.append(_row(ref, key, p, "failed in STUDY"))
                continue
            row = _row(ref, key, p, "")
            ratio = p.mean / ref.throughput
            v = "same"
            if lo is not None and ratio < 1 + lo:
                v = "slower"
            elif hi is not None and ratio > 1 + hi:
                v = "faster"
            row.update(ratio=ratio, verdict=v)
            if v != "same":
                outside.append(row["label"])
            rows.append(row)
    return Comparison(
        mode="reference",
        base={"source": str(path), "study": "references", "runs": 0},
        new=ts_compare.describe(study),
        threshold=None,
        ci=None,
        cells=rows,
        environment=[],
        failures={"base": None, "new": study["failures"]},
        out_of_bounds=outside,
    )


def _row(ref: Reference, key: tuple | None, p: Side | None, reason: str) -> dict:
    lo, hi = ref.tolerance
    name = ts_compare.label(key) if key else ", ".join(f"{k}={v}" for k, v in ref.cell.items())
    return {
        "cell": dict(zip(CELL, key, strict=True)) if key else dict(ref.cell),
        "label": name,
        "base": {"n": None, "ok": None, "runs": None, "mean": ref.throughput, "ci95": None},
        "new": p.summary() if p else None,
        "ratio": None,
        "ci_low": None,
        "ci_high": None,
        "bounds": [None if lo is None else 1 + lo, None if hi is None else 1 + hi],
        "verdict": "not comparable",
        "reason": reason,
        "accuracy_change": None,
        "memory_change": None,
        "memory": None,
        "notes": list(p.notes) if p else [],
    }
