"""Every code block of the README and of the documentation site runs, so that none can rot.

Each fenced block of ``README.md`` and of the site's pages (``docs/**/*.md``, less the report data
under ``docs/benchmarks/``) is a test case, named ``<file>:<line>``:

- ``python``: executed as it stands, each block alone in a fresh namespace, in a temporary folder
  (the examples use small budgets). A block that imports a name ``sb3_ppo_ext`` does not export
  fails, naming it (a page must not promise a name the package lacks).
- ``bash``: each command is checked without running anything long. Python entry points
  (``python -m rl_zoo3.train``, ``python scripts/x.py``, ``python -m sb3_ppo_ext``, ...) parse the
  command's arguments with their own argparse parser, in this process, and stop right after
  parsing; ``pytest`` commands collect the tests they select; ``sphinx-build`` parses its options
  (``tests/integration/test_docs_build.py`` runs the build); ``pip install`` checks the extras it names and
  the torch pin; commands that set up a machine (``python3 -m venv``, ``activate``, PostgreSQL)
  are listed in :data:`NOT_EXECUTED` with the reason.
- ``yaml``: rl-zoo3 hyperparameter entries are loaded with the package's checker and their
  callbacks built with rl-zoo3's own ``get_callback_list``.
- ``text``: program output shown in a page; not code.
- Myst directives (```` ```{toctree} ````, ```` ```{eval-rst} ````) are the site's structure.
A block in any other language fails: this test must know how to run it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import runpy
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import torch as th
import yaml
from helpers import REPO_ROOT

import sb3_ppo_ext

DOCS = REPO_ROOT / "docs"
# docs/benchmarks/ holds the benchmark report's data and notes, not pages of the site.
DOC_FILES = [
    REPO_ROOT / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in {"benchmarks", "_build", "api"}),
]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S
)

# Shell commands a page shows but this test does not run, and why.
NOT_EXECUTED = {
    "python3 -m venv": "creates a virtual environment (.ci/run does it for the README's test command)",
    ". .venv/bin/activate": "activates a virtual environment",
    "bash scripts/start_postgres.sh": "starts a PostgreSQL server (.ci/run runs it; tests/test_*postgres.py use it)",
    "python -m mypy": "the type check of the whole package (.ci/run runs it)",
}
# Values for the shell variables and substitutions used in the commands.
SHELL_VALUES = {"$(nproc)": "2", "$(bash scripts/start_postgres.sh)": "postgresql://tuner:pw@127.0.0.1:5432/optuna"}

th.set_num_threads(1)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, dedented (blocks inside list items are indented)."""
    text = path.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        body = "\n".join(line[len(match["indent"]) :] for line in match["body"].splitlines())
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(path, line, match["info"].strip().split(" ")[0], textwrap.dedent(body)))
    return blocks


ALL_BLOCKS = [block for path in DOC_FILES for block in code_blocks(path)]


def blocks_of(language: str) -> list:
    return [pytest.param(block, id=block.id) for block in ALL_BLOCKS if block.language == language]


def test_every_block_has_a_language_this_test_runs():
    assert len(DOC_FILES) > 10 and len(ALL_BLOCKS) > 20
    unknown = [
        b.id for b in ALL_BLOCKS if b.language not in {"python", "bash", "yaml", "text"} and not b.language.startswith("{")
    ]
    assert unknown == []


def test_the_readme_and_each_algorithm_page_have_an_example():
    pages = {"PPOExt": "README.md", "MaskablePPOExt": "maskable.md", "RecurrentPPOExt": "recurrent.md"}
    for algorithm, page in pages.items():
        code = [b.code for b in ALL_BLOCKS if b.path.name == page and b.language == "python"]
        assert any(re.search(rf"\b{algorithm}\(", block) for block in code), (algorithm, page)


# --- python ------------------------------------------------------------------------------------


def missing_package_names(code: str) -> list[str]:
    """Names imported from ``sb3_ppo_ext`` that the package does not export."""
    missing = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module == "sb3_ppo_ext":
            missing += [alias.name for alias in node.names if not hasattr(sb3_ppo_ext, alias.name)]
    return missing


@pytest.mark.parametrize("block", blocks_of("python"))
def test_python_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert missing_package_names(block.code) == [], f"{block.id} imports names sb3_ppo_ext does not export"
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, block.id, "exec"), {"__name__": "__docs__"})


# --- bash --------------------------------------------------------------------------------------


class ParsedArguments(Exception):
    """Raised by the patched ``ArgumentParser.parse_args`` once an entry point's arguments parsed."""

    def __init__(self, namespace: argparse.Namespace):
        super().__init__(namespace)
        self.namespace = namespace


def shell_commands(code: str) -> list[list[str]]:
    """The simple commands of a bash block: continuations joined, comments dropped, ``&&`` chains split."""
    code = code.replace("\\\n", " ")
    for pattern, value in SHELL_VALUES.items():
        code = code.replace(pattern, value)
    commands = []
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            end = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:end])
            words = words[end + 1 :]
    return [c for c in commands if c]


