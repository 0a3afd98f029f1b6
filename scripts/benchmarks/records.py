"""The run record: the files of one run (CSV of evaluations, done marker, checkpoint, log, lock), written and read back.

``scripts/benchmark.py`` writes, per run, ``<out>/<env>/<algo>/seed<k>.csv`` (one row per evaluation,
:data:`CSV_FIELDS`) and then the done marker ``seed<k>.done.json`` (:class:`DoneMarker`): the runner
(:mod:`benchmarks.runner`) writes both through this module, and the report reads them back through it
(:func:`load_runs`), so the two agree on the names and fields by construction. A marker's ``segments``
list the stretches of training a resumed run was trained in (:func:`run_segments`).

A suite's finished runs are kept in one JSON-lines file (:func:`write_record`, read back by
:func:`load_runs` like a results folder): one line per run, its marker and its evaluations by column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from .suites import ALGOS

CSV_FIELDS = ("timesteps", "mean_return", "std_return", "episodes", "wall_time", "fps", "cpu_time")
# Columns a record written before they existed lacks (absent from its Run's evaluations).
OPTIONAL_FIELDS = ("cpu_time",)
CSV_SUFFIX = ".csv"
MARKER_SUFFIX = ".done.json"  # written after the CSV: a run with both is finished


class DoneMarker(TypedDict, total=False):
    """
    A finished run's ``seed<k>.done.json``, in the order the runner writes its keys. Markers written
    before runs could be resumed have no ``segments`` (:func:`run_segments` reads them as one segment).
    """

    env: str
    algo: str
    description: str
    seed: int
    budget: dict[str, Any]  # RunSpec.budget(): what a finished run must match to be skipped
    timesteps: int
    final_mean_return: float
    train_time_s: float
    train_cpu_s: float  # this process's CPU time (all threads) of training; markers written before it have none
    eval_time_s: float
    total_wall_time_s: float
    env_steps_per_s: float
    hyperparams_source: str
    overrides: dict[str, str]  # repr of each value
    hyperparams: dict[str, str]  # repr of each value, as rl-zoo3 saved them
    n_envs: int
    normalize: Any
    versions: dict[str, str]
    sb3_ppo_ext_revision: str | None
    cpu_count: int | None
    segments: list[dict[str, Any]]
    finished_at: str


MARKER_KEYS = tuple(DoneMarker.__annotations__)


def run_stem(out: str | Path, env: str, algo: str, seed: int) -> Path:
    """``<out>/<env>/<algo>/seed<k>``: every file of a run is this path with its own suffix."""
    return Path(out) / env / algo / f"seed{seed}"


def csv_path_of(marker_path: Path) -> Path:
    """The CSV of the run that the done marker ``marker_path`` finishes."""
    return marker_path.with_name(marker_path.name.removesuffix(MARKER_SUFFIX) + CSV_SUFFIX)


def find_markers(results: Path) -> list[Path]:
    """The done markers under a results folder (``<env>/<algo>/seed<k>.done.json``), sorted."""
    return sorted(results.glob(f"*/*/seed*{MARKER_SUFFIX}"))


def read_marker(path: Path) -> DoneMarker:
    """
    A done marker's content.

    :raises OSError: it cannot be read
    :raises ValueError: it is not JSON
    """
    return json.loads(path.read_text())


def write_marker(path: Path, marker: DoneMarker) -> None:
    """
    Write a done marker atomically, its keys in :data:`MARKER_KEYS`' order.

    :raises ValueError: the marker's keys are not the schema's
    """
    if tuple(marker) != MARKER_KEYS:
        raise ValueError(f"a done marker has the keys {MARKER_KEYS}, got {tuple(marker)}")
    write_atomic(path, json.dumps(marker, indent=1) + "\n")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the matrix."""

    env: str
    algo: str
    seed: int
    steps: int
    eval_freq: int
    eval_episodes: int
    out: str
    device: str = "cpu"
    # How this invocation runs it (not part of the result): the machine label its segment records,
    # and when to pause at the next checkpoint (after this many more env steps / at this time.time()).
    machine: str = ""
    segment_steps: int | None = None
    deadline: float | None = None
    # The candidate yml (absolute path) that CANDIDATE runs take their entry from; its entry's settings,
    # not its path, are what a finished run or checkpoint must match.
    candidate: str | None = None

    @property
    def stem(self) -> Path:
        return run_stem(self.out, self.env, self.algo, self.seed)

    @property
    def csv_path(self) -> Path:
        return self.stem.with_suffix(CSV_SUFFIX)

    @property
    def marker_path(self) -> Path:
        return self.stem.with_suffix(MARKER_SUFFIX)

    @property
    def log_path(self) -> Path:
        return self.stem.with_suffix(".log")

    @property
    def checkpoint_path(self) -> Path:
        return self.stem.with_suffix(".ckpt")

    @property
    def lock_path(self) -> Path:
        return self.stem.with_suffix(".lock")

    def budget(self) -> dict[str, Any]:
        """What a finished run must match to be skipped."""
        return {"steps": self.steps, "eval_freq": self.eval_freq, "eval_episodes": self.eval_episodes, "device": self.device}


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically, with the package's own :func:`sb3_ppo_ext.reliability.atomic_path`."""
    from sb3_ppo_ext.reliability import atomic_path

    with atomic_path(path) as file:
        file.write(data.encode() if isinstance(data, str) else data)


