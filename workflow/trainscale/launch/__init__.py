"""Launch: how a run is started and watched. The launch commands (a pure function of spec and
environment), the supervisor (`python -m trainscale.launch`), SLURM, tfrun, Horovod's host
list, lost-job attempts and the device probe. May import: measure, models, plan, data.
"""
