"""scripts/benchmark.py (the matrix: CSVs, done markers, resume) and scripts/benchmark_report.py (statistics, report)."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


benchmark = _load("benchmark")
report = _load("benchmark_report")


def _run_benchmark(out: Path, *extra: str) -> str:
    """Run the benchmark script on a tiny Pendulum matrix (one worker process); return its stdout."""
    command = [
        sys.executable,
        str(SCRIPTS / "benchmark.py"),
        *("--envs", "Pendulum-v1", "--algos", "ppo", "ppo_ext_kl", "--seeds", "2", "--steps", "2048"),
        *("--eval-freq", "1024", "--eval-episodes", "2", "--workers", "1", "--out", str(out), *extra),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.integration  # benchmark.py in subprocesses
def test_matrix_writes_csvs_skips_finished_and_reruns_interrupted(tmp_path):
    out = tmp_path / "results"
    first = _run_benchmark(out)
    assert "4 runs, 0 already finished (skipped), 4 to run" in first
    assert "[4/4]" in first and "ETA" in first
    finals = {}
    for algo in ("ppo", "ppo_ext_kl"):
        for seed in (0, 1):
            stem = out / "Pendulum-v1" / algo / f"seed{seed}"
            with open(stem.with_suffix(".csv"), newline="") as file:
                rows = list(csv.DictReader(file))
            assert tuple(rows[0]) == benchmark.CSV_FIELDS
            # step 0, every multiple of eval_freq below the budget, then after the last update: one
            # rollout of Pendulum's entry is 4 envs x 1024 steps, so training ends at 4096.
            assert [int(row["timesteps"]) for row in rows] == [0, 1024, 4096]
            assert all(int(row["episodes"]) == 2 for row in rows)
            assert all(-2000 < float(row["mean_return"]) < 0 for row in rows)
            assert float(rows[-1]["wall_time"]) > 0 and float(rows[-1]["fps"]) > 0
            marker = json.loads(stem.with_suffix(".done.json").read_text())
            assert marker["budget"] == {"steps": 2048, "eval_freq": 1024, "eval_episodes": 2, "device": "cpu"}
            assert marker["timesteps"] == 4096 and marker["n_envs"] == 4
            assert marker["final_mean_return"] == pytest.approx(float(rows[-1]["mean_return"]), rel=1e-5)
            assert marker["total_wall_time_s"] >= marker["train_time_s"] > 0
            finals[algo, seed] = marker
            assert not list(stem.parent.glob("*.tmp"))
    # Built by rl-zoo3 from each algorithm's own file; the KL variant overrides only the objective.
    assert finals["ppo", 0]["hyperparams_source"] == "rl_zoo3/hyperparams/ppo.yml: Pendulum-v1"
    assert finals["ppo_ext_kl", 0]["hyperparams"]["clip_range"] == "None"
    assert finals["ppo_ext_kl", 0]["hyperparams"]["use_sde"] == "True"
    assert finals["ppo", 0]["hyperparams"]["clip_range"] == "0.2"

    # A restart skips every finished run and touches no file.
    mtimes = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    second = _run_benchmark(out)
    assert "4 runs, 4 already finished (skipped), 0 to run" in second
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == mtimes

    # An interrupted run (partial CSV, no marker) is rerun from scratch; the others are kept.
    interrupted = out / "Pendulum-v1" / "ppo_ext_kl" / "seed1"
    interrupted.with_suffix(".done.json").unlink()
    interrupted.with_suffix(".csv").rename(interrupted.with_suffix(".csv.tmp"))
    third = _run_benchmark(out)
    assert "4 runs, 3 already finished (skipped), 1 to run" in third
    assert "ppo_ext_kl seed 1" in third
    assert interrupted.with_suffix(".done.json").is_file() and not interrupted.with_suffix(".csv.tmp").exists()
    rerun = json.loads(interrupted.with_suffix(".done.json").read_text())
    assert "sb3_ppo_ext_revision" in rerun
    # Same seed, same settings: the rerun reproduces the interrupted run's evaluation.
    assert rerun["final_mean_return"] == pytest.approx(finals["ppo_ext_kl", 1]["final_mean_return"], rel=1e-6)
    kept = out / "Pendulum-v1" / "ppo" / "seed0.csv"
    assert kept.stat().st_mtime_ns == mtimes[kept]


def test_changed_budget_is_not_finished(tmp_path):
    spec = benchmark.RunSpec("Pendulum-v1", "ppo", 0, 1000, 500, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text(",".join(benchmark.CSV_FIELDS) + "\n")
    assert not benchmark.is_finished(spec)
    hyperparams = {"n_timesteps": "1000.0", **benchmark.expected_hyperparams(spec)}
    benchmark.write_atomic(spec.marker_path, json.dumps({"budget": spec.budget(), "hyperparams": hyperparams}))
    assert benchmark.is_finished(spec)
    longer = benchmark.RunSpec("Pendulum-v1", "ppo", 0, 2000, 500, 2, str(tmp_path))
    assert not benchmark.is_finished(longer)


def test_run_with_changed_settings_is_not_finished(tmp_path, monkeypatch):
    """A run recorded with other settings than the yml entry (plus overrides) has now is rerun."""
    spec = benchmark.RunSpec("Pendulum-v1", "ppo_ext_kl", 0, 1000, 500, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text(",".join(benchmark.CSV_FIELDS) + "\n")
    expected = benchmark.expected_hyperparams(spec)
    # The shipped Pendulum entry with the KL variant's overrides, as rl-zoo3 records them.
    assert expected["kl_coef"] == "1.0" and expected["clip_range"] == "None" and expected["n_envs"] == "4"
    marker = {"budget": spec.budget(), "hyperparams": {**expected, "n_timesteps": "100000.0"}}
    benchmark.write_atomic(spec.marker_path, json.dumps(marker))
    assert benchmark.is_finished(spec)
    for changed in ({**expected, "learning_rate": "0.0003"}, {**expected, "extra": "1"}, {}):
        benchmark.write_atomic(spec.marker_path, json.dumps({**marker, "hyperparams": changed}))
        assert not benchmark.is_finished(spec), changed
    # The entry itself changes (as when it is tuned): the recorded run is stale.
    benchmark.write_atomic(spec.marker_path, json.dumps(marker))
    import sb3_ppo_ext.hyperparams as hp

    tuned = tmp_path / "tuned.yml"
    tuned.write_text("Pendulum-v1:\n  policy: 'MlpPolicy'\n  n_envs: 8\n")
    monkeypatch.setattr(hp, "PPO_EXT_YML", tuned)
    monkeypatch.setattr(hp.load_hyperparams, "__defaults__", (tuned, *hp.load_hyperparams.__defaults__[1:]))
    assert benchmark.expected_hyperparams(spec)["n_envs"] == "8"
    assert not benchmark.is_finished(spec)


def test_suite_matrix_gives_every_algorithm_the_same_seeds_and_budget():
    args = benchmark.parse_args(["--suite", "issue"])
    specs = benchmark.build_matrix(args)
    for env in ("Pendulum-v1", "LunarLanderContinuous-v3", "Hopper-v5", "HalfCheetah-v5"):
        by_algo = {}
        for spec in specs:
            if spec.env == env:
                by_algo.setdefault(spec.algo, []).append((spec.seed, spec.steps, spec.eval_freq, spec.eval_episodes))
        assert set(by_algo) == set(benchmark.SUITE_300K)
        assert len({tuple(runs) for runs in by_algo.values()}) == 1
    pendulum = [spec for spec in specs if spec.env == "Pendulum-v1"]
    assert len(pendulum) == 4 * 5 and {spec.steps for spec in pendulum} == {100_000}
    assert all(spec.steps >= 300_000 and spec.seed < 3 for spec in specs if spec.env != "Pendulum-v1")


@pytest.mark.parametrize("zoo_algo", ["ppo", "trpo"])
def test_zoo_algorithms_use_the_v4_entry_of_rl_zoo3_for_v5_envs(tmp_path, zoo_algo):
    import rl_zoo3

    zoo_entries = yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{zoo_algo}.yml").read_text())
    path, source = benchmark._zoo_config(zoo_algo, "Hopper-v5", str(tmp_path))
    assert yaml.safe_load(Path(path).read_text()) == {"Hopper-v5": zoo_entries["Hopper-v4"]}
    assert f"{zoo_algo}.yml: Hopper-v4" in source
    assert benchmark._zoo_config(zoo_algo, "Pendulum-v1", str(tmp_path)) == (
        None,
        f"rl_zoo3/hyperparams/{zoo_algo}.yml: Pendulum-v1",
    )


def test_mujoco_1m_suite_runs_the_issues_algorithms_on_the_same_seeds():
    specs = benchmark.build_matrix(benchmark.parse_args(["--suite", "mujoco-1m"]))
    hopper = [spec for spec in specs if spec.env == "Hopper-v5"]
    walker = [spec for spec in specs if spec.env == "Walker2d-v5"]
    assert {spec.algo for spec in hopper} == {"ppo", "trpo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_tanh"}
    assert len(hopper) == 5 * 5 and len(walker) == 3 * 3
    assert {spec.steps for spec in specs} == {1_000_000} and {spec.eval_freq for spec in specs} == {20_000}
    # --algos narrows a suite; an env keeps its own limit.
    narrowed = benchmark.build_matrix(benchmark.parse_args(["--suite", "mujoco-1m", "--algos", "ppo_ext_kl"]))
    assert {(spec.env, spec.algo) for spec in narrowed} == {("Hopper-v5", "ppo_ext_kl")}


def test_tanh_variant_changes_only_the_activation():
    from sb3_ppo_ext.hyperparams import load_hyperparams

    shipped = load_hyperparams("Hopper-v5")["policy_kwargs"]
    merged = benchmark._zoo_overrides("Hopper-v5", benchmark.ALGOS["ppo_ext_tanh"][1])
    assert merged == {"policy_kwargs": {**shipped, "activation_fn": "tanh"}}


def test_gaussian_variant_keeps_the_shipped_policy_kwargs():
    from sb3_ppo_ext.hyperparams import load_hyperparams

    shipped = load_hyperparams("Hopper-v5")["policy_kwargs"]
    merged = benchmark._zoo_overrides("Hopper-v5", benchmark.ALGOS["ppo_ext_gauss"][1])
    assert merged["policy_kwargs"] == {**shipped, "squash_output": False}
    assert benchmark._zoo_overrides("Pendulum-v1", benchmark.ALGOS["ppo_ext_gauss"][1]) == {
        "policy_kwargs": {"squash_output": False}
    }


# --- the report ---------------------------------------------------------------------------------


def test_iqm_by_hand():
    assert report.iqm(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == pytest.approx(3.0)  # mean of the middle 3
    assert report.iqm(np.array([100.0, 1.0, 3.0, 2.0])) == pytest.approx(2.5)  # mean of 2 and 3
    assert report.iqm(np.array([1.0, 2.0, 6.0])) == pytest.approx(3.0)  # 3 values: nothing trimmed


def _write_fixture_run(results: Path, algo: str, seed: int, returns: list[float], fps: float) -> None:
    stem = results / "Pendulum-v1" / algo / f"seed{seed}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    timesteps = [0, 10_000, 20_000, 30_000][: len(returns)]
    with open(stem.with_suffix(".csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(benchmark.CSV_FIELDS)
        for step, value in zip(timesteps, returns, strict=True):
            writer.writerow([step, value, 10.0, 10, step / fps, fps])
    marker = {
        "env": "Pendulum-v1",
        "algo": algo,
        "description": f"{algo} fixture",
        "seed": seed,
        "budget": {"steps": 30_000, "eval_freq": 10_000, "eval_episodes": 10, "device": "cpu"},
        "timesteps": timesteps[-1],
        "final_mean_return": returns[-1],
        "train_time_s": timesteps[-1] / fps,
        "total_wall_time_s": timesteps[-1] / fps + 5,
        "env_steps_per_s": fps,
        "hyperparams_source": "fixture",
        "overrides": {},
        "hyperparams": {},
        "n_envs": 4,
        "normalize": False,
        "versions": {"stable_baselines3": "x"},
        "cpu_count": 2,
    }
    stem.with_suffix(".done.json").write_text(json.dumps(marker))


STOCK_FINALS = [-300.0, -200.0, -150.0, -1000.0, -180.0]  # IQM: mean(-300, -200, -180) = -226.67
EXT_FINALS = [-140.0, -160.0, -150.0, -145.0, -500.0]  # IQM: mean(-160, -150, -145) = -151.67


@pytest.fixture
def fixture_results(tmp_path):
    results = tmp_path / "results"
    for seed, final in enumerate(STOCK_FINALS):
        _write_fixture_run(results, "ppo", seed, [-1200.0, -800.0, -400.0 + seed, final], fps=1000.0)
    for seed, final in enumerate(EXT_FINALS):
        # seeds 0-3 cross -200 at 20k, seed 4 never does
        second = -190.0 if seed < 4 else -600.0
        _write_fixture_run(results, "ppo_ext_clip", seed, [-1200.0, -700.0, second, final], fps=900.0)
    # An unfinished run (no marker) is left out.
    (results / "Pendulum-v1" / "ppo_ext_kl").mkdir()
    (results / "Pendulum-v1" / "ppo_ext_kl" / "seed0.csv").write_text(",".join(benchmark.CSV_FIELDS) + "\n0,-1,0,10,0,0\n")
    return results


def test_report_statistics_from_fixture_csvs(fixture_results):
    runs = report.load_runs(fixture_results)
    assert list(runs["Pendulum-v1"]) == ["ppo", "ppo_ext_clip"]
    stock = report.summarize("ppo", runs["Pendulum-v1"]["ppo"], -200.0)
    ext = report.summarize("ppo_ext_clip", runs["Pendulum-v1"]["ppo_ext_clip"], -200.0)
    assert stock.iqm == pytest.approx((-300 - 200 - 180) / 3)
    assert ext.iqm == pytest.approx((-160 - 150 - 145) / 3)
    assert stock.mean == pytest.approx(np.mean(STOCK_FINALS))
    assert ext.threshold_steps == [20_000] * 4 + [float("inf")]
    assert ext.median_threshold_steps == 20_000
    assert stock.median_threshold_steps == 30_000  # -150 and -180 cross at 30k; -200 counts as reached
    assert stock.fps == pytest.approx(1000.0) and stock.wall_s == pytest.approx(35.0)
    # The bootstrap CI agrees with a plain numpy percentile bootstrap of the IQM.
    rng = np.random.default_rng(1)
    for summary, finals in ((stock, STOCK_FINALS), (ext, EXT_FINALS)):
        samples = np.sort(rng.choice(finals, size=(20_000, 5), replace=True), axis=1)[:, 1:4].mean(axis=1)
        low, high = np.percentile(samples, [2.5, 97.5])
        assert summary.ci[0] == pytest.approx(low, abs=15) and summary.ci[1] == pytest.approx(high, abs=15)
        assert min(finals) <= summary.ci[0] <= summary.iqm <= summary.ci[1] <= max(finals)
    assert report.bootstrap_ci(np.array(STOCK_FINALS)) == report.bootstrap_ci(np.array(STOCK_FINALS))  # seeded


def test_report_builds_markdown_figures_and_targets(fixture_results, tmp_path):
    throughput = {
        "env": "Pendulum-v1",
        "steps": 8192,
        "repeats": 7,
        "n_envs": 4,
        "hyperparams": {"n_steps": 512},
        "machine": {"cpu_count": 2},
        "measured_at": "2026-11-30T00:00:00Z",
        "variants": {
            name: {
                "kwargs": "{}",
                "fps": [1.0],
                "median": 1000 * ratio,
                "best": 1000 * ratio,
                "ratio_of_medians": ratio,
                "ratio_of_bests": ratio,
            }
            for name, ratio in (("stock PPO", 1.0), ("PPOExt, squash off", 1.01), ("PPOExt, squash on", 0.89))
        },
    }
    throughput_path = tmp_path / "throughput.json"
    throughput_path.write_text(json.dumps(throughput))
    out = tmp_path / "docs" / "BENCHMARKS.md"
    data = tmp_path / "docs" / "benchmarks" / "data"
    argv = ["--results", str(fixture_results), "--out", str(out), "--figures", str(tmp_path / "docs" / "benchmarks")]
    assert report.main([*argv, "--keep-data", str(data), "--throughput", str(throughput_path)]) == 0
    text = out.read_text()
    assert (tmp_path / "docs" / "benchmarks" / "Pendulum-v1.png").stat().st_size > 10_000
    assert "![Pendulum-v1 learning curves](benchmarks/Pendulum-v1.png)" in text
    assert "| `ppo` | 5 | 30000 | -366.0 ± " in text and "| -226.7 | [" in text
    assert "| `ppo_ext_clip` | 5 | 30000 |" in text and "| -151.7 | [" in text
    assert "20k (4/5 seeds: 20k, 20k, 20k, 20k, never)" in text
    assert "| 35 s | 1000 |" in text
    # Targets: Pendulum met by +75.0; the other suite envs not measured; throughput met / missed.
    assert "| Pendulum-v1 (`ppo_ext_clip`) | met | -151.7 vs -226.7 (+75.0) |" in text
    assert "| Hopper-v5 | not measured yet |" in text
    assert "not measured yet (1 of 4 envs run)" in text
    assert "| PPOExt, squash off (all diagnostics on) | met | 1.010 (ratio of medians, +0.030)" in text
    assert "| PPOExt, squash on (all diagnostics on) | **missed** | 0.890 (ratio of medians, -0.060)" in text
    assert "| Pendulum-v1 | 100k steps x 5 seeds | 30k steps;" in text and "**partial**" in text
    assert "| LunarLanderContinuous-v3 | 300k steps x 3 seeds | — | **not run** |" in text
    assert "Not run: no CUDA machine" in text
    # The inputs are kept beside the report, and the report rebuilds from them alone.
    assert sorted(p.name for p in (data / "Pendulum-v1" / "ppo").iterdir())[:2] == ["seed0.csv", "seed0.done.json"]
    rebuilt = tmp_path / "rebuilt.md"
    assert (
        report.main(["--results", str(data), "--out", str(rebuilt), "--figures", str(tmp_path / "fig"), "--keep-data", ""])
        == 0
    )
    assert "| -226.7 | [" in rebuilt.read_text()


def test_report_without_runs_fails(tmp_path, capsys):
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "r.md"), "--keep-data", ""]) == 1
    assert "no finished runs" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r.md")


def test_throughput_verdict_needs_medians_and_best_runs_to_agree():
    lines = report.targets_section(
        "pendulum", {}, {"PPOExt, squash on": 1.02, "PPOExt, squash on (best)": 0.93, "PPOExt, squash off": 0.99}
    )
    text = "\n".join(lines)
    assert "| PPOExt, squash on (all diagnostics on) | inconclusive (medians and best runs disagree) | 1.020" in text
    assert "| PPOExt, squash off (all diagnostics on) | met | 0.990" in text
    assert "| Pendulum-v1 | not measured yet |" in text


def test_report_lists_tuned_entries(tmp_path):
    yml = tmp_path / "ppo_ext.yml"
    yml.write_text(
        "# --- a section comment ---\n\n"
        "Pendulum-v1:\n  n_envs: 4\n\n"
        "# Tuned: best of 12 complete trials of study 'llc': trial 7, 231.0\n"
        "#   study command: python -m rl_zoo3.train --algo ppo_ext -optimize\n"
        "LunarLanderContinuous-v3:\n  n_envs: 16\n  policy_kwargs:\n    net_arch: [64]\n"
        "# Tuned but not right above an entry\n\nHopper-v5:\n  n_envs: 1\n"
    )
    assert report.tuned_comments(yml) == {
        "LunarLanderContinuous-v3": [
            "Tuned: best of 12 complete trials of study 'llc': trial 7, 231.0",
            "study command: python -m rl_zoo3.train --algo ppo_ext -optimize",
        ]
    }
    lines = report.tuning_section("issue", yml)
    assert (
        "| LunarLanderContinuous-v3 | Tuned: best of 12 complete trials of study 'llc': trial 7, 231.0<br>study command:"
        in ("\n".join(lines))
    )
    assert "| Hopper-v5 | not tuned" in "\n".join(lines) and "| Pendulum-v1 | not tuned" in "\n".join(lines)


def test_source_revision(tmp_path):
    assert benchmark.source_revision(tmp_path) is None  # not a git checkout
    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the tests do not run from a git checkout")
    assert benchmark.source_revision(repo / "sb3_ppo_ext").split("+")[0] == head.stdout.strip()


def test_report_names_a_variant_that_reproduced_stock_ppo(fixture_results, tmp_path):
    """A variant whose evaluations equal stock PPO's seed for seed is a tie, and the report says so."""
    for seed, final in enumerate(STOCK_FINALS):
        _write_fixture_run(fixture_results, "ppo_ext_gauss", seed, [-1200.0, -800.0, -400.0 + seed, final], fps=1000.0)
    # The same returns but one seed's final evaluation 1.0 lower: not identical (IQM -227.0).
    for seed, final in enumerate(STOCK_FINALS):
        returns = [-1200.0, -800.0, -400.0 + seed, final - (seed == 1)]
        _write_fixture_run(fixture_results, "ppo_ext_kl", seed, returns, fps=1000.0)
    runs = report.load_runs(fixture_results)
    assert report.identical_to_stock(runs) == {("Pendulum-v1", "ppo_ext_gauss")}
    # Fewer seeds than stock PPO, each identical: still the same training.
    fewer = {"Pendulum-v1": {"ppo": runs["Pendulum-v1"]["ppo"], "ppo_ext_gauss": runs["Pendulum-v1"]["ppo_ext_gauss"][:2]}}
    assert report.identical_to_stock(fewer) == {("Pendulum-v1", "ppo_ext_gauss")}
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--figures", str(tmp_path), "--keep-data", ""]
    assert report.main(argv) == 0
    text = out.read_text()
    assert "| `ppo_ext_gauss` (= stock PPO: every evaluation of each of its seeds identical) | 5 |" in text
    assert "| `ppo_ext_kl` | 5 |" in text
    # ppo_ext_clip is best here; with it gone, the tie is named and the best other variant given.
    shutil.rmtree(fixture_results / "Pendulum-v1" / "ppo_ext_clip")
    assert report.main(argv) == 0
    text = out.read_text()
    assert (
        "| Pendulum-v1 (`ppo_ext_gauss`) | met (a tie: this variant is stock PPO bit for bit) | -226.7 vs -226.7 (+0.0); "
        "best variant that trains differently: `ppo_ext_kl` -227.0 (-0.3) |"
    ) in text


