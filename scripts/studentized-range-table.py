#!/usr/bin/env python3
"""Write workflow/trainscale/analysis/studentized_range.py: the studentized range's 95 %
quantiles q(0.95; k, df) that trainscale.analysis.best's critical values come from, for
k = 3..K_MAX cells at each df of best.DF_GRID, as scipy.stats.studentized_range.ppf gives them.

A report looked them up with scipy at run time: importing scipy.stats and integrating each
quantile took about two seconds of every report. Values outside the table are still computed
by scipy. tests/test_best.py checks entries of the table against scipy.

    .venv/bin/python scripts/studentized-range-table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workflow"))

from scipy import stats  # noqa: E402

from trainscale.analysis.best import DF_GRID, LEVEL  # noqa: E402

K_MAX = 64
PER_LINE = 4
OUT = ROOT / "workflow" / "trainscale" / "analysis" / "studentized_range.py"
HEAD = '''"""The studentized range's quantiles q(LEVEL; k, df) for k = 3..K_MAX cells at each df of
trainscale.analysis.best.DF_GRID, as scipy.stats.studentized_range.ppf gives them: the
comparison with the best's critical values without importing scipy.stats and integrating at
every report (about two seconds). Written by scripts/studentized-range-table.py; do not edit.
"""

from __future__ import annotations

#: the quantile's level, the largest cell count and the df of each column
LEVEL = {level!r}
K_MAX = {k_max}
DF = {df!r}

#: "k=<cells>" then its quantiles at each df of DF, in order
_TABLE = """
{table}
"""


def _parse(text: str) -> dict[int, tuple[float, ...]]:
    out: dict[int, list[float]] = {{}}
    for token in text.split():
        if token.startswith("k="):
            row = out.setdefault(int(token[2:]), [])
        else:
            row.append(float(token))
    return {{k: tuple(v) for k, v in out.items()}}


#: cells -> q(LEVEL; cells, df) at each df of DF
QUANTILES: dict[int, tuple[float, ...]] = _parse(_TABLE)
'''


def main() -> int:
    lines = []
    for k in range(3, K_MAX + 1):
        values = [repr(float(stats.studentized_range.ppf(LEVEL, k, df))) for df in DF_GRID]
        lines.append(f"k={k}")
        lines += [" ".join(values[i : i + PER_LINE]) for i in range(0, len(values), PER_LINE)]
        print(f"k={k}", file=sys.stderr)
    text = HEAD.format(level=LEVEL, k_max=K_MAX, df=tuple(DF_GRID), table="\n".join(lines))
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
