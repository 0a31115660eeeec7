"""The README and docs/*.md as a reader sees them: rendered by a real Markdown renderer.

A table that loses rows when rendered (a blank line inside it ends the table, and the rows after
it show as plain text with pipes) is caught by counting, per table, its `|` lines in the source
against the rows the renderer made. Links between pages must point at files and headings that
exist, the README stays a front door of at most 150 lines with the two commands for a fresh
machine, and every key of the config and metrics schemas is on its docs page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MD = MarkdownIt("commonmark").enable("table")


def ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


def tables(path: Path) -> list[tuple[int, int, int]]:
    """(first line, `|` lines in the source block, rendered rows) for every table of the page.

    The source block is the run of lines starting with `|` from the table's first line on, so
    rows cut off by a blank line are counted on the source side and missing on the rendered one.
    """
    lines = path.read_text().splitlines()
    found = []
    for token in MD.parse(path.read_text()):
        if token.type != "table_open":
            continue
        start = token.map[0]
        end = start
        while end < len(lines) and lines[end].lstrip().startswith("|"):
            end += 1
        source_rows = end - start - 1  # the delimiter row is no row
        found.append((start + 1, source_rows, 0))
    rendered = MD.render(path.read_text())
    counts = [t.count("<tr>") for t in re.findall(r"<table>.*?</table>", rendered, re.S)]
    assert len(counts) == len(found), path
    return [(line, rows, n) for (line, rows, _), n in zip(found, counts, strict=True)]


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_table_renders_all_its_rows(page):
    for line, source_rows, rendered_rows in tables(page):
        assert rendered_rows == source_rows, (
            f"{page.name}:{line}: {source_rows} table lines in the source, {rendered_rows} rows "
            "rendered (a blank line or a line without a leading | inside the table?)"
        )


def pipe_lines(text: str) -> int:
    """Lines that start with `|` outside code blocks, delimiter rows (`| --- |`) left out."""
    lines = text.splitlines()
    in_code = set()
    for t in MD.parse(text):
        if t.type in ("fence", "code_block") and t.map:
            in_code.update(range(*t.map))
    return sum(
        1
        for i, ln in enumerate(lines)
        if i not in in_code
        and ln.lstrip().startswith("|")
        and not re.fullmatch(r"\s*\|(\s*:?-+:?\s*\|)+\s*", ln)
    )


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_every_pipe_line_is_a_rendered_row(page):
    text = page.read_text()
    assert MD.render(text).count("<tr>") == pipe_lines(text), page.name


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_no_pipe_line_is_left_outside_a_table(page):
    """A row cut off from its table renders as a paragraph that starts with `|`."""
    stray = [
        t.content.splitlines()[0]
        for t in MD.parse(page.read_text())
        if t.type == "inline" and t.content.lstrip().startswith("| ")
    ]
    assert stray == [], f"{page.name}: lines outside any table: {stray}"


HTML = {"p", "code", "pre", "h1", "h2", "h3", "h4", "ul", "ol", "li", "strong", "em", "a"}
HTML |= {"table", "thead", "tbody", "tr", "th", "td", "img", "hr", "blockquote", "br"}


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_no_text_is_taken_for_html(page):
    """`<study>` or `<uid>` outside code is an HTML tag to the renderer, and vanishes."""
    tags = set(re.findall(r"</?([A-Za-z][\w-]*)", MD.render(page.read_text()))) - HTML
    assert tags == set(), f"{page.name}: {sorted(tags)} would not show; write &lt;...&gt;"


def test_the_broken_table_of_before_is_caught():
    """The check itself: the strategy table with a blank line in it, as the README had it."""
    broken = "| a | b |\n| --- | --- |\n| 1 | 2 |\n\n| 3 | 4 |\n"
    tokens = MD.parse(broken)
    assert sum(t.type == "tr_open" for t in tokens) == 2  # header + one row, not three
    assert any(t.type == "inline" and t.content.startswith("| 3") for t in tokens)
    assert MD.render(broken).count("<tr>") == 2 != pipe_lines(broken) == 3


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for token_line in re.findall(r"^#{1,6} (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", token_line.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def links(path: Path) -> list[str]:
    found = []

    def walk(tokens):
        for t in tokens:
            if t.type == "link_open":
                found.append(t.attrs["href"])
            if t.type == "image":
                found.append(t.attrs["src"])
            if t.children:
                walk(t.children)

    walk(MD.parse(path.read_text()))
    return found


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_links_between_pages_resolve(page):
    for href in links(page):
        if re.match(r"[a-z]+:", href):  # http(s), mailto: not ours to check
            continue
        target, _, anchor = href.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: link to {href}: {path} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{page.name}: link to {href}: no such heading"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    first = MD.parse(text)
    fence = next(t for t in first if t.type == "fence")  # the first screen's commands
    commands = [ln.split("#")[0].strip() for ln in fence.content.splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]
    for page in ("strategies", "tensorflow", "horovod", "deepspeed", "slurm", "failures"):
        assert f"(docs/{page}.md)" in text, page
    assert "(docs/metrics.md)" in text and "(docs/config.md)" in text
    picture = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", text)
    assert picture, "the README shows the report as a PNG under docs/"
    png = ROOT / picture.group(1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000


def schema_keys(node: dict, schema: dict, prefix: str = "") -> list[str]:
    """Every property's dotted path; `[]` for the entries of a list; local $refs followed."""
    keys = []
    for name, child in node.get("properties", {}).items():
        if "$ref" in child:
            target = schema
            for part in child["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            child = {**target, **child}
        keys.append(prefix + name)
        keys += schema_keys(child, schema, f"{prefix}{name}.")
        if isinstance(child.get("items"), dict):
            keys += schema_keys(child["items"], schema, f"{prefix}{name}[].")
    return keys


@pytest.mark.parametrize(
    ("schema_file", "page"),
    [("config.schema.yaml", "config.md"), ("metrics.schema.yaml", "metrics.md")],
)
def test_every_schema_key_is_on_its_page(schema_file, page):
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / schema_file).read_text())
    text = (ROOT / "docs" / page).read_text()
    keys = schema_keys(schema, schema)
    assert len(keys) > 40
    missing = [k for k in keys if f"`{k}`" not in text]
    assert missing == [], (
        f"docs/{page} lacks {missing}: run `.venv/bin/python scripts/schema-tables.py`"
    )