def parse_entry_point(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run ``python <argv>`` in this process until its argparse parser has parsed the arguments."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise ParsedArguments(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    if argv[0] == "-m":
        module, rest = argv[1], argv[2:]
        if module.startswith("rl_zoo3"):
            from sb3_ppo_ext import zoo

            zoo.register()  # what the startup hook does when rl_zoo3 is imported
        monkeypatch.setattr(sys, "argv", [module, *rest])
        monkeypatch.delitem(sys.modules, f"{module}.__main__", raising=False)  # runpy runs it afresh
        run = lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        script, rest = REPO_ROOT / argv[0], argv[1:]
        assert script.is_file(), script
        monkeypatch.setattr(sys, "argv", [str(script), *rest])
        monkeypatch.syspath_prepend(str(script.parent))
        run = lambda: runpy.run_path(str(script), run_name="__main__")  # noqa: E731
    with pytest.raises(ParsedArguments) as parsed:
        run()
    return parsed.value.namespace


def check_pip_install(words: list[str]) -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for word in words[2:]:
        if word.startswith("torch"):
            from conftest import TORCH_REQUIREMENT

            assert word == TORCH_REQUIREMENT
        elif word.startswith("."):
            named = re.fullmatch(r"\.(?:\[(.*)\])?", word)
            assert named, word
            assert set(filter(None, (named[1] or "").split(","))) <= set(extras), word
        else:
            assert word in {"-e"} or re.fullmatch(r"[\w.-]+(\[[\w,]+\])?[<>=!~]=?[\w.]+", word), word


# A small module of each tier: a tier is a folder (tests/conftest.py marks every test of it, and no other),
# so a documented ``-m <tier>`` is collected on one module of its folder, and the default run on a fast one.
TIER_MODULES = {"integration": "tests/integration/test_scripts_runs.py", "slow": "tests/slow/test_learning.py"}
FAST_MODULE = "tests/test_zoo_hook.py"


def check_pytest(words: list[str]) -> None:
    """
    The command's options parse and its selection collects tests (without ``-n``: collection only, in one
    process), on one module of the tier it selects (:data:`TIER_MODULES`): the same options, judged without
    importing every test module of the suite again.
    """
    args = words[3:]
    if "-n" in args:
        del args[args.index("-n") : args.index("-n") + 2]
    marker = args[args.index("-m") + 1] if "-m" in args else None
    assert collect_tests((*args, TIER_MODULES.get(marker, FAST_MODULE))) > 0, words
    if not args:  # the default run is the fast tier (pyproject.toml's addopts; the docs say so)
        addopts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
        assert addopts.startswith("-m 'not slow and not integration'"), addopts


@functools.cache
def collect_tests(args: tuple[str, ...]) -> int:
    """How many tests ``python -m pytest <args>`` selects (one collection per distinct command and process)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    counted = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
    assert counted, result.stdout[-2000:]
    return int(counted[1])


def check_command(words: list[str], env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    words = [os.path.expandvars(word) if "$" in word else word for word in words]
    assert not any("$" in word for word in words), f"unknown shell variable in {words}"
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):  # NAME=value before a command: its environment
        words = words[1:]
    line = " ".join(words)
    if any(line.startswith(prefix) for prefix in NOT_EXECUTED):
        if words[0] == "bash":
            assert (REPO_ROOT / words[1]).is_file()
        return
    if words[0] == "export":
        name, _, value = words[1].partition("=")
        env[name] = os.environ[name] = value
    elif words[:2] == ["pip", "install"]:
        check_pip_install(words)
    elif words[0] in {"python", "python3"} and words[1:3] == ["-m", "pytest"]:
        check_pytest(words)
    elif words[0] in {"python", "python3"}:
        parse_entry_point(words[1:], monkeypatch)
    elif words[0] == "sphinx-build":
        from sphinx.cmd.build import get_parser

        get_parser().parse_args(words[1:])
    else:
        pytest.fail(f"no check for the command {line!r}: add one, or list it in NOT_EXECUTED with the reason")


@pytest.mark.parametrize("block", blocks_of("bash"))
def test_bash_block_commands_parse(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO_ROOT)
    commands = shell_commands(block.code)
    assert commands
    env: dict[str, str] = {}
    for name in ("STUDY_URL",):
        monkeypatch.delenv(name, raising=False)
    for words in commands:
        check_command(words, env, tmp_path, monkeypatch)


# --- yaml --------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", blocks_of("yaml"))
def test_yaml_block_is_a_valid_zoo_entry(block: Block, tmp_path: Path):
    from rl_zoo3.utils import get_callback_list

    from sb3_ppo_ext.hyperparams import load_hyperparams

    entries = yaml.safe_load(block.code)
    path = tmp_path / "ppo_ext.yml"
    path.write_text(block.code)
    for env_id, entry in entries.items():
        hyperparams = load_hyperparams(env_id, path)
        assert hyperparams
        if "callback" in entry:
            callbacks = get_callback_list({"callback": entry["callback"]})
            assert len(callbacks) == len(entry["callback"])
