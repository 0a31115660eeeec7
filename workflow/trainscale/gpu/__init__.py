"""GPU check: every GPU path on this node through the real launcher, one line each
(`trainscale gpu-check`), and the paths it runs.
May import: report, analysis and every stage below.
"""
