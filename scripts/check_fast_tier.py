"""Check that the fast test tier runs every public function and method of the package at least once.

Runs ``python -m pytest -m "not integration and not slow"`` under coverage (pytest-cov), then
lists the public functions, classes and methods of every module of ``sb3_ppo_ext`` (and of the
startup hook ``sb3_ppo_ext_zoo_hook``) from their source: module-level functions and classes whose
names do not start with ``_``, and the methods of those classes (``__init__``, ``__call__`` and
the other dunder methods included, private ``_x`` methods excluded). A function counts as run when
at least one line of its body ran (its ``def`` line runs at import, so it does not count). A class
counts as run when one of its methods did; a class without methods of its own (an exception, a
plain dataclass) is listed apart and not judged. Prints the wall-clock time of the tier and each
public name that no fast test ran; exits 1 if there is one (or if ``--max-seconds`` is exceeded).

Usage::

    python scripts/check_fast_tier.py [--workers N] [--max-seconds S] [--keep-data FILE | --data FILE]

``--keep-data FILE`` keeps the tier's coverage data; ``--data FILE`` judges an existing coverage
data file instead of running the tier. Failing tests make the exit status 1, but the coverage of
the tests that ran is judged all the same.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "sb3_ppo_ext"
HOOK = REPO_ROOT / "sb3_ppo_ext_zoo_hook.py"
FAST_TIER = "not integration and not slow"


@dataclass(frozen=True)
class PublicCode:
    """A public function, method or class: its qualified name, file and the lines of its body."""

    name: str
    path: Path
    body: frozenset[int]
    is_class: bool = False


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[int]:
    """The lines of a function's body, docstring excluded (its ``def`` line runs at import)."""
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:] or body  # a function that is only a docstring: judge the docstring line
    return frozenset(range(body[0].lineno, (body[-1].end_lineno or body[-1].lineno) + 1))


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def public_code(path: Path, module: str) -> list[PublicCode]:
    """The public functions, classes and methods defined in one source file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[PublicCode] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            found.append(PublicCode(f"{module}.{node.name}", path, _body_lines(node)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            methods = [
                PublicCode(f"{module}.{node.name}.{item.name}", path, _body_lines(item))
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(item.name)
            ]
            every_method = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
            body = frozenset().union(*(_body_lines(item) for item in every_method)) if every_method else frozenset()
            found.append(PublicCode(f"{module}.{node.name}", path, body, is_class=True))
            found += methods
    return found


def package_sources() -> list[tuple[Path, str]]:
    """Every module file of the package (``__main__`` included) and the startup hook."""
    sources = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        sources.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return [*sources, (HOOK, HOOK.stem)]


def not_run(executed: dict[str, set[int]], sources: list[tuple[Path, str]]) -> tuple[list[str], list[str], int]:
    """
    Judge the public code against the executed lines.

    :param executed: absolute file path -> line numbers that ran
    :param sources: (file, module name) pairs to judge
    :return: names never run, classes without methods of their own (not judged), number judged
    """
    missing, without_code, judged = [], [], 0
    for path, module in sources:
        lines = _lines_of(executed, path)
        for code in public_code(path, module):
            if not code.body:
                without_code.append(code.name)
                continue
            judged += 1
            if not code.body & lines:
                missing.append(code.name)
    return missing, without_code, judged


def _lines_of(executed: dict[str, set[int]], path: Path) -> set[int]:
    """
    The executed lines of ``path``, also where the tests ran an installed copy of it: with a
    non-editable install (CI's ``pip install .``), the startup hook ``sb3_ppo_ext_zoo_hook`` is imported
    from site-packages when the interpreter starts, before the tests could import the repository's file.
    """
    lines = set(executed.get(str(path.resolve()), set()))
    if not path.resolve().is_relative_to(REPO_ROOT):
        return lines
    relative = path.resolve().relative_to(REPO_ROOT).as_posix()
    for name, name_lines in executed.items():
        if Path(name).as_posix().endswith(f"/site-packages/{relative}"):
            lines |= name_lines
    return lines


def executed_lines(data_file: Path) -> dict[str, set[int]]:
    """The executed lines per file of a coverage data file (combined xdist data included)."""
    import coverage

    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    return {os.path.realpath(name): set(data.lines(name) or ()) for name in data.measured_files()}


def run_fast_tier(data_file: Path, workers: str) -> tuple[int, float]:
    """Run the fast tier under coverage; return pytest's exit status and the wall-clock seconds."""
    command = [
        sys.executable, "-m", "pytest", "-m", FAST_TIER, "-n", workers, "-p", "no:cacheprovider", "-q",
        "--cov=sb3_ppo_ext", "--cov=sb3_ppo_ext_zoo_hook", "--cov-report=",
    ]  # fmt: skip
    env = {**os.environ, "COVERAGE_FILE": str(data_file), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO_ROOT, env=env)
    return result.returncode, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers (-n), default auto")
    parser.add_argument("--max-seconds", type=float, default=None, help="fail if the tier takes longer")
    parser.add_argument("--data", type=Path, default=None, help="judge this coverage data file instead of running the tier")
    parser.add_argument(
        "--keep-data", type=Path, default=None, help="write the tier's coverage data to this file (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        data_file = args.data
        if data_file is None:
            data_file = args.keep_data.resolve() if args.keep_data else Path(folder) / ".coverage"
            status, seconds = run_fast_tier(data_file, args.workers)
            print(f"fast tier (-m {FAST_TIER!r}, -n {args.workers}, with coverage): {seconds:.0f} s, pytest exit {status}")
            failed = status != 0  # failing tests still ran their code: judge the coverage anyway
            if args.max_seconds is not None and seconds > args.max_seconds:
                print(f"the fast tier took {seconds:.0f} s, more than --max-seconds {args.max_seconds:.0f}")
                failed = True
        else:
            failed = False
        missing, without_code, judged = not_run(executed_lines(data_file), package_sources())
    print(f"{judged} public functions, classes and methods judged; {len(without_code)} classes without code of their own")
    for name in missing:
        print(f"not run by the fast tier: {name}")
    return 1 if missing or failed else 0


if __name__ == "__main__":
    sys.exit(main())
