"""Plan: what a study runs. The config's check and overlay, the strategy and model catalog,
the frozen run spec, the matrix that expands a config into specs, and the speed options.
No framework is imported here. May import: data (to check the data sets a study names).
"""
