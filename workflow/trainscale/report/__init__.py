"""Report: what a reader sees. The figures (`figures/`), report.html with its rows and
sections, the report's steps (`pipeline`) and the message a finished workflow ends with.
May import: analysis and every stage below it. `python -m trainscale.report` = `trainscale report`.
"""