def test_generated_key_tables_are_up_to_date():
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "schema-tables.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr


def test_each_metric_is_defined_once():
    text = (ROOT / "docs" / "metrics.md").read_text()
    for formula in ("X(N) / X(1)", "t1 / (N · tN)", "X(N) / (N · X(1))", "algbw · 2(n − 1)/n"):
        assert text.count(formula) == 1, formula


# --- the docs' claims that code can check (issue 60) -------------------------------------------


def test_every_list_of_the_commands_is_the_commands_there_are():
    from trainscale.__main__ import COMMANDS

    lists = {
        "README.md": r"lists every command \(([^)]*)\)",
        "docs/development.md": r"the one command for users: ([^;]*);",
    }
    for page, pattern in lists.items():
        found = re.search(pattern, (ROOT / page).read_text().replace("\n", " "))
        assert found, page
        assert re.findall(r"`([\w-]+)`", found.group(1)) == list(COMMANDS), page


def test_the_cell_keys_the_docs_count_and_list_are_the_matrix_axes():
    from trainscale.plan.runspec import MATRIX_KEYS

    claims = {
        "docs/compare.md": r"matched by their (\d+) matrix values \(([^;)]*)",
        "docs/metrics.md": r"every matrix value but the repeat: (\d+) of them \(([^;)]*)",
        "docs/config.md": r"their cartesian product \((\d+) axes()",
    }
    for page, pattern in claims.items():
        found = re.search(pattern, (ROOT / page).read_text().replace("\n", " "))
        assert found, page
        assert int(found.group(1)) == len(MATRIX_KEYS), page
        if found.group(2):
            assert [k.strip() for k in found.group(2).split(",")] == list(MATRIX_KEYS), page


def test_the_scaling_cards_prediction_is_documented_as_the_card_fills_it():
    schema = yaml.safe_load(
        (ROOT / "workflow" / "schemas" / "scaling-card.schema.yaml").read_text()
    )
    fields = schema["properties"]["scaling"]["items"]["properties"]["prediction"]["required"]
    text = (ROOT / "docs" / "compare.md").read_text()
    bullet = re.search(r"^- `prediction`:(.*?)^- ", text, re.M | re.S).group(1)
    assert "not implemented" not in bullet and "null` today" not in bullet
    assert all(f in bullet for f in fields if f != "notes"), bullet


def test_one_repeat_reads_alike_in_compare_and_metrics():
    """metrics.md gives a cell of one run its prior's variance on d₀ df, "one run: no interval"
    below 4; compare.md must say the same of --ci steps, and that the bootstrap and Welch
    compare no cell of one repeat (compare/verdicts.py)."""
    metrics = " ".join((ROOT / "docs" / "metrics.md").read_text().split())
    compare = " ".join((ROOT / "docs" / "compare.md").read_text().split())
    assert "A cell of one ok run takes its prior's variance on d₀ df: below 4" in metrics
    assert "one repeat under `--ci bootstrap` or `--ci welch`" in compare
    assert "a cell of one run takes its prior's variance on d₀ degrees of freedom" in compare


