"""What each combination of the package's extras installs, read from pyproject.toml and the installed packages' metadata."""

from __future__ import annotations

import functools
import importlib.metadata
import itertools
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
EXTRAS = sorted(PROJECT["optional-dependencies"])


def _requirements(name: str, extras: set[str]) -> list[Requirement]:
    """The requirements of distribution ``name`` with ``extras``: this package's from pyproject.toml, others' installed."""
    if name == canonicalize_name(PROJECT["name"]):
        texts = PROJECT["dependencies"] + [
            text for extra in sorted(extras) for text in PROJECT["optional-dependencies"][extra]
        ]
        return [Requirement(text) for text in texts]
    try:
        texts = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:  # not installed here: a leaf
        return []
    found = []
    for requirement in map(Requirement, texts):
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in {"", *extras}):
            found.append(requirement)
    return found


@functools.cache
def distributions(extra: str = "") -> frozenset[str]:
    """
    Every distribution ``pip install ".[extra]"`` (``"."`` for ``""``) brings, as far as this environment's metadata
    tells. Those of several extras together are the union of each one's.
    """
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonicalize_name(PROJECT["name"]), frozenset({extra} - {""}))]
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        todo += [(canonicalize_name(r.name), frozenset(r.extras)) for r in _requirements(name, set(wanted))]
    return frozenset(name for name, _ in seen)


def pygames(*extras: str) -> set[str]:
    return {name for extra in ("", *extras) for name in distributions(extra) if name.startswith("pygame")}


def test_one_pygame_for_every_combination_of_extras():
    """pygame and pygame-ce both write ``pygame/``: no combination of extras may bring both."""
    for combination in itertools.chain.from_iterable(itertools.combinations(EXTRAS, n) for n in range(len(EXTRAS) + 1)):
        assert len(pygames(*combination)) <= 1, (
            f'pip install ".[{",".join(combination)}]" brings {sorted(pygames(*combination))}'
        )


def test_render_brings_the_pygame_of_the_test_and_bench_extras():
    assert pygames("render") == pygames("test") == pygames("bench") != set()


def test_progress_bar_needs_no_extra():
    """``learn(progress_bar=True)`` works after a plain ``pip install .``: SB3's progress bar imports tqdm and rich."""
    assert {"tqdm", "rich"} <= {canonicalize_name(Requirement(text).name) for text in PROJECT["dependencies"]}
