"""pytest-xdist groups for this suite: `make test` runs 2 workers with `--dist loadgroup`, so
that each study is built once.

The tests that read a session fixture (`torch_study`, `tf_study`, ...) share its group, joined
with the other session fixtures any of them reads; every other test runs with its file (whose
module fixtures are then built once).

xdist's scheduler reads a test's group from its node id (`path::name@group`). xdist 3.8 writes
that suffix to `item._nodeid`, which pytest 9.2 no longer reads (it keeps the id in `_id`), so
its groups were lost and a study was built on both workers. The suffix is written here where
`item.nodeid` reads it, after xdist's own hook, whichever pytest runs.
tests/conftest.py takes this hook as the suite's; `-p xdist_groups` loads it elsewhere.
"""

from __future__ import annotations

import pytest


def _is_study(defs) -> bool:
    """Whether a fixture name's definitions (the last applies) are a session fixture of the
    suite's own, not pytest's."""
    return bool(defs) and defs[-1].scope == "session" and bool(defs[-1].baseid)


def _study_fixtures(item: pytest.Item) -> list[str]:
    """The session fixtures defined by the suite (not pytest's own) that the test reads."""
    defs = item._fixtureinfo.name2fixturedefs.items()
    return [f"fixture:{n}" for n, d in defs if _is_study(d)]


def _groups(items: list[pytest.Item]) -> list[str]:
    """Each test's group, in order: its study fixtures joined by union-find, or its file."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    keys = [_study_fixtures(item) or [item.nodeid.split("::")[0]] for item in items]
    for first, *rest in keys:
        for other in rest:
            parent[root(other)] = root(first)
    return [root(names[0]) for names in keys]


def _carry_group(item: pytest.Item) -> None:
    """Suffix the node id with the test's xdist groups where `item.nodeid` reads it."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    suffix = "@" + "_".join(sorted(names))
    if not names or item.nodeid.endswith(suffix):  # none, or xdist's hook did it (pytest < 9.2)
        return
    from _pytest.nodeid import NodeId  # pytest >= 9.2, the only one that needs this

    item._id = NodeId.parse(item.nodeid + suffix)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Marks every test with its group before the other plug-ins' hooks; after them (xdist's
    included) carries the groups into the node ids on a `--dist loadgroup` worker."""
    for item, group in zip(items, _groups(items), strict=True):
        item.add_marker(pytest.mark.xdist_group(group))
    result = yield
    if getattr(config.option, "loadgroup", False):  # set by xdist on its workers only
        for item in items:
            _carry_group(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A suite's session fixture that a test fetches by name (`request.getfixturevalue`) is not
    in the test's group, which is read from its signature: the study is built a second time
    where the test runs on the other worker (test_keras_loop's were, about 300 s of CI). Such a
    test fails, saying to name the fixture in its signature."""
    result = yield
    named = set(_study_fixtures(item))
    defs = item.session._fixturemanager
    fetched = [
        name for name in item._request.fixturenames
        if f"fixture:{name}" not in named and _is_study(defs.getfixturedefs(name, item))
    ]  # fmt: skip
    if fetched:
        pytest.fail(
            f"{item.nodeid} reads the session fixture(s) {', '.join(fetched)} without naming "
            "them in its signature: tests/xdist_groups.py groups a test by the fixtures it "
            "names, so the study is built again on another worker; name them as arguments",
            pytrace=False,
        )
    return result
