"""Per-class accuracy and the confusion matrix (trainscale/measure/classes.py): the maths by hand,
and real 2-worker runs of both loops on digits whose records carry them, consistent with
accuracy."""

from __future__ import annotations

import pytest

from trainscale.measure import classes, metrics
from trainscale.plan.matrix import build_runs

from conftest import launch, validated


def test_scores_are_the_confusions_diagonal_over_its_total():
    confusion = [[3, 1, 0], [0, 2, 2], [1, 0, 1]]
    s = classes.scores([[float(v) for v in row] for row in confusion], loss_sum=5.0)
    assert s["confusion"] == confusion and all(type(v) is int for r in s["confusion"] for v in r)
    assert s["accuracy"] == pytest.approx(6 / 10)
    assert s["loss"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no test sample"):
        classes.scores([[0, 0], [0, 0]], 0.0)


def test_per_class_accuracy_is_each_rows_diagonal_share():
    confusion = [[3, 1, 0], [0, 2, 2], [0, 0, 0]]
    assert classes.per_class_accuracy(confusion) == [0.75, 0.5, None]  # no sample of class 2


def test_class_names_by_data_set():
    assert classes.class_names({"dataset": "cifar10"})[:4] == [
        "airplane",
        "automobile",
        "bird",
        "cat",
    ]
    assert len(classes.class_names({"dataset": "cifar10"})) == 10
    assert classes.class_names({"dataset": "digits"}) == [str(i) for i in range(10)]
    assert classes.class_names({"dataset": "mnist"}) == [str(i) for i in range(10)]
    assert classes.class_names({"dataset": "synthetic-cifar10"}) is None
    shards = {"format": "webdataset", "train": "x", "test": "y", "classes": 3}
    assert classes.class_names({"dataset": "mine", "image_source": shards}) == ["0", "1", "2"]


def test_class_names_of_an_image_folder_are_its_sorted_subfolders(tmp_path):
    for name in ("zebra", "ant", "cow", ".hidden"):
        (tmp_path / name).mkdir()
    source = {"format": "imagefolder", "train": str(tmp_path), "test": str(tmp_path), "classes": 3}
    assert classes.class_names({"dataset": "mine", "image_source": source}) == [
        "ant",
        "cow",
        "zebra",
    ]


def test_records_without_a_confusion_carry_the_keys_as_null(tmp_path):
    rec = metrics.Recorder({"dataset": "synthetic-mnist", "strategy": "torch", "world_size": 1})
    rec.epoch(1.0, samples=10, steps=1, train_loss=1.0, step_seconds=[1.0])
    test = {"accuracy": 0.5, "loss": 1.0, "confusion": [[1, 1], [0, 0]]}
    out = rec.record(test=test)["test"]
    assert out == {"accuracy": None, "loss": None, **dict.fromkeys(classes.PER_CLASS_KEYS)}


def run_digits(strategy: str, tmp_path) -> dict:
    cfg = {
        "study": "t",
        "epochs": 2,
        "steps_per_epoch": 6,
        "matrix": {
            "strategy": [strategy],
            "model": ["seed-small"],
            "dataset": ["digits"],
            "workers": [2],
            "batch_size": [64],
        },
    }
    spec = build_runs(validated(cfg))[0][0]
    out = tmp_path / strategy / "metrics.json"
    p = launch(spec, out, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = metrics.read(out)  # validates against the schema
    assert rec["status"] == "ok", rec["error"]
    return rec


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["torch-ddp", "tf-mirrored"])  # the other runners: seeds
def test_a_two_worker_run_records_per_class_accuracy_and_confusion(strategy, tmp_path):
    """Both loops, 2 workers each scoring a share: the confusion counts every test sample once
    (rows sum to each class's test count), its diagonal share is the recorded accuracy, and
    the per-class accuracy is each row's diagonal share, named "0".."9"."""
    from trainscale import data

    rec = run_digits(strategy, tmp_path)
    test = rec["test"]
    confusion = test["confusion"]
    assert len(confusion) == 10 and all(len(row) == 10 for row in confusion)
    labels = data.load("digits", ".").test_y
    assert [sum(row) for row in confusion] == [int((labels == k).sum()) for k in range(10)]
    total = sum(map(sum, confusion))
    assert total == rec["data"]["test_samples"] == len(labels)
    assert sum(confusion[k][k] for k in range(10)) / total == test["accuracy"]
    assert len(test["per_class_accuracy"]) == 10
    for k in range(10):
        assert test["per_class_accuracy"][k] == pytest.approx(confusion[k][k] / sum(confusion[k]))
    assert test["class_names"] == [str(k) for k in range(10)]
    assert test["accuracy"] > 0.5


def test_report_shows_per_class_accuracy_and_memory_per_strategy_at_its_largest_n(tmp_path):
    """report.html's per-class section names CIFAR-10's classes and pools a strategy's runs at
    its largest N (their confusions summed); the memory table puts the strategies side by side;
    a study whose runs recorded no confusion says why it has no per-class table."""
    import html
    import re

    from test_aggregate import ok_record, spec_for, write

    from trainscale.analysis.aggregate import human
    from trainscale.report import cli as report_cli

    def confusion(hits: int) -> list[list[int]]:  # 10 samples per class, `hits` right in class 0
        m = [[10 if i == j else 0 for j in range(10)] for i in range(10)]
        m[0] = [hits, 10 - hits, *[0] * 8]
        return m

    runs = tmp_path / "runs"
    per_ksample = []  # torch-ddp N = 2: J per 1,000 samples trained
    for strategy, workers, repeat, hits, util, joules in (
        ("torch", 1, 0, 2, None, None),
        ("torch-ddp", 1, 0, 9, 80.0, 50.0),
        ("torch-ddp", 2, 0, 4, 60.0, 300.0),
        ("torch-ddp", 2, 1, 6, 70.0, 500.0),
    ):
        s = spec_for(strategy, workers, repeat=repeat, dataset="cifar10")
        rec = ok_record(s, [0.5, 0.5], rss=(100 + workers) * 2**20)
        rec["test"] = classes.per_class_block(classes.scores(confusion(hits), 50.0), s.to_dict())
        rec["device"]["utilization_mean"] = util
        rec["device"]["energy_joules"] = joules
        if workers == 2:
            per_ksample.append(joules / (s.epochs * rec["data"]["train_samples"]) * 1000)
        write(runs, s, rec)
    assert report_cli.main(["--runs-dir", str(runs), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    section = page.split('id="per-class"')[1].split('id="resources"')[0]
    assert "seed-small on cifar10" in section
    for name in classes.CIFAR10_NAMES:
        assert f"<th>{name}</th>" in section, name
    rows = {
        r.split("</td>")[0]: r
        for r in re.split(r"<tr><td>", section)[1:]  # strategy -> its row
    }
    assert set(rows) == {"torch", "torch-ddp"}
    assert '<td class="num">2</td><td class="num">2</td>' in rows["torch-ddp"]  # N = 2, 2 runs
    assert "50.0 %" in rows["torch-ddp"]  # airplane: (4 + 6) / 20, the N = 1 run's 9 left out
    assert "20.0 %" in rows["torch"] and "<td>airplane</td>" in rows["torch"]  # the worst class
    resources = html.unescape(page.split('id="resources"')[1].split("<h2")[0])
    assert "65.0 %" in resources and "102 MiB" in resources and "101 MiB" in resources
    rows = {r.split("</td>")[0]: r for r in re.split(r"<tr><td>", resources)[1:]}
    assert "400 J" in rows["torch-ddp"]  # the mean of its two N = 2 runs, 300 and 500 J
    assert f"{human(sum(per_ksample) / 2)} J" in rows["torch-ddp"]
    # no device memory on CPU, no utilisation and no energy (no sensor): never estimated
    assert rows["torch"].count('<td class="num">–</td>') == 4

    bare = tmp_path / "bare"
    s = spec_for("torch", 1, dataset="cifar10")
    write(bare, s, ok_record(s, [0.5, 0.5]))  # a record of before per-class accuracy
    assert report_cli.main(["--runs-dir", str(bare), "--out", str(tmp_path / "out2")]) == 0
    page = (tmp_path / "out2" / "report.html").read_text()
    assert "No run recorded a confusion matrix" in page