def test_report_keeps_timings_of_different_machines_apart(fixture_results, tmp_path):
    """Runs from two machines: a column says where each row ran, and no throughput ratio crosses machines."""
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--figures", str(tmp_path), "--keep-data", ""]
    assert report.main(argv) == 0
    one_machine = out.read_text()
    assert "Machine: 2 CPU cores; stable_baselines3 x." in one_machine and "| machine |" not in one_machine
    assert "| 0.90 (same settings but the variant) |" in one_machine
    for marker_path in (fixture_results / "Pendulum-v1" / "ppo_ext_clip").glob("*.done.json"):
        marker = json.loads(marker_path.read_text())
        marker["cpu_count"], marker["versions"] = 16, {"stable_baselines3": "x", "torch": "y"}
        marker_path.write_text(json.dumps(marker))
    assert report.main(argv) == 0
    text = out.read_text()
    assert "**A**: 2 CPU cores; stable_baselines3 x; **B**: 16 CPU cores; stable_baselines3 x, torch y." in text
    assert "| 35 s | 1000 | — | A |" in text
    assert "| 900 | — (ran on another machine than stock PPO) | B |" in text
    # Returns are compared across machines as before (the target does not depend on timings).
    assert "| Pendulum-v1 (`ppo_ext_clip`) | met | -151.7 vs -226.7 (+75.0) |" in text


