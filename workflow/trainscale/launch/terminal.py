"""What a study's terminal shows: trainscale's progress lines (trainscale.launch.progress),
warnings, errors and the end message, not Snakemake's block per job.

The profiles (profiles/default, profiles/slurm) set Snakemake's `quiet: [rules, host]`, which
hides the job blocks and the host line. Snakemake applies the setting to its log file too, and
hides a failed job's error block with the others; `show_people` undoes both: the log file
(.snakemake/log/) keeps every block, and the terminal shows error blocks (and the shell
commands `-p` asks for). It also keeps from the terminal what the progress lines replace: the
"N of M steps done" and "Finished jobid" lines, the table of jobs (but in a dry-run) and the
scheduler's "Execute N jobs..."; and the progress lines only the log file keeps (those marked
trainscale.launch.progress.DETAIL: most runs' lines in a large study). Quiet
`progress` would stop the events the progress lines are made from. `--quiet host` on the
command line (which replaces the profile's list) shows everything again (docs/config.md).
"""

from __future__ import annotations

import copy
import logging
import re

from trainscale.launch.progress import DETAIL

#: Snakemake's error events (snakemake_interface_logger_plugins.common.LogEvent values): its
#: quiet setting `rules` hides them with the job blocks; the terminal shows them
ERRORS = frozenset({"job_error", "group_error"})
#: a job's shell command, shown where asked for (`--printshellcmds`, `-p`)
SHELLCMD = "shellcmd"
#: the dry-run's table of jobs by rule, shown in a dry-run only
RUN_INFO = "run_info"
#: Snakemake's events that trainscale's progress lines replace in the terminal
REPLACED = frozenset({"progress", "job_finished", "resources_info", RUN_INFO})
#: Snakemake's bookkeeping lines (the scheduler's before each round of jobs, the DAG's, the
#: shell's, a checkpoint's re-evaluation, outputs touched): noise once the blocks are hidden
CHATTER = re.compile(
    r"Execute \d+ jobs\.\.\.|Select jobs to execute\.\.\.|Building DAG of jobs\.\.\."
    r"|Assuming unrestricted shared filesystem usage\.|Using shell: .*|Conda environments: .*"
    r"|Touching output file .*|DAG of jobs will be updated after completion\."
    r"|Updating checkpoint dependencies\."
)


class TerminalFilter(logging.Filter):
    """Snakemake's filter of its terminal handler, letting errors (and shell commands asked
    for) through and holding back what the progress lines replace (but a dry-run's table of
    jobs) and the progress lines marked DETAIL."""

    def __init__(self, snakemake_filter: logging.Filter) -> None:
        super().__init__()
        self.inner = snakemake_filter

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "event", None)
        if event in ERRORS or (event == RUN_INFO and getattr(self.inner, "dryrun", False)):
            return True
        if event == SHELLCMD and getattr(self.inner, "printshellcmds", False):
            return True  # asked for (-p), which the quiet setting `rules` would hide
        if event in REPLACED or getattr(record, DETAIL, False):
            return False
        if CHATTER.fullmatch(str(record.msg)):
            return False
        return self.inner.filter(record)


def quiet_names(snakemake_filter: logging.Filter) -> set[str]:
    """The quiet setting a Snakemake filter holds, as names (rules, progress, host, ...)."""
    return {str(getattr(q, "name", q)).lower() for q in getattr(snakemake_filter, "quiet", ())}


def show_people(logger: logging.Logger) -> None:
    """Where Snakemake's quiet setting hides its rule blocks (and not everything), give its log
    file every record and its terminal the errors (TerminalFilter), in place."""
    for handler in logger.handlers:
        for inner in [f for f in handler.filters if hasattr(f, "quiet")]:  # DefaultFilter
            quiet = quiet_names(inner)
            if "rules" not in quiet or "all" in quiet:
                continue
            handler.removeFilter(inner)
            if isinstance(handler, logging.FileHandler):
                full = copy.copy(inner)
                full.quiet = set()
                handler.addFilter(full)
            else:
                handler.addFilter(TerminalFilter(inner))