@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_no_page_has_a_section_twice(page):
    """No section heading repeats another's words from their start (slurm.md had "A slow or
    unreachable controller" and, further down, the same section with a longer title)."""
    heads = [
        re.findall(r"[a-z0-9]+", h.lower())
        for h in re.findall(r"^##+ (.+)$", page.read_text(), re.M)
    ]
    for i, a in enumerate(heads):
        for b in heads[:i]:
            n = min(len(a), len(b))
            assert a[:n] != b[:n], (page.name, " ".join(b), " ".join(a))


def test_the_readme_claims_only_what_ran_and_what_is_written():
    text = (ROOT / "README.md").read_text()
    assert "they pass" not in text and "(docs/gpu-validation.md)" in text
    figures = next(ln for ln in text.splitlines() if "results/<study>/figures/" in ln)
    assert "svg" not in figures.lower() or "report.svg: true" in figures
    first_screen = "\n".join(text.splitlines()[:25])
    assert "(docs/gpu-cluster.md)" in first_screen


def test_the_gpu_cluster_page_names_what_the_config_and_records_hold():
    text = (ROOT / "docs" / "gpu-cluster.md").read_text()
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    for key in ("container", "env", "slurm"):
        assert f"config `{key}`" in text or f"`{key}`" in text, key
    for key in schema["properties"]["slurm"]["properties"]:
        assert f"{key}:" in text, key
    for name in (
        "examples/h100-llama8b.yaml",
        "examples/h100-resnet50.yaml",
        "envs/trainscale.def",
    ):
        assert f"`{name}`" in text and (ROOT / name).is_file(), name
    for field in ("env.variables", "env.nccl", "env.container"):
        assert f"`{field}`" in text, field
    for field in ("env.nccl.transport", "env.gpus", "env.rank_cpus"):
        assert f"`{field}`" in text, field


def flat(path: str) -> str:
    """A page's text with its line breaks and runs of spaces as one space."""
    return " ".join((ROOT / path).read_text().split())


def test_the_gpu_cluster_pages_say_what_the_code_does():
    """Issue 69's contradictions, read back from the code: what `make setup` installs, what
    the builds compile, what every job asks of SLURM, what Horovod's discovery lists."""
    from trainscale.gpu.stack import PINNED_TORCH_CUDA
    from trainscale.launch import slurm

    cluster, slurm_md = flat("docs/gpu-cluster.md"), flat("docs/slurm.md")
    setup = re.search(r"^setup: (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "horovod" not in setup.lower() and "(not Horovod)" in cluster
    assert "`make horovod`" in cluster and "home-directory venvs" not in cluster
    assert f"CUDA {PINNED_TORCH_CUDA} build" in cluster and "**580 or newer**" in cluster
    setup_script = (ROOT / "scripts" / "install-requirements.sh").read_text()
    assert "[and-cuda]" in setup_script and "tensorflow[and-cuda]==2.21.0" in cluster
    # deepspeed_ops builds only the CPU op: on CUDA its list of ops is empty
    runner = (ROOT / "workflow/trainscale/runners/torch/deepspeed_zero.py").read_text()
    assert (
        'names = ["ShareMemCommBuilder"] if get_accelerator().device_name() == "cpu" else []'
        in runner
    )
    assert "On CUDA the `deepspeed_ops` rule compiles nothing" in cluster
    # every job's memory: none at Snakemake's 1,000 MB default, the whole node when exclusive
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["default-resources"]["mem_mb"] == 0 and slurm.WHOLE_NODE == 0
    assert "`--mem=0`" in slurm_md and "sets no memory default" not in slurm_md
    assert "--cpus-per-task" in slurm_md and "--gpus-per-task=1" in slurm_md
    # the elastic discovery lists the job's nodes the launcher passes
    assert "passed as `--hosts`" in flat("docs/horovod.md")
    assert "start through `srun`, inside the job's step, not over ssh" in flat("docs/horovod.md")
    for example in ("h100-llama8b", "h100-resnet50"):
        text = (ROOT / "examples" / f"{example}.yaml").read_text()
        assert "nvcr.io#nvidia/pytorch" not in text and "NCCL_DEBUG: INFO" in text, example
    unmeasured = flat("docs/gpu-validation.md").split("Unmeasured: what issue 69 added")[1]
    items = ("`env.gpus`", "`env.nccl.transport`", "`trainscale doctor`", "`--gpus-per-task=1")
    for item in (*items, "`tensorflow[and-cuda]`", "`envs/trainscale.def`"):
        assert item in unmeasured.split("## ")[0], item
