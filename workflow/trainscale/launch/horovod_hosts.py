"""Host discovery for the Horovod elastic strategies: the hosts workers may run on, `host:slots`.

    python -m trainscale.launch.horovod_hosts --slots N [--hosts n1,n2]

Horovod's elastic driver runs this about once a second (`horovodrun --host-discovery-script`);
a change in what it prints adds or removes workers. The hosts come from, in this order:
the file named by TRAINSCALE_HOROVOD_HOSTS (lines `host:slots`; edit it to grow or shrink a
running job, as the tests do), `--hosts` (the launcher writes the SLURM job's own nodes there,
read from the controller: Snakemake's jobstep executor drops SLURM_JOB_NODELIST from the
job's environment), SLURM_JOB_NODELIST, or this host alone; N slots each. Standard library
only: it must answer fast.
"""

from __future__ import annotations

import argparse
import os
import sys


def hosts(
    slots: int, environ: dict[str, str] | None = None, listed: tuple[str, ...] = ()
) -> list[str]:
    """The `host:slots` lines Horovod's driver reads (`listed`: the --hosts given)."""
    env = os.environ if environ is None else environ
    path = env.get("TRAINSCALE_HOROVOD_HOSTS")
    if path:
        try:
            with open(path) as f:
                return [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return []  # no host available right now: Horovod waits (up to --elastic-timeout)
    if listed:
        return [f"{h}:{slots}" for h in listed]
    if env.get("SLURM_JOB_NODELIST"):
        from trainscale.launch.supervise import expand_nodelist

        return [f"{h}:{slots}" for h in expand_nodelist(env["SLURM_JOB_NODELIST"])]
    return [f"localhost:{slots}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, required=True, help="workers per host")
    p.add_argument("--hosts", default="", help="the job's nodes, comma-separated")
    a = p.parse_args(argv)
    print("\n".join(hosts(a.slots, listed=tuple(h for h in a.hosts.split(",") if h))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