def test_run_lock_keeps_a_second_writer_out_of_a_running_run(tmp_path, capsys):
    """While one process runs a spec, another one neither trains it nor touches its files."""
    spec = benchmark.RunSpec("Pendulum-v1", "ppo", 0, 2048, 1024, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text("evaluations of the running run\n")
    spec.marker_path.write_text("{}")
    with benchmark.run_lock(spec):
        with pytest.raises(benchmark.RunInProgressError, match=rf"Pendulum-v1 ppo seed 0 is being run .*pid {os.getpid()}"):
            benchmark.run_one(spec)
        # The matrix reports it and moves on (the marker is not a finished one: "{}" has no budget).
        assert benchmark.run_matrix([spec], workers=1) == 1
        assert "SKIPPED Pendulum-v1 ppo seed 0" in capsys.readouterr().out
    assert spec.csv_path.read_text() == "evaluations of the running run\n" and spec.marker_path.read_text() == "{}"
    assert not spec.csv_path.with_suffix(".csv.tmp").exists()
    # The lock went with its holder: a lock file left behind (a killed run) does not block.
    with benchmark.run_lock(spec):
        pass


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads worker pids from /proc")
@pytest.mark.integration  # SIGKILL of a benchmark process
def test_workers_exit_when_the_benchmark_process_is_killed(tmp_path):
    """A SIGKILLed benchmark leaves no worker behind that would go on writing its run's files."""
    out = tmp_path / "results"
    command = [
        sys.executable,
        str(SCRIPTS / "benchmark.py"),
        *("--envs", "Pendulum-v1", "--algos", "ppo", "--seeds", "1", "--steps", "1000000"),
        *("--eval-freq", "100000", "--eval-episodes", "2", "--workers", "1", "--out", str(out)),
    ]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "Pendulum-v1" / "ppo" / "seed0.log"
    deadline = time.monotonic() + 120
    while not log.is_file() and time.monotonic() < deadline:  # the worker has started the run
        time.sleep(0.2)
    assert log.is_file()

    def children() -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent.pid:
                    pids.append(int(stat.parent.name))
        return pids

    workers = children()
    assert workers
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid)]
    assert not alive, f"workers {alive} outlived the killed benchmark"
    assert not (out / "Pendulum-v1" / "ppo" / "seed0.done.json").exists()


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_report_refuses_a_corrupt_csv(fixture_results, tmp_path, capsys):
    """Rows of two writers interleaved (steps out of order, a torn line): an error naming the file, no report."""
    csv_path = fixture_results / "Pendulum-v1" / "ppo" / "seed1.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([lines[0], lines[1], lines[3], lines[2], *lines[4:]]) + "\n")
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--figures", str(tmp_path), "--keep-data", ""]
    assert report.main(argv) == 1
    assert f"{csv_path}: evaluation steps are not increasing: [0, 20000, 10000, 30000]" in capsys.readouterr().err
    csv_path.write_text("\n".join([lines[0], lines[1], "19.7277,10,840.270,190.4", *lines[2:]]) + "\n")
    assert report.main(argv) == 1
    assert f"{csv_path}: not a readable benchmark CSV" in capsys.readouterr().err
    assert not out.exists()
