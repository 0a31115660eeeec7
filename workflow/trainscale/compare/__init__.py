"""Compare: two studies or two clusters side by side. Scaling cards, the cell-by-cell
verdicts, reference throughputs, and how a comparison is shown.
May import: report, analysis and every stage below. `python -m trainscale.compare` = `trainscale
compare`.
"""