def cpu_model() -> str | None:
    """The CPU's model name as Linux reports it (``/proc/cpuinfo``), or None elsewhere."""
    try:
        with open("/proc/cpuinfo") as file:
            return next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), None)
    except OSError:
        return None


def default_machine() -> str:
    """The label a segment records when ``--machine`` is not given: host name and core count."""
    return f"{platform.node() or 'unknown host'} ({os.cpu_count()} cores)"


def csv_row(row: tuple) -> list:
    """An evaluation ``(timesteps, mean, std, episodes, wall_time, fps, cpu_time)`` as the CSV writes it."""
    return [row[0], f"{row[1]:.6g}", f"{row[2]:.6g}", row[3], f"{row[4]:.3f}", f"{row[5]:.1f}", f"{row[6]:.3f}"]


def git_output(folder: Path, *args: str) -> str:
    """
    ``git -C folder ARGS``'s stripped output.

    :raises OSError: git is not installed
    :raises subprocess.SubprocessError: git failed (not a checkout, unknown commit) or took over 10 s
    """
    import subprocess

    result = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=10)
    return result.stdout.strip()


def source_revision(folder: Path) -> str | None:
    """The git commit of the checkout ``folder`` belongs to (``+dirty`` with uncommitted changes); None outside git."""
    import subprocess

    try:
        commit = git_output(folder, "rev-parse", "--short", "HEAD")
        dirty = git_output(folder, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


@dataclasses.dataclass
class Run:
    """One finished run: its evaluations (by :data:`CSV_FIELDS` column) and its done marker."""

    env: str
    algo: str
    seed: int
    evaluations: dict[str, list[float]]
    marker: DoneMarker
    source: str  # where it was read: its CSV, or a record file and line

    @property
    def timesteps(self) -> np.ndarray:
        return np.array(self.evaluations["timesteps"], dtype=np.int64)

    @property
    def returns(self) -> np.ndarray:
        return np.array(self.evaluations["mean_return"], dtype=np.float64)


class BadRunError(ValueError):
    """A finished run's evaluations cannot be a benchmark's evaluation record."""


def _run(marker: DoneMarker, columns: dict[str, list[Any]], source: str) -> Run:
    """
    A :class:`Run` of a marker and its evaluation columns.

    :raises BadRunError: a column is missing or not numbers, or the evaluation steps do not increase
        (e.g. rows of two processes interleaved)
    """
    # An optional column a run was recorded without stays out of its evaluations.
    missing = {field for field in OPTIONAL_FIELDS if all(value is None for value in columns.get(field) or [])}
    try:
        evaluations = {field: [float(value) for value in columns[field]] for field in CSV_FIELDS if field not in missing}
        evaluations["timesteps"] = [int(value) for value in columns["timesteps"]]
        evaluations["episodes"] = [int(value) for value in columns["episodes"]]
    except (KeyError, TypeError, ValueError) as error:
        raise BadRunError(f"{source}: not a readable benchmark record ({type(error).__name__}: {error})") from error
    if len({len(column) for column in evaluations.values()}) != 1:
        raise BadRunError(f"{source}: its evaluation columns differ in length")
    steps = evaluations["timesteps"]
    if not steps or np.any(np.diff(steps) <= 0):
        raise BadRunError(f"{source}: evaluation steps are not increasing: {steps}")
    return Run(marker["env"], marker["algo"], int(marker["seed"]), evaluations, marker, source)


def _read_folder(results: Path) -> Iterator[Run]:
    """The finished runs of a results folder: ``<env>/<algo>/seed<k>.csv`` with ``seed<k>.done.json``."""
    for marker_path in find_markers(results):
        csv_path = csv_path_of(marker_path)
        if not csv_path.is_file():
            continue
        with open(csv_path, newline="") as file:
            rows = list(csv.DictReader(file))
        yield _run(read_marker(marker_path), {field: [row.get(field) for row in rows] for field in CSV_FIELDS}, str(csv_path))


def _read_record(record: Path) -> Iterator[Run]:
    """The runs of a record file (:func:`write_record`)."""
    for number, line in enumerate(record.read_text().splitlines(), 1):
        if line.strip():
            try:
                entry = json.loads(line)
                marker, evaluations = entry["marker"], entry["evaluations"]
            except (ValueError, KeyError, TypeError) as error:
                raise BadRunError(f"{record}:{number}: not a run record ({error})") from error
            yield _run(marker, evaluations, f"{record}:{number}")


def load_runs(results: Path) -> dict[str, dict[str, list[Run]]]:
    """
    Finished runs, by env and algo: of a results folder (``<env>/<algo>/seed<k>.csv`` with
    ``seed<k>.done.json``) or of a record file (``*.jsonl``, :func:`write_record`). A path that does
    not exist has none.

    :raises BadRunError: evaluations that are unreadable or whose steps do not increase: the report is
        not built from them
    """
    runs: dict[str, dict[str, list[Run]]] = {}
    found = _read_record(results) if results.is_file() else _read_folder(results)
    for run in found:
        runs.setdefault(run.env, {}).setdefault(run.algo, []).append(run)
    order = [*ALGOS, *sorted({algo for by_algo in runs.values() for algo in by_algo} - set(ALGOS))]
    return {
        env: {algo: sorted(by_algo[algo], key=lambda run: run.seed) for algo in order if algo in by_algo}
        for env, by_algo in runs.items()
    }


def write_record(runs: dict[str, dict[str, list[Run]]], path: Path) -> None:
    """Write ``runs`` atomically to one JSON-lines file, one run a line (a suite's committed evidence)."""
    lines = [
        json.dumps({"marker": run.marker, "evaluations": run.evaluations}, separators=(",", ":")) for run in all_runs(runs)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(f"{line}\n" for line in lines))


@dataclasses.dataclass(frozen=True)
class Segment:
    """A stretch of a run's training, trained in one go on one machine."""

    from_timesteps: int
    to_timesteps: int
    machine: str
    revision: str | None
    ended_at: str | None
    started_at: str | None = None
    train_time_s: float | None = None
    label: str | None = None  # the ``--machine`` label the segment recorded (which machine, by name)


def machine(marker: dict[str, Any]) -> str:
    """
    Where a run ran, as far as its marker says: core count and software versions. Timings are
    only compared between runs of one machine.
    """
    versions = ", ".join(f"{key} {value}" for key, value in marker.get("versions", {}).items())
    model = f" ({marker['cpu_model']})" if marker.get("cpu_model") else ""
    return f"{marker.get('cpu_count')} CPU cores{model}; {versions}"


def _segment_machine(segment: dict[str, Any], marker: dict[str, Any]) -> str:
    """
    A segment's kind of machine, as :func:`machine` gives it for a whole run: its core count and
    software versions (the segment's own; for segments that did not record them, the marker's,
    that is the last segment's). Timings compare within one kind; the segment's ``--machine``
    label, which names the machine, is listed with the segments.
    """
    versions = segment.get("versions") or marker.get("versions", {})
    return machine({"cpu_count": segment.get("cpu_count"), "cpu_model": segment.get("cpu_model"), "versions": versions})


def run_segments(marker: dict[str, Any]) -> list[Segment]:
    """
    The segments a run was trained in: its marker's ``segments``, or for a marker without them (one
    written before runs could be resumed) one segment from step 0 to the marker's, on :func:`machine`.
    """
    if not marker.get("segments"):
        return [
            Segment(
                from_timesteps=0,
                to_timesteps=int(marker["timesteps"]),
                machine=machine(marker),
                revision=marker.get("sb3_ppo_ext_revision"),
                ended_at=marker.get("finished_at"),
                train_time_s=marker.get("train_time_s"),
            )
        ]
    return [
        Segment(
            from_timesteps=int(segment["from_timesteps"]),
            to_timesteps=int(segment["to_timesteps"]),
            machine=_segment_machine(segment, marker),
            revision=segment.get("revision"),
            ended_at=segment.get("ended_at"),
            started_at=segment.get("started_at"),
            train_time_s=segment.get("train_time_s"),
            label=segment.get("machine"),
        )
        for segment in marker["segments"]
    ]


def run_machines(run: Run) -> list[str]:
    """The machines a run's segments ran on, in order of first use."""
    return list(dict.fromkeys(segment.machine for segment in run_segments(run.marker)))


def is_mixed(run: Run) -> bool:
    """Whether a run's segments ran on more than one machine: its timings compare with nothing."""
    return len(run_machines(run)) > 1


def all_runs(runs: dict[str, dict[str, list[Run]]]) -> Iterator[Run]:
    """Every run of ``runs``, env by env and algo by algo."""
    for by_algo in runs.values():
        for algo_runs in by_algo.values():
            yield from algo_runs


def machine_labels(suites: list[dict[str, dict[str, list[Run]]]]) -> dict[str, str]:
    """A letter per machine of any segment of any suite's runs, in order of first appearance."""
    labels: dict[str, str] = {}
    for runs in suites:
        for run in all_runs(runs):
            for name in run_machines(run):
                labels.setdefault(name, chr(ord("A") + len(labels)))
    return labels
