"""A child process that answers the planner on a file of its own: the own models' pre-flight
(trainscale.models.preflight) and the memory estimate (trainscale.runners.torch.memory.trace)
import torch and the user's code, which the Snakefile's process must stay free of.

The child is given two paths, its request and its answer, and stdin is closed. What the user's
code prints, logs or warns, at import, build or forward, goes to stdout and stderr, which are
only a log: it can never corrupt the answer. The answer is read only where the child ended
with exit code 0 and left it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: the package's folder, first on the child's import path
WORKFLOW = Path(__file__).resolve().parents[3]


def ask(module: str, request: dict, log: Path, paths: list[str], timeout: float):
    """(the answer of `python -m module REQUEST ANSWER`, None) or (None, why there is none:
    the log's last line, the exit code, or the timeout). `paths` go on its import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKFLOW), *paths,
                                                      env.get("PYTHONPATH")]))  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainscale-child-") as tmp:
        asked, answered = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        asked.write_text(json.dumps(request))
        with open(log, "w") as out:
            try:
                code = subprocess.run(
                    [sys.executable, "-m", module, str(asked), str(answered)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                    timeout=timeout,
                ).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = None
        if code == 0 and answered.is_file():
            return json.loads(answered.read_text()), None
    if code is None:
        return None, f"no answer within {timeout:g} s"
    lines = log.read_text(errors="replace").strip().splitlines()
    return None, lines[-1] if lines else f"exit code {code}, no output"


def sources_digest(files) -> str:
    """What a cached answer depends on in source files: each file's path, modification time
    and size (an edit, or a checkout, asks the child again)."""
    h = hashlib.sha256()
    for f in sorted(map(str, files)):
        st = os.stat(f)
        h.update(f"{f}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()
