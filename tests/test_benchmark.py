"""The benchmarks package (scripts/benchmarks: the matrix, CSVs, done markers, resume; statistics, report) and its CLIs."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import benchmark as benchmark_cli  # scripts/benchmark.py (pyproject's pytest pythonpath: scripts/)
import benchmark_report as report_cli  # scripts/benchmark_report.py
import numpy as np
import pytest
import yaml
from benchmarks import checkpoints, entries, records, report, runner, sections, stats, suites, targets


def test_changed_budget_is_not_finished(tmp_path):
    spec = records.RunSpec("Pendulum-v1", "ppo", 0, 1000, 500, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text(",".join(records.CSV_FIELDS) + "\n")
    assert not runner.is_finished(spec)
    hyperparams = {"n_timesteps": "1000.0", **entries.expected_hyperparams(spec)}
    records.write_atomic(spec.marker_path, json.dumps({"budget": spec.budget(), "hyperparams": hyperparams}))
    assert runner.is_finished(spec)
    longer = records.RunSpec("Pendulum-v1", "ppo", 0, 2000, 500, 2, str(tmp_path))
    assert not runner.is_finished(longer)


def test_the_runner_and_the_report_name_a_run_s_files_alike(tmp_path):
    """One definition of the done marker: where the runner writes it is where the report finds it, keys in order."""
    spec = records.RunSpec("Pendulum-v1", "ppo", 3, 1000, 500, 2, str(tmp_path))
    assert spec.marker_path == tmp_path / "Pendulum-v1" / "ppo" / "seed3.done.json"
    assert records.csv_path_of(spec.marker_path) == spec.csv_path
    spec.stem.parent.mkdir(parents=True)
    with pytest.raises(ValueError, match="a done marker has the keys"):
        records.write_marker(spec.marker_path, {"env": "Pendulum-v1"})
    marker = dict.fromkeys(records.MARKER_KEYS, 0)
    records.write_marker(spec.marker_path, marker)
    assert records.find_markers(tmp_path) == [spec.marker_path]
    assert list(records.read_marker(spec.marker_path)) == list(records.MARKER_KEYS)


def test_run_with_changed_settings_is_not_finished(tmp_path, monkeypatch):
    """A run recorded with other settings than the yml entry (plus overrides) has now is rerun."""
    spec = records.RunSpec("Pendulum-v1", "ppo_ext_kl", 0, 1000, 500, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text(",".join(records.CSV_FIELDS) + "\n")
    expected = entries.expected_hyperparams(spec)
    # The shipped Pendulum entry with the KL variant's overrides, as rl-zoo3 records them.
    assert expected["kl_coef"] == "1.0" and expected["clip_range"] == "None" and expected["n_envs"] == "4"
    marker = {"budget": spec.budget(), "hyperparams": {**expected, "n_timesteps": "100000.0"}}
    records.write_atomic(spec.marker_path, json.dumps(marker))
    assert runner.is_finished(spec)
    for changed in ({**expected, "learning_rate": "0.0003"}, {**expected, "extra": "1"}, {}):
        records.write_atomic(spec.marker_path, json.dumps({**marker, "hyperparams": changed}))
        assert not runner.is_finished(spec), changed
    # The entry itself changes (as when it is tuned): the recorded run is stale.
    records.write_atomic(spec.marker_path, json.dumps(marker))
    import sb3_ppo_ext.hyperparams as hp

    tuned = tmp_path / "tuned.yml"
    tuned.write_text("Pendulum-v1:\n  policy: 'MlpPolicy'\n  n_envs: 8\n")
    monkeypatch.setattr(hp, "PPO_EXT_YML", tuned)
    monkeypatch.setattr(hp.load_hyperparams, "__defaults__", (tuned, *hp.load_hyperparams.__defaults__[1:]))
    from sb3_ppo_ext import settings

    monkeypatch.setitem(settings.ALGORITHMS, "ppo_ext", dataclasses.replace(settings.ALGORITHMS["ppo_ext"], hyperparams=tuned))
    assert entries.expected_hyperparams(spec)["n_envs"] == "8"
    assert not runner.is_finished(spec)


def test_suite_matrix_gives_every_algorithm_the_same_seeds_and_budget():
    args = benchmark_cli.parse_args(["--suite", "300k"])
    assert args.out == "logs/benchmark/300k"
    assert benchmark_cli.parse_args(["--envs", "Pendulum-v1"]).out == "logs/benchmark/envs"
    specs = runner.build_matrix(args)
    for env in ("Pendulum-v1", "LunarLanderContinuous-v3", "Hopper-v5", "HalfCheetah-v5"):
        by_algo = {}
        for spec in specs:
            if spec.env == env:
                by_algo.setdefault(spec.algo, []).append((spec.seed, spec.steps, spec.eval_freq, spec.eval_episodes))
        assert set(by_algo) == set(suites.SUITE_300K)
        assert len({tuple(runs) for runs in by_algo.values()}) == 1
    pendulum = [spec for spec in specs if spec.env == "Pendulum-v1"]
    assert len(pendulum) == 4 * 5 and {spec.steps for spec in pendulum} == {100_000}
    assert all(spec.steps >= 300_000 and spec.seed < 3 for spec in specs if spec.env != "Pendulum-v1")


@pytest.mark.parametrize("zoo_algo", ["ppo", "trpo"])
def test_zoo_algorithms_use_the_v4_entry_of_rl_zoo3_for_v5_envs(tmp_path, zoo_algo):
    import rl_zoo3

    zoo_entries = yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{zoo_algo}.yml").read_text())
    path, source = entries.zoo_config(zoo_algo, "Hopper-v5", str(tmp_path))
    assert yaml.safe_load(Path(path).read_text()) == {"Hopper-v5": zoo_entries["Hopper-v4"]}
    assert f"{zoo_algo}.yml: Hopper-v4" in source
    assert entries.zoo_config(zoo_algo, "Pendulum-v1", str(tmp_path)) == (
        None,
        f"rl_zoo3/hyperparams/{zoo_algo}.yml: Pendulum-v1",
    )


def test_mujoco_1m_suite_runs_its_algorithms_on_the_same_seeds():
    specs = runner.build_matrix(benchmark_cli.parse_args(["--suite", "mujoco-1m"]))
    hopper = [spec for spec in specs if spec.env == "Hopper-v5"]
    walker = [spec for spec in specs if spec.env == "Walker2d-v5"]
    assert {spec.algo for spec in hopper} == {"ppo", "trpo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_tanh"}
    assert len(hopper) == 5 * 5 and len(walker) == 3 * 3
    assert {spec.steps for spec in specs} == {1_000_000} and {spec.eval_freq for spec in specs} == {20_000}
    # --algos narrows a suite; an env keeps its own limit.
    narrowed = runner.build_matrix(benchmark_cli.parse_args(["--suite", "mujoco-1m", "--algos", "ppo_ext_kl"]))
    assert {(spec.env, spec.algo) for spec in narrowed} == {("Hopper-v5", "ppo_ext_kl")}


def _candidate_file(path: Path, **changes) -> Path:
    """A candidate yml as zoo_study.py best writes it: the shipped Hopper-v5 entry with ``changes``."""
    from sb3_ppo_ext.hyperparams import load_hyperparams

    path.write_text(
        "# Tuned: a test candidate\n"
        + yaml.safe_dump({"Hopper-v5": {**load_hyperparams("Hopper-v5"), **changes}}, sort_keys=False)
    )
    return path


def test_tuned_suite_runs_the_candidate_beside_the_shipped_entry_on_fresh_seeds(tmp_path):
    candidate = _candidate_file(tmp_path / "candidates.yml", n_epochs=20, clip_range=0.3)
    out = str(tmp_path / "results")
    specs = runner.build_matrix(benchmark_cli.parse_args(["--suite", "tuned-1m", "--candidate", str(candidate), "--out", out]))
    assert {(spec.env, spec.algo) for spec in specs} == {("Hopper-v5", "ppo_ext_clip"), ("Hopper-v5", "ppo_ext_tuned")}
    # Seeds 100-104 for both: none of them seeded the study's envs; 1M steps, evaluations every 20k.
    assert sorted(spec.seed for spec in specs if spec.algo == "ppo_ext_tuned") == [100, 101, 102, 103, 104]
    assert sorted(spec.seed for spec in specs if spec.algo == "ppo_ext_clip") == [100, 101, 102, 103, 104]
    assert {(spec.steps, spec.eval_freq) for spec in specs} == {(1_000_000, 20_000)}
    assert {spec.candidate for spec in specs if spec.algo == "ppo_ext_tuned"} == {str(candidate.resolve())}
    assert {spec.candidate for spec in specs if spec.algo == "ppo_ext_clip"} == {None}
    tuned = next(spec for spec in specs if spec.algo == "ppo_ext_tuned")
    shipped = next(spec for spec in specs if spec.algo == "ppo_ext_clip")
    assert entries.expected_hyperparams(tuned) == {
        **entries.expected_hyperparams(shipped),
        "n_epochs": "20",
        "clip_range": "0.3",
    }
    # A recorded candidate run is stale once the candidate's entry changes: rerun, not mixed.
    tuned.stem.parent.mkdir(parents=True)
    tuned.csv_path.write_text(",".join(records.CSV_FIELDS) + "\n")
    marker = {"budget": tuned.budget(), "hyperparams": entries.expected_hyperparams(tuned)}
    records.write_atomic(tuned.marker_path, json.dumps(marker))
    fingerprint = checkpoints.run_fingerprint(tuned)
    assert runner.is_finished(tuned)
    _candidate_file(candidate, n_epochs=10, clip_range=0.3)
    assert not runner.is_finished(tuned) and checkpoints.run_fingerprint(tuned) != fingerprint
    # --first-seed still moves the seeds.
    moved = runner.build_matrix(
        benchmark_cli.parse_args(
            ["--suite", "tuned-1m", "--candidate", str(candidate), "--out", out, "--first-seed", "7", "--seeds", "1"]
        )
    )
    assert {spec.seed for spec in moved} == {7}


def test_candidate_mistakes_fail_before_any_run(tmp_path):
    def matrix(*argv: str):
        return runner.build_matrix(benchmark_cli.parse_args(list(argv)))

    # No candidate: the variant is left out by default and refused by name.
    assert "ppo_ext_tuned" not in {spec.algo for spec in matrix("--envs", "Pendulum-v1")}
    with pytest.raises(SystemExit, match="--algos ppo_ext_tuned needs --candidate FILE"):
        matrix("--envs", "Pendulum-v1", "--algos", "ppo_ext_tuned")
    with pytest.raises(SystemExit, match=r"candidate file .*nosuch.yml: cannot read it as yml"):
        matrix("--suite", "tuned-1m", "--candidate", str(tmp_path / "nosuch.yml"))
    other = tmp_path / "other.yml"
    other.write_text("Pendulum-v1:\n  n_envs: 2\n")
    with pytest.raises(SystemExit, match=r"no entry \(a mapping\) for Hopper-v5; found \['Pendulum-v1'\]"):
        matrix("--suite", "tuned-1m", "--candidate", str(other))
    # A candidate no run of the matrix uses is a mistake too, not silently ignored.
    with pytest.raises(SystemExit, match="is only used by ppo_ext_tuned, which this matrix does not run"):
        matrix("--suite", "mujoco-1m", "--candidate", str(other))


def test_tanh_variant_changes_only_the_activation():
    from sb3_ppo_ext.hyperparams import load_hyperparams

    shipped = load_hyperparams("Hopper-v5")["policy_kwargs"]
    merged = entries.zoo_overrides("Hopper-v5", suites.ALGOS["ppo_ext_tanh"][1])
    assert merged == {"policy_kwargs": {**shipped, "activation_fn": "tanh"}}


def test_gaussian_variant_keeps_the_shipped_policy_kwargs_but_the_squashed_heads():
    from sb3_ppo_ext import PPOExt
    from sb3_ppo_ext.hyperparams import load_hyperparams
    from sb3_ppo_ext.validation import to_algorithm_kwargs

    # The tuned Hopper-v5 entry sets the squashed head's entropy estimator, which a Gaussian head rejects.
    shipped = load_hyperparams("Hopper-v5")["policy_kwargs"]
    assert "entropy_estimator" in shipped
    merged = entries.zoo_overrides("Hopper-v5", suites.ALGOS["ppo_ext_gauss"][1])
    without = {key: value for key, value in shipped.items() if key != "entropy_estimator"}
    assert merged["policy_kwargs"] == {**without, "squash_output": False}
    # ... and the merged settings build (without the drop, the 300k Hopper runs failed at construction).
    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, **to_algorithm_kwargs(merged))
    assert not model.policy.squash_output
    with pytest.raises(ValueError, match="entropy_estimator='sample' only applies to the squashed head"):
        PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs={**shipped, "squash_output": False})
    assert entries.zoo_overrides("Pendulum-v1", suites.ALGOS["ppo_ext_gauss"][1]) == {
        "policy_kwargs": {"squash_output": False}
    }


def test_heads_suite_runs_the_three_heads_on_the_same_seeds_and_budgets():
    """The three heads everywhere; where the shipped entry uses gSDE (Pendulum-v1), the Gaussian heads without it too."""
    specs = runner.build_matrix(benchmark_cli.parse_args(["--suite", "heads"]))
    budgets = {"Pendulum-v1": 100_000, "MountainCarContinuous-v0": 20_000, "LunarLanderContinuous-v3": 300_000}
    heads = {"ppo_ext_gauss", "ppo_ext_clip", "ppo_ext_beta"}
    assert {spec.env for spec in specs} == set(budgets)
    for env, steps in budgets.items():
        runs: dict[str, list] = {}
        for spec in specs:
            if spec.env == env:
                runs.setdefault(spec.algo, []).append((spec.seed, spec.steps, spec.eval_freq, spec.eval_episodes))
        nosde = {"ppo_ext_gauss_nosde", "ppo_ext_clip_nosde"} if env == "Pendulum-v1" else set()
        assert set(runs) == heads | nosde
        assert len({tuple(r) for r in runs.values()}) == 1  # the same seeds and budget for every head
        assert sorted(seed for seed, *_ in runs["ppo_ext_beta"]) == list(range(10))
        assert {r[1] for r in runs["ppo_ext_beta"]} == {steps}


def test_gaussian_heads_without_gsde_change_only_the_noise_model():
    from sb3_ppo_ext.hyperparams import load_hyperparams

    assert load_hyperparams("Pendulum-v1")["use_sde"] is True  # why Pendulum-v1 has these rows
    assert entries.zoo_overrides("Pendulum-v1", suites.ALGOS["ppo_ext_clip_nosde"][1]) == {"use_sde": False}
    assert entries.zoo_overrides("Pendulum-v1", suites.ALGOS["ppo_ext_gauss_nosde"][1]) == {
        "use_sde": False,
        "policy_kwargs": {"squash_output": False},
    }


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "LunarLanderContinuous-v3", "Hopper-v5"])
def test_beta_variant_keeps_the_shipped_settings_but_the_gaussian_heads(env_id):
    from sb3_ppo_ext import PPOExt
    from sb3_ppo_ext.hyperparams import load_hyperparams
    from sb3_ppo_ext.validation import to_algorithm_kwargs

    shipped = load_hyperparams(env_id).get("policy_kwargs") or {}
    merged = entries.zoo_overrides(env_id, suites.ALGOS["ppo_ext_beta"][1])
    kept = {key: value for key, value in shipped.items() if key not in suites.GAUSSIAN_HEAD_ONLY}
    assert merged == {"use_sde": False, "policy_kwargs": {**kept, "action_dist": "beta"}}
    # The merged settings build with the Beta head (the shipped log_std_init / gSDE would be rejected).
    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64, **to_algorithm_kwargs(merged))
    assert model.policy.action_dist_name == "beta" and not model.use_sde
    if "log_std_init" in shipped:
        with pytest.raises(ValueError, match=r"is invalid with policy_kwargs\.action_dist='beta'"):
            PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs={**shipped, "action_dist": "beta"})


# --- the report ---------------------------------------------------------------------------------


@pytest.fixture
def fast_rliable(rliable_stats, monkeypatch):
    """Fewer bootstrap resamples, for tests that check the report's text rather than its intervals."""
    monkeypatch.setattr(stats, "IQM_REPS", 200)
    monkeypatch.setattr(stats, "IMPROVEMENT_REPS", 100)
    monkeypatch.setattr(stats, "PROFILE_REPS", 100)


def _iqm(values: list[float]) -> float:
    return stats.iqm_with_ci(values)[0]


def test_iqm_by_hand(fast_rliable):
    """rliable's IQM is the mean of the middle 50 % of the runs."""
    assert _iqm([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(3.0)  # 5 runs: mean of the middle 3
    assert _iqm([100.0, 1.0, 3.0, 2.0]) == pytest.approx(2.5)  # 4 runs: mean of 2 and 3
    assert _iqm([1.0, 2.0, 6.0]) == pytest.approx(3.0)  # 3 runs: nothing trimmed
    eight = [-50.0, 7.0, 1.0, 900.0, 3.0, 5.0, 2.0, 4.0]  # 8 runs: the middle 4 are 2, 3, 4, 5
    assert _iqm(eight) == pytest.approx((2 + 3 + 4 + 5) / 4)


def _mann_whitney(x: list[float], y: list[float]) -> float:
    """P(X > Y) by hand: the fraction of pairs in which X's run ends above Y's, ties counting one half."""
    return sum((a > b) + 0.5 * (a == b) for a in x for b in y) / (len(x) * len(y))


def test_probability_of_improvement_by_hand(rliable_stats, monkeypatch):
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 0.0]  # unequal run counts
    assert _mann_whitney(x, y) == 0.75  # 1 + (1 + 2 x 0.5) + 3 + 3 of 12 pairs
    p, (low, high) = stats.improvement_probability(x, y)
    assert p == pytest.approx(0.75)
    assert 0.0 <= low < p < high <= 1.0
    # The point estimates below do not depend on the resamples (only the interval above is checked): fewer of them.
    monkeypatch.setattr(stats, "IMPROVEMENT_REPS", 100)
    assert stats.improvement_probability(y, x)[0] == pytest.approx(0.25)
    assert stats.improvement_probability(x, x)[0] == 0.5
    # The CI resamples each algorithm's runs on their own: a plain numpy bootstrap of the same statistic agrees.
    rng = np.random.default_rng(3)
    samples = [_mann_whitney(list(rng.choice(x, size=len(x))), list(rng.choice(y, size=len(y)))) for _ in range(4000)]
    expected_low, expected_high = np.percentile(samples, [2.5, 97.5])
    assert low == pytest.approx(expected_low, abs=0.06) and high == pytest.approx(expected_high, abs=0.06)
    # The fixture's final returns: PPOExt ahead of stock PPO in 19.5 of 25 pairs.
    assert stats.improvement_probability(EXT_FINALS, STOCK_FINALS)[0] == pytest.approx(_mann_whitney(EXT_FINALS, STOCK_FINALS))
    assert _mann_whitney(EXT_FINALS, STOCK_FINALS) == 19.5 / 25


def _write_fixture_run(
    results: Path, algo: str, seed: int, returns: list[float], fps: float, env: str = "Pendulum-v1", **marker_fields
) -> None:
    """A finished run's CSV and done marker; ``marker_fields`` are added to (or replace) the marker's."""
    stem = results / env / algo / f"seed{seed}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    timesteps = [0, 10_000, 20_000, 30_000][: len(returns)]
    with open(stem.with_suffix(".csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(records.CSV_FIELDS)
        for step, value in zip(timesteps, returns, strict=True):
            writer.writerow([step, value, 10.0, 10, step / fps, fps])
    marker = {
        "env": env,
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
        **marker_fields,
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
    (results / "Pendulum-v1" / "ppo_ext_kl" / "seed0.csv").write_text(",".join(records.CSV_FIELDS) + "\n0,-1,0,10,0,0\n")
    return results


def test_report_statistics_from_fixture_csvs(fixture_results, rliable_stats):
    runs = records.load_runs(fixture_results)
    assert list(runs["Pendulum-v1"]) == ["ppo", "ppo_ext_clip"]
    stock = stats.summarize("ppo", runs["Pendulum-v1"]["ppo"], -200.0)
    ext = stats.summarize("ppo_ext_clip", runs["Pendulum-v1"]["ppo_ext_clip"], -200.0)
    assert stock.iqm == pytest.approx((-300 - 200 - 180) / 3)
    assert ext.iqm == pytest.approx((-160 - 150 - 145) / 3)
    assert stock.mean == pytest.approx(np.mean(STOCK_FINALS))
    assert ext.threshold_steps == [20_000] * 4 + [float("inf")]
    assert ext.median_threshold_steps == 20_000
    assert stock.median_threshold_steps == 30_000  # -150 and -180 cross at 30k; -200 counts as reached
    assert stock.fps == pytest.approx(1000.0) and stock.wall_s == pytest.approx(35.0)
    # rliable's stratified bootstrap over one task is a bootstrap of the runs: a plain numpy percentile
    # bootstrap of the IQM agrees.
    rng = np.random.default_rng(1)
    for summary, finals in ((stock, STOCK_FINALS), (ext, EXT_FINALS)):
        samples = np.sort(rng.choice(finals, size=(20_000, 5), replace=True), axis=1)[:, 1:4].mean(axis=1)
        low, high = np.percentile(samples, [2.5, 97.5])
        assert summary.ci[0] == pytest.approx(low, abs=15) and summary.ci[1] == pytest.approx(high, abs=15)
        assert min(finals) <= summary.ci[0] < summary.iqm < summary.ci[1] <= max(finals)


def test_rliable_intervals_are_seeded_and_leave_numpy_alone(fast_rliable, monkeypatch):
    """rliable resamples with NumPy's global generator: the report seeds it for each estimate and restores it."""
    finals = [float(v) for v in np.arange(16) * 1.37 + np.arange(16) ** 2 % 7]
    np.random.seed(123)
    before = np.random.get_state()
    first = stats.iqm_with_ci(finals)
    after = np.random.get_state()
    assert np.array_equal(before[1], after[1]) and before[2] == after[2]
    np.random.seed(7)  # another global state: the same intervals
    assert stats.iqm_with_ci(finals) == first
    assert stats.improvement_probability(finals, finals[::2]) == stats.improvement_probability(finals, finals[::2])
    monkeypatch.setattr(stats, "SEED", 1)  # the seed is what fixes them
    assert stats.iqm_with_ci(finals)[1] != first[1]


def test_report_builds_markdown_figures_and_records(fixture_results, tmp_path, fast_rliable):
    throughput = {
        "env": "Pendulum-v1",
        "steps": 8192,
        "repeats": 7,
        "n_envs": 4,
        "hyperparams": {"n_steps": 512},
        "machine": {"cpu_count": 2, "cpu_model": "Some CPU"},
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
    throughput_path = tmp_path / "throughput.jsonl"
    throughput_path.write_text(json.dumps(throughput) + "\n")
    out = tmp_path / "docs" / "BENCHMARKS.md"
    data = tmp_path / "docs" / "benchmarks" / "records" / "300k.jsonl"
    argv = ["--results", str(fixture_results), "--out", str(out), "--figures", str(tmp_path / "docs" / "benchmarks")]
    no_gpu_note = ["--gpu-note", str(tmp_path / "no-such-note.md")]  # the default file is the real report's
    assert report_cli.main([*argv, "--keep-data", str(data), "--throughput", str(throughput_path), *no_gpu_note]) == 0
    text = out.read_text()
    figures = tmp_path / "docs" / "benchmarks" / "300k"
    for name in ("", "-iqm", "-profile", "-improvement"):  # the learning curves and rliable's three plots
        assert (figures / f"Pendulum-v1{name}.png").stat().st_size > 10_000
    assert "![Pendulum-v1 learning curves (300k)](benchmarks/300k/Pendulum-v1.png)" in text
    assert "![Pendulum-v1 IQM, 95 % CIs (300k)](benchmarks/300k/Pendulum-v1-iqm.png) " in text
    assert "![Pendulum-v1 performance profiles (300k)](benchmarks/300k/Pendulum-v1-profile.png)" in text
    assert "![Pendulum-v1 probability of improvement (300k)](benchmarks/300k/Pendulum-v1-improvement.png)" in text
    assert "### Pendulum-v1, suite `300k`" in text
    assert "| `ppo` | 5 | 30000 | -366.0 ± " in text and "| -226.7 | [" in text
    # Probability of improvement over stock PPO (no TRPO ran): 19.5 of 25 pairs.
    assert "| algorithm X | P(X > `ppo`) | 95 % CI |\n|---|---|---|\n| `ppo_ext_clip` | 0.78 | [" in text
    assert "P(X > `trpo`)" not in text
    assert "| `ppo_ext_clip` | 5 | 30000 |" in text and "| -151.7 | [" in text
    assert "20k (4/5 seeds: 20k, 20k, 20k, 20k, never)" in text
    assert "| 35 s | 1000 |" in text
    # The throughput table: every variant of the measurement, its machine named.
    row = "| Pendulum-v1 | PPOExt, squash on | `{}` | 890 | 0.890 | 890 | 0.890 | — | 2026-11-30, commit not recorded, "
    assert row in text
    assert "8192 steps x 7, 2-core, Some CPU |" in text
    assert (
        "| Pendulum-v1 | 100k steps x 5 seeds: `ppo`, `ppo_ext_clip`, `ppo_ext_kl`, `ppo_ext_gauss` | 30k steps; seeds "
        "per algorithm: `ppo` 5, `ppo_ext_clip` 5, `ppo_ext_kl` 0, `ppo_ext_gauss` 0 | **partial**"
    ) in text
    assert (
        "| LunarLanderContinuous-v3 | 300k steps x 3 seeds: `ppo`, `ppo_ext_clip`, `ppo_ext_kl`, `ppo_ext_gauss` | — |" in text
    )
    assert (
        "| HalfCheetah-v5 | 300k steps x 3 seeds: `ppo`, `ppo_ext_clip`, `ppo_ext_kl`, `ppo_ext_gauss` | — | **not run** |"
        in text
    )
    assert "Not run: no CUDA machine" in text
    # The runs are recorded in one file, a line per run, and the report rebuilds from it alone.
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    assert [(line["marker"]["algo"], line["marker"]["seed"]) for line in lines] == [
        *(("ppo", seed) for seed in range(5)),
        *(("ppo_ext_clip", seed) for seed in range(5)),
    ]
    assert lines[0]["evaluations"]["mean_return"] == [-1200.0, -800.0, -400.0, -300.0]
    reloaded = records.load_runs(data)["Pendulum-v1"]
    original = records.load_runs(fixture_results)["Pendulum-v1"]
    assert [(r.seed, r.evaluations, r.marker) for r in reloaded["ppo"]] == [
        (r.seed, r.evaluations, r.marker) for r in original["ppo"]
    ]
    rebuilt = tmp_path / "rebuilt.md"
    note = tmp_path / "gpu-note.md"
    note.write_text("Ran on a lent GPU: 9 of 9 passed.\n")
    rebuild = ["--results", str(data), "--out", str(rebuilt), "--figures", str(tmp_path / "fig"), "--keep-data", ""]
    rebuild.append("--no-figures")  # the text is what is checked here; the figures are above
    assert report_cli.main([*rebuild, "--gpu-note", str(note)]) == 0
    rebuilt_text = rebuilt.read_text()
    assert "| -226.7 | [" in rebuilt_text
    assert "## GPU check\n\nRan on a lent GPU: 9 of 9 passed.\n" in rebuilt_text


def test_report_without_runs_fails(tmp_path, capsys):
    assert report_cli.main(["--results", str(tmp_path), "--out", str(tmp_path / "r.md"), "--keep-data", ""]) == 1
    assert "no finished runs" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r.md")


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
    assert sections.tuned_comments(yml) == {
        "LunarLanderContinuous-v3": [
            "Tuned: best of 12 complete trials of study 'llc': trial 7, 231.0",
            "study command: python -m rl_zoo3.train --algo ppo_ext -optimize",
        ]
    }
    lines = sections.tuning_section("300k", yml)
    assert (
        "| LunarLanderContinuous-v3 | Tuned: best of 12 complete trials of study 'llc': trial 7, 231.0<br>study command:"
        in ("\n".join(lines))
    )
    assert "| Hopper-v5 | not tuned" in "\n".join(lines) and "| Pendulum-v1 | not tuned" in "\n".join(lines)
    assert not any("Studies" in line for line in lines)
    # A study in progress (--study STORAGE NAME): its status line, read from the storage.
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="hopper", direction="maximize")
    study.enqueue_trial({"x": 1.0}, user_attrs={"shipped_entry": True})
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 2.0) * 100, n_trials=2)
    lines = sections.tuning_section("300k", yml, [(storage, "hopper")])
    assert lines[-1] == (
        f"- `{storage}`: study 'hopper': 2 trials (2 complete); best complete trial {study.best_trial.number}: "
        f"{study.best_value:.1f} (complete trials {min(t.value for t in study.trials):.1f} to {study.best_value:.1f}); "
        "the shipped entry (trial 0): 100.0"
    )


def test_source_revision(tmp_path):
    assert records.source_revision(tmp_path) is None  # not a git checkout
    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the tests do not run from a git checkout")
    assert records.source_revision(repo / "sb3_ppo_ext").split("+")[0] == head.stdout.strip()


def test_package_code_note(tmp_path):
    """The report says whether the runs' commits share the package's code, from git's tree of sb3_ppo_ext/."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout.strip()

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "sb3_ppo_ext").mkdir()
    (tmp_path / "sb3_ppo_ext" / "engine.py").write_text("a = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "package")
    first = git("rev-parse", "--short", "HEAD")
    (tmp_path / "data.csv").write_text("1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "data only")
    data_only = git("rev-parse", "--short", "HEAD")
    (tmp_path / "sb3_ppo_ext" / "engine.py").write_text("a = 2\n")
    git("add", "-A")
    git("commit", "-q", "-m", "engine change")
    changed = git("rev-parse", "--short", "HEAD")
    tree = git("rev-parse", "--short", f"{first}:sb3_ppo_ext")

    same = report.package_code_note([first, data_only], repo=tmp_path)
    assert same == f" The package's code (`sb3_ppo_ext/`, git tree {tree}) is the same at all of them."
    assert "2 distinct `sb3_ppo_ext/` trees" in report.package_code_note([first, changed], repo=tmp_path)
    assert f"{changed} had uncommitted changes" in report.package_code_note([f"{changed}+dirty"], repo=tmp_path)
    assert report.package_code_note(["0000000"], repo=tmp_path) == ""  # unknown commit: nothing claimed
    assert report.package_code_note([first], repo=tmp_path / "nowhere") == ""


def test_report_names_a_variant_that_reproduced_stock_ppo(fixture_results, tmp_path, fast_rliable):
    """A variant whose evaluations equal stock PPO's seed for seed is a tie, and the report says so."""
    for seed, final in enumerate(STOCK_FINALS):
        _write_fixture_run(fixture_results, "ppo_ext_gauss", seed, [-1200.0, -800.0, -400.0 + seed, final], fps=1000.0)
    # The same returns but one seed's final evaluation 1.0 lower: not identical (IQM -227.0).
    for seed, final in enumerate(STOCK_FINALS):
        returns = [-1200.0, -800.0, -400.0 + seed, final - (seed == 1)]
        _write_fixture_run(fixture_results, "ppo_ext_kl", seed, returns, fps=1000.0)
    runs = records.load_runs(fixture_results)
    assert sections.identical_to_stock(runs) == {("Pendulum-v1", "ppo_ext_gauss")}
    # Fewer seeds than stock PPO, each identical: still the same training.
    fewer = {"Pendulum-v1": {"ppo": runs["Pendulum-v1"]["ppo"], "ppo_ext_gauss": runs["Pendulum-v1"]["ppo_ext_gauss"][:2]}}
    assert sections.identical_to_stock(fewer) == {("Pendulum-v1", "ppo_ext_gauss")}
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--keep-data", ""]
    argv += ["--figures", str(tmp_path), "--no-figures"]  # the text is checked here, the figures elsewhere
    assert report_cli.main(argv) == 0
    text = out.read_text()
    assert "| `ppo_ext_gauss` (= stock PPO: every evaluation of each of its seeds identical) | 5 |" in text
    assert "| `ppo_ext_kl` | 5 |" in text


def test_report_keeps_timings_of_different_machines_apart(fixture_results, tmp_path, fast_rliable):
    """Runs from two machines: a column says where each row ran, and no throughput ratio crosses machines."""
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--keep-data", ""]
    argv += ["--figures", str(tmp_path), "--no-figures"]  # the text is checked here, the figures elsewhere
    assert report_cli.main(argv) == 0
    one_machine = out.read_text()
    assert "Machine: 2 CPU cores; stable_baselines3 x." in one_machine and "| machine |" not in one_machine
    assert "| 0.90 (same settings but the variant) |" in one_machine
    for marker_path in (fixture_results / "Pendulum-v1" / "ppo_ext_clip").glob("*.done.json"):
        marker = json.loads(marker_path.read_text())
        marker["cpu_count"], marker["versions"] = 16, {"stable_baselines3": "x", "torch": "y"}
        marker_path.write_text(json.dumps(marker))
    assert report_cli.main(argv) == 0
    text = out.read_text()
    assert "**A**: 2 CPU cores; stable_baselines3 x; **B**: 16 CPU cores; stable_baselines3 x, torch y." in text
    assert "| 35 s | 1000 | — | A |" in text
    assert "| 900 | — (ran on another machine than stock PPO) | B |" in text
    # Returns are compared across machines as before (the probability of improvement does not depend on timings).
    assert "| `ppo_ext_clip` | 0.78 | [" in text


def _en(text: str) -> str:
    """``~`` as the report's en dash (ranges of steps and seeds)."""
    return text.replace("~", sections.DASH)


def _segment(start: int, end: int, host: str, cpus: int, revision: str, day: str, **versions: str) -> dict:
    segment = {
        "from_timesteps": start,
        "to_timesteps": end,
        "machine": host,
        "cpu_count": cpus,
        "revision": revision,
        "started_at": f"{day}T00:00:00Z",
        "ended_at": f"{day}T01:00:00Z",
        "train_time_s": 10.0,
    }
    return {**segment, "versions": versions} if versions else segment


@pytest.fixture
def results_1m(tmp_path):
    """Hopper-v5 runs of the mujoco-1m suite (30k-step stand-ins: partial), some of them resumed on other machines."""
    results = tmp_path / "results-1m"
    old = {"sb3_ppo_ext_revision": "abc1234", "finished_at": "2026-11-30T05:00:00Z"}
    for seed, final in enumerate([2000.0, 2100.0]):
        _write_fixture_run(results, "ppo", seed, [10.0, 500.0, 1500.0, final], 1000.0, "Hopper-v5", **old)
    for seed, final in enumerate([1500.0, 2050.0]):
        _write_fixture_run(results, "trpo", seed, [10.0, 400.0, 1200.0, final], 800.0, "Hopper-v5", **old)
    for seed, final in enumerate([2500.0, 2600.0]):
        _write_fixture_run(results, "ppo_ext_clip", seed, [10.0, 600.0, 1900.0, final], 900.0, "Hopper-v5", **old)
    # Resumed on another machine: its env-steps/s (5000) compares with nothing.
    split = [
        _segment(0, 10_000, "host-a (2 cores)", 2, "abc1234", "2026-12-01"),
        _segment(10_000, 30_000, "lent", 16, "def5678", "2026-12-02", stable_baselines3="y"),
    ]
    for algo, returns in (("ppo_ext_clip", [10.0, 600.0, 1900.0, 2700.0]), ("ppo_ext_kl", [10.0, 300.0, 800.0, 1000.0])):
        seed = 2 if algo == "ppo_ext_clip" else 0
        _write_fixture_run(results, algo, seed, returns, 5000.0, "Hopper-v5", segments=split, **old)
    return results


def test_old_markers_are_one_segment_and_new_ones_list_theirs(results_1m):
    runs = records.load_runs(results_1m)["Hopper-v5"]
    stock = runs["ppo"][0]
    assert records.run_segments(stock.marker) == [
        records.Segment(0, 30_000, "2 CPU cores; stable_baselines3 x", "abc1234", "2026-11-30T05:00:00Z", train_time_s=30.0)
    ]
    assert not records.is_mixed(stock)
    named = {"cpu_count": 2, "cpu_model": "Some CPU", "versions": {"torch": "2"}}
    assert records.machine(named) == "2 CPU cores (Some CPU); torch 2"
    split = runs["ppo_ext_clip"][2]
    # A segment's kind of machine is its cores and versions (its own, else the marker's), as for whole runs,
    # so the first segment is the old runs' machine A; the label names the machine.
    segments = records.run_segments(split.marker)
    assert [(s.from_timesteps, s.to_timesteps, s.machine, s.revision, s.label) for s in segments] == [
        (0, 10_000, "2 CPU cores; stable_baselines3 x", "abc1234", "host-a (2 cores)"),
        (10_000, 30_000, "16 CPU cores; stable_baselines3 y", "def5678", "lent"),
    ]
    assert records.is_mixed(split)


def test_report_covers_several_suites_and_mixed_machines(fixture_results, results_1m, tmp_path, fast_rliable):
    """Both suites in one report, each with its sections; a suite not run yet says so; resumed runs stay out of timings."""
    out = tmp_path / "BENCHMARKS.md"
    figures = tmp_path / "figures"
    argv = ["--out", str(out), "--figures", str(figures), "--keep-data", "", "--results", f"300k={fixture_results}"]
    assert report_cli.main([*argv, "--results", f"mujoco-1m={tmp_path / 'not-yet'}", "--no-figures"]) == 0  # text only
    text = out.read_text()
    assert "## Suite `300k`" in text and "## Suite `mujoco-1m`" in text
    assert f"Not run yet: no finished run under `{tmp_path / 'not-yet'}`." in text
    assert "| Walker2d-v5 | 1M steps x 3 seeds: `ppo`, `trpo`, `ppo_ext_clip` | — | **not run** |" in text
    # The other suite's sections are there as they were.
    assert "| `ppo_ext_clip` | 0.78 | [" in text

    assert report_cli.main([*argv, "--results", f"mujoco-1m={results_1m}"]) == 0
    text = out.read_text()
    assert "### Pendulum-v1, suite `300k`" in text and "### Hopper-v5, suite `mujoco-1m`" in text
    for suite, env in (("300k", "Pendulum-v1"), ("mujoco-1m", "Hopper-v5")):
        for name in ("", "-iqm", "-profile", "-improvement"):
            assert (figures / suite / f"{env}{name}.png").stat().st_size > 10_000
        assert f"![{env} learning curves ({suite})](figures/{suite}/{env}.png)" in text
    assert (
        "| Hopper-v5 | 1M steps x 5 seeds: `ppo`, `trpo`, `ppo_ext_clip`, `ppo_ext_kl`, `ppo_ext_tanh` | 30k steps; seeds "
        "per algorithm: `ppo` 2, `trpo` 2, `ppo_ext_clip` 3, `ppo_ext_kl` 1, `ppo_ext_tanh` 0 | **partial**"
    ) in text
    # Probability of improvement over both baselines, by hand: ppo_ext_clip's 2500, 2600, 2700 are above every run of both.
    clip = [2500.0, 2600.0, 2700.0]
    assert _mann_whitney(clip, [2000.0, 2100.0]) == 1.0 and _mann_whitney(clip, [1500.0, 2050.0]) == 1.0
    assert "| algorithm X | P(X > `ppo`) | 95 % CI | P(X > `trpo`) | 95 % CI |" in text
    assert "| `ppo_ext_clip` | 1.00 | [1.00, 1.00] | 1.00 | [1.00, 1.00] |" in text
    # Machines: A (old markers and the resumed runs' first segments), B (their second); resumed runs stay out of the timings.
    assert "**A**: 2 CPU cores; stable_baselines3 x; **B**: 16 CPU cores; stable_baselines3 y." in text
    assert "| 38 s | 900 (without 1 run split across machines) | 0.90 (same settings but the variant) | A+B |" in text
    split_cells = "| — (runs split across machines) | — (runs split across machines) | — (runs split across machines) | A+B |"
    kl_row = next(line for line in text.splitlines() if line.startswith("| `ppo_ext_kl` | 1 | 30000 |"))
    assert kl_row.endswith(f"| 30k (1/1 seeds: 30k) {split_cells}")


def _summary(algo: str, iqm: float) -> object:
    return stats.Summary(algo, [0, 1, 2], 1_000_000, np.array([iqm] * 3), iqm, (iqm, iqm), [], 1.0, 1.0, ("m",))


def test_report_names_runs_recorded_with_an_earlier_entry(tmp_path):
    results = tmp_path / "results"
    spec = records.RunSpec("Pendulum-v1", "ppo_ext_kl", 0, 30_000, 10_000, 10, str(results))
    current = entries.expected_hyperparams(spec)
    for seed in (0, 1, 2):
        _write_fixture_run(results, "ppo_ext_kl", seed, [-1000.0, -500.0], fps=1000.0, hyperparams=current)
    assert sections.earlier_settings_section(report.SuiteResults("300k", results, records.load_runs(results))) == []
    # Seeds 1 and 2 ran before the entry's learning rate and n_envs changed.
    earlier = {**current, "learning_rate": "0.01", "n_envs": "8"}
    for seed in (1, 2):
        _write_fixture_run(results, "ppo_ext_kl", seed, [-1000.0, -500.0], fps=1000.0, hyperparams=earlier)
    lines = sections.earlier_settings_section(report.SuiteResults("300k", results, records.load_runs(results)))
    assert lines[-1] == f"- Pendulum-v1 `ppo_ext_kl`, seeds 1{sections.DASH}2: learning_rate, n_envs"
    assert "their numbers are those of the earlier settings" in lines[0]
    # Stale runs do not count toward a complete budget.
    budget = suites.EnvBudget("Pendulum-v1", 30_000, 3, 10_000, ("ppo_ext_kl",))
    runs = records.load_runs(results)
    stale = report.earlier_settings("300k", runs)
    assert set(stale) == {("Pendulum-v1", "ppo_ext_kl", 1), ("Pendulum-v1", "ppo_ext_kl", 2)}
    assert sections.budget_complete(budget, runs["Pendulum-v1"]) and not sections.budget_complete(
        budget, runs["Pendulum-v1"], stale
    )
    # The coverage table counts them per env; a validation suite's shipped-entry runs are exempt.
    suite = report.SuiteResults("300k", results, runs)
    assert suite.uncounted == stale
    assert "**partial** (2 runs with earlier settings) |" in "\n".join(sections.coverage_section(suite))
    assert report.SuiteResults("tuned-1m", results, runs).uncounted == {}


def test_candidate_verdict_from_the_numbers():
    summaries = {"Hopper-v5": [_summary("ppo_ext_clip", 1000.0), _summary("ppo_ext_tuned", 3000.0)]}
    found = {"Hopper-v5": {("ppo_ext_tuned", "ppo_ext_clip"): (0.96, (0.8, 1.0))}}

    def table(complete=True):
        return "\n".join(targets.validation_section("tuned-1m", summaries, found, {"Hopper-v5": complete}))

    assert (
        "| Hopper-v5 | **wins**: ship it | IQM 3000.0 [3000.0, 3000.0] vs 1000.0 [1000.0, 1000.0] (+2000.0); P = 0.96"
        in table()
    )
    assert "| Hopper-v5 | not judged yet (runs incomplete; so far it wins) |" in table(complete=False)
    found["Hopper-v5"][("ppo_ext_tuned", "ppo_ext_clip")] = (0.8, (0.5, 1.0))  # the CI reaches 0.5
    assert "| Hopper-v5 | does not win: keep the shipped entry |" in table()
    found["Hopper-v5"][("ppo_ext_tuned", "ppo_ext_clip")] = (0.96, (0.8, 1.0))
    summaries["Hopper-v5"][1] = _summary("ppo_ext_tuned", 900.0)  # a lower IQM never wins
    assert "| Hopper-v5 | does not win: keep the shipped entry |" in table()
    del summaries["Hopper-v5"][0]
    assert "| Hopper-v5 | not measured yet | — |" in table()


def test_improvements_compare_the_candidate_with_the_shipped_entry(fast_rliable):
    runs = [_summary("ppo", 900.0), _summary("ppo_ext_clip", 1000.0), _summary("ppo_ext_tuned", 3000.0)]
    runs = [dataclasses.replace(s, finals=s.finals + np.arange(3)) for s in runs]
    found = stats.improvements(runs)
    assert set(found) == {("ppo_ext_clip", "ppo"), ("ppo_ext_tuned", "ppo"), ("ppo_ext_tuned", "ppo_ext_clip")}
    assert found["ppo_ext_tuned", "ppo_ext_clip"][0] == pytest.approx(1.0)
    table = "\n".join(sections.improvement_table(runs, found))
    assert "| algorithm X | P(X > `ppo`) | 95 % CI | P(X > `ppo_ext_clip`) | 95 % CI |" in table
    assert "| `ppo_ext_clip` | 1.00 | [1.00, 1.00] | — | — |" in table
    assert "| `ppo_ext_tuned` | 1.00 | [1.00, 1.00] | 1.00 | [1.00, 1.00] |" in table


def test_report_results_and_keep_data_arguments(tmp_path, capsys):
    assert report_cli.parse_results(["300k=a", "mujoco-1m=b"], "300k") == [("300k", Path("a")), ("mujoco-1m", Path("b"))]
    assert report_cli.parse_results(["x"], "pendulum") == [("pendulum", Path("x"))]  # a folder alone: --suite's
    # No --results: every suite's committed record (from the repository).
    assert report_cli.parse_results(None, "300k") == [
        (suite, Path(f"docs/benchmarks/records/{suite}.jsonl"))
        for suite in suites.SUITES
        if Path(f"docs/benchmarks/records/{suite}.jsonl").is_file()
    ]
    with pytest.raises(ValueError, match="unknown suite 'nosuch'"):
        report_cli.parse_results(["nosuch=x"], "300k")
    with pytest.raises(ValueError, match="more than one results folder"):
        report_cli.parse_results(["300k=a", "b"], "300k")
    assert report_cli.parse_keep_data(None, ["300k", "mujoco-1m"]) == {
        "300k": Path("docs/benchmarks/records/300k.jsonl"),
        "mujoco-1m": Path("docs/benchmarks/records/mujoco-1m.jsonl"),
    }
    assert report_cli.parse_keep_data([""], ["300k", "mujoco-1m"]) == {}
    assert report_cli.parse_keep_data(["d"], ["300k"]) == {"300k": Path("d")}
    assert report_cli.parse_keep_data(["mujoco-1m=e"], ["300k", "mujoco-1m"]) == {"mujoco-1m": Path("e")}
    with pytest.raises(ValueError, match="give SUITE=FILE"):
        report_cli.parse_keep_data(["d"], ["300k", "mujoco-1m"])
    assert report_cli.main(["--results", "nosuch=x", "--out", str(tmp_path / "r.md")]) == 2
    assert "unknown suite" in capsys.readouterr().err
    # No suite with a finished run: no report.
    argv = ["--results", f"300k={tmp_path / 'a'}", "--results", f"mujoco-1m={tmp_path / 'b'}", "--keep-data", ""]
    assert report_cli.main([*argv, "--out", str(tmp_path / "r.md")]) == 1
    assert "no finished runs" in capsys.readouterr().err and not (tmp_path / "r.md").exists()


def test_run_lock_keeps_a_second_writer_out_of_a_running_run(tmp_path, capsys):
    """While one process runs a spec, another one neither trains it nor touches its files."""
    spec = records.RunSpec("Pendulum-v1", "ppo", 0, 2048, 1024, 2, str(tmp_path))
    spec.stem.parent.mkdir(parents=True)
    spec.csv_path.write_text("evaluations of the running run\n")
    spec.marker_path.write_text("{}")
    with runner.run_lock(spec):
        with pytest.raises(runner.RunInProgressError, match=rf"Pendulum-v1 ppo seed 0 is being run .*pid {os.getpid()}"):
            runner.run_one(spec)
        # The matrix reports it and moves on (the marker is not a finished one: "{}" has no budget).
        assert runner.run_matrix([spec], workers=1) == 1
        assert "SKIPPED Pendulum-v1 ppo seed 0" in capsys.readouterr().out
    assert spec.csv_path.read_text() == "evaluations of the running run\n" and spec.marker_path.read_text() == "{}"
    assert not spec.csv_path.with_suffix(".csv.tmp").exists()
    # The lock went with its holder: a lock file left behind (a killed run) does not block.
    with runner.run_lock(spec):
        pass


def test_report_refuses_a_corrupt_csv(fixture_results, tmp_path, capsys):
    """Rows of two writers interleaved (steps out of order, a torn line): an error naming the file, no report."""
    csv_path = fixture_results / "Pendulum-v1" / "ppo" / "seed1.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([lines[0], lines[1], lines[3], lines[2], *lines[4:]]) + "\n")
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--results", str(fixture_results), "--out", str(out), "--keep-data", ""]
    argv += ["--figures", str(tmp_path), "--no-figures"]  # the text is checked here, the figures elsewhere
    assert report_cli.main(argv) == 1
    assert f"{csv_path}: evaluation steps are not increasing: [0, 20000, 10000, 30000]" in capsys.readouterr().err
    csv_path.write_text("\n".join([lines[0], lines[1], "19.7277,10,840.270,190.4", *lines[2:]]) + "\n")
    assert report_cli.main(argv) == 1
    assert f"{csv_path}: not a readable benchmark record" in capsys.readouterr().err
    assert not out.exists()
    # A record file: a torn line is named by its file and line.
    record = tmp_path / "300k.jsonl"
    record.write_text('{"marker": {}, "evaluations": {}}\n{"marker": ')
    assert report_cli.main([*argv[:1], str(record), *argv[2:]]) == 1
    err = capsys.readouterr().err
    assert f"{record}:1: not a readable benchmark record" in err and f"{record}:2: not a run record" not in err
    record.write_text(record.read_text().splitlines()[1] + "\n")
    assert report_cli.main([*argv[:1], str(record), *argv[2:]]) == 1
    assert f"{record}:1: not a run record" in capsys.readouterr().err


def test_masked_suite_trains_stock_ppo_at_the_shipped_masked_entry():
    """Suite masked: the same seeds and budget for the three algorithms; stock PPO gets ppo_mask_ext.yml's settings."""
    specs = runner.build_matrix(benchmark_cli.parse_args(["--suite", "masked"]))
    for env in ("Taxi-v4", "InvalidActionEnvDiscrete-v0"):
        by_algo: dict[str, list] = {}
        for spec in specs:
            if spec.env == env:
                by_algo.setdefault(spec.algo, []).append((spec.seed, spec.steps, spec.eval_freq))
        assert set(by_algo) == set(suites.MASKED) and len({tuple(runs) for runs in by_algo.values()}) == 1
        assert len(by_algo["ppo_unmasked"]) == 5
    from sb3_ppo_ext import settings

    taxi = settings.load_hyperparams("Taxi-v4", settings.ALGORITHMS["ppo_mask_ext"].hyperparams, "ppo_mask_ext")
    unmasked = entries.expected_hyperparams(
        next(spec for spec in specs if spec.algo == "ppo_unmasked" and spec.env == "Taxi-v4")
    )
    assert unmasked == entries._comparable({key: repr(value) for key, value in taxi.items()})
    kl = entries.expected_hyperparams(next(spec for spec in specs if spec.algo == "ppo_mask_ext_kl" and spec.env == "Taxi-v4"))
    assert kl["clip_range"] == "None" and kl["kl_target"] == "0.01" and kl["n_envs"] == unmasked["n_envs"] == "8"


def head_summary(algo, iqm):
    return stats.Summary(algo, [0], 1000, np.array([iqm]), iqm, (iqm - 10, iqm + 10), [], 1.0, 1.0, ("here",))


def test_heads_section_judges_each_pair_by_its_probability_of_improvement():
    summaries = {
        "Pendulum-v1": [
            head_summary("ppo_ext_gauss", -300.0),
            head_summary("ppo_ext_clip", -200.0),
            head_summary("ppo_ext_beta", -205.0),
        ]
    }
    found = {
        "Pendulum-v1": {
            ("ppo_ext_clip", "ppo_ext_gauss"): (0.9, (0.7, 1.0)),
            ("ppo_ext_beta", "ppo_ext_gauss"): (0.2, (0.6, 0.9)),
            ("ppo_ext_beta", "ppo_ext_clip"): (0.45, (0.2, 0.7)),
        }
    }
    lines = targets.heads_section("heads", summaries, found, {"Pendulum-v1": True})
    rows = {line.split(" | ")[1].split(" (")[0] + " / " + line.split(" | ")[2].split(" (")[0]: line for line in lines[2:]}
    assert rows["squashed Gaussian / clipped Gaussian"].endswith("| better |")
    assert "+100.0 (-200.0 vs -300.0)" in rows["squashed Gaussian / clipped Gaussian"]
    assert rows["Beta / squashed Gaussian"].endswith("| not distinguishable |")
    assert any("MountainCarContinuous-v0 | — | — | — | — | not measured yet" in line for line in lines)
    incomplete = targets.heads_section("heads", summaries, found, {"Pendulum-v1": False})
    assert any("Pendulum-v1 | — |" in line and "runs incomplete" in line for line in incomplete)


def test_fast_suite_runs_fast_mode_beside_the_shipped_entry_on_the_same_seeds():
    specs = runner.build_matrix(benchmark_cli.parse_args(["--suite", "fast"]))
    tasks = ("Pendulum-v1", "LunarLanderContinuous-v3", "Hopper-v5")  # Hopper: a second task on the NumPy step
    assert {spec.env for spec in specs} == set(tasks)
    for env in tasks:
        by_algo: dict[str, list] = {}
        for spec in specs:
            if spec.env == env:
                by_algo.setdefault(spec.algo, []).append((spec.seed, spec.steps, spec.eval_freq))
        assert set(by_algo) == {"ppo_ext_clip", "ppo_ext_fast"} and len({tuple(r) for r in by_algo.values()}) == 1
        assert len(by_algo["ppo_ext_fast"]) == 10
    assert entries.zoo_overrides("Pendulum-v1", suites.ALGOS["ppo_ext_fast"][1])["policy_kwargs"]["fast"] is True
    # A RecurrentPPOExt variant merges into ppo_lstm_ext.yml's entry (its network), not ppo_ext.yml's.
    zoo_algo, overrides, _ = suites.ALGOS["ppo_lstm_ext_fast"]
    merged = entries.zoo_overrides("PendulumNoVel-v1", overrides, zoo_algo)["policy_kwargs"]
    assert merged["fast"] is True and merged["lstm_hidden_size"] == 64 and merged["net_arch"] == {"pi": [64], "vf": [64]}


def _curve_runs(algo, finals, curve_offset=0.0):
    return [
        records.Run(
            "Pendulum-v1",
            algo,
            seed,
            {"timesteps": [1000, 2000], "mean_return": [-900.0 + curve_offset + seed, final]},
            {"timesteps": 2000, "total_wall_time_s": 1.0, "env_steps_per_s": 1.0},
            "fixture",
        )
        for seed, final in enumerate(finals)
    ]


@pytest.mark.parametrize(
    "offset, verdict, overlapping", [(0.0, "same learning curves", "2 of 2"), (500.0, "**different**", "1 of 2")]
)
def test_fast_section_compares_the_final_iqms_and_every_evaluation_of_the_curves(offset, verdict, overlapping):
    finals = [-200.0, -180.0, -160.0, -150.0, -140.0]
    runs = {"ppo_ext_clip": _curve_runs("ppo_ext_clip", finals), "ppo_ext_fast": _curve_runs("ppo_ext_fast", finals, offset)}
    suite = report.SuiteResults("fast", Path("."), {"Pendulum-v1": runs})
    # Summaries by hand (summarize's rliable bootstrap is tested elsewhere): the section reads seeds, IQM and CI.
    summaries = {"Pendulum-v1": [head_summary(algo, -160.0) for algo in runs]}
    for summary in summaries["Pendulum-v1"]:
        summary.seeds[:] = list(range(5))
    found = {"Pendulum-v1": {("ppo_ext_fast", "ppo_ext_clip"): (0.5, (0.2, 0.8))}}
    lines = targets.fast_section(suite, summaries, found, {"Pendulum-v1": True})
    (row,) = [line for line in lines if line.startswith("| Pendulum-v1")]
    assert row.endswith(f"| {overlapping} | {verdict} |") and "| 5 + 5 |" in row and "0.50 [0.20, 0.80]" in row
    assert any("LunarLanderContinuous-v3 | — |" in line and "not measured yet" in line for line in lines)


def test_interquartile_mean_is_rliables_iqm():
    from rliable import metrics

    scores = np.array([[-900.0, 3.0, 7.5, 1.0, -2.0, 40.0, 11.0, 0.5]]).T  # runs x 1 task, as rliable takes them
    assert stats.interquartile_mean(scores[:, 0]) == pytest.approx(metrics.aggregate_iqm(scores))


def _timed_run(algo: str, seed: int, steps: list[int], cpu: list[float], returns: list[float]) -> records.Run:
    evaluations = {"timesteps": steps, "mean_return": returns, "cpu_time": cpu}
    return records.Run("Hopper-v5", algo, seed, evaluations, {}, "fixture")  # type: ignore[arg-type]


def test_time_to_score_section_by_hand(tmp_path, rliable_stats):
    from benchmarks import time_to_score

    fast = [[0, 3100, 3200, 3300], [0, 2000, 3050, 3100], [0, 1000, 2000, 2500]]
    slow = [[0, 800, 1000], [0, 900, 1100], [0, 1000, 1200]]
    runs = {
        "Hopper-v5": {
            "ppo": [_timed_run("ppo", k, [0, 500_000, 1_000_000], [0, 500, 1000], r) for k, r in enumerate(slow)],
            "ppo_ext_envpool": [
                _timed_run("ppo_ext_envpool", k, [0, 500_000, 1_000_000, 1_500_000], [0, 100, 200, 300], r)
                for k, r in enumerate(fast)
            ],
        }
    }
    assert [time_to_score.cpu_to_reach(run, 3000) for run in runs["Hopper-v5"]["ppo_ext_envpool"]] == [100, 200, np.inf]
    run = runs["Hopper-v5"]["ppo_ext_envpool"][1]
    assert time_to_score.return_at(run, time_to_score.cpu_seconds(run), 250) == 3050  # the last evaluation by then
    assert np.isnan(time_to_score.return_at(run, time_to_score.cpu_seconds(run), 301))  # the run stopped before
    lines = time_to_score.time_to_score_section(runs, tmp_path / "figures", tmp_path / "B.md")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ppo")}
    # median CPU-s to 3000 of (100, 200, inf); IQM of 3 runs = their mean at 300 CPU-s (3300, 3100, 2500) and
    # at 1M steps (3200, 3050, 2000); 1.5M steps in 300 CPU-s; stock's 1M-step IQM 1100 is reached at a median
    # 1000 CPU-s by stock (inf, 1000, 1000) and 100 by the envpool runs (100, 100, 200): 10x sooner.
    assert rows["ppo_ext_envpool"][2] == "200 (2/3)"
    assert rows["ppo_ext_envpool"][3].startswith("2967 [")
    assert rows["ppo_ext_envpool"][4] == "-"  # no run got to 600 CPU-s
    assert rows["ppo_ext_envpool"][6].startswith("2750 [")
    assert rows["ppo_ext_envpool"][7:] == ["5000", "10.0", "- |"]  # no 1-env entry runs: no second reference
    assert rows["ppo"][2] == "never (0/3)" and rows["ppo"][7:] == ["1000", "1.0", "- |"]
    assert "1M-step IQM of the references: ppo 1100." in lines
    # The 1-env entry as the second reference: its 1M-step IQM 2000 (one run) is reached at 400 CPU-s by it and at
    # a median 100 by the envpool runs (100, 100, 200): 4x sooner; stock never reaches it.
    runs["Hopper-v5"]["ppo_ext_clip"] = [
        _timed_run("ppo_ext_clip", 0, [0, 500_000, 1_000_000], [0, 400, 800], [0, 2000, 2000])
    ]
    lines = time_to_score.time_to_score_section(runs, tmp_path / "figures", tmp_path / "B.md", draw=False)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ppo")}
    assert rows["ppo_ext_envpool"][8:] == ["10.0", "4.0 |"] and rows["ppo"][8:] == ["1.0", "never |"]
    assert "1M-step IQM of the references: ppo 1100; ppo_ext_clip 2000." in lines
    # Three 1-env runs ending at 2000, 1000 and 1000: their IQM (the mean of 3) 1333 is reached by one of them only,
    # so their own median is infinite and no ratio to them exists.
    runs["Hopper-v5"]["ppo_ext_clip"] = [
        _timed_run("ppo_ext_clip", seed, [0, 500_000, 1_000_000], [0, 400, 800], [0, final, final])
        for seed, final in enumerate((2000, 1000, 1000))
    ]
    lines = time_to_score.time_to_score_section(runs, tmp_path / "figures", tmp_path / "B.md", draw=False)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ppo")}
    assert rows["ppo_ext_envpool"][9] == "reference never |" and rows["ppo_ext_clip"][9] == "never |"
    runs["Hopper-v5"]["ppo_ext_clip"] = runs["Hopper-v5"]["ppo_ext_clip"][:1]
    # Stock's 1M-step IQM (50) is scored by its untrained policies (0 CPU-s), and the envpool runs reach it at 100
    # CPU-s: no ratio either way; then the envpool runs' untrained policies score it too.
    for run in runs["Hopper-v5"]["ppo"]:
        run.evaluations["mean_return"] = [100, 40, 50]
    lines = time_to_score.time_to_score_section(runs, tmp_path / "figures", tmp_path / "B.md", draw=False)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ppo")}
    assert rows["ppo_ext_envpool"][8] == "reference at start" and rows["ppo"][8] == "at start"
    for run in runs["Hopper-v5"]["ppo_ext_envpool"]:
        run.evaluations["mean_return"][0] = 60
    lines = time_to_score.time_to_score_section(runs, tmp_path / "figures", tmp_path / "B.md", draw=False)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ppo")}
    assert rows["ppo_ext_envpool"][8] == "at start"
    assert (tmp_path / "figures" / "time-to-score" / "Hopper-v5-cpu.png").stat().st_size > 0


def test_record_without_cpu_time_reads_without_it(tmp_path):
    _write_fixture_run(tmp_path, "ppo", 0, [-1200.0, -800.0], fps=1000.0)  # six columns, as before cpu_time
    (run,) = records.load_runs(tmp_path)["Pendulum-v1"]["ppo"]
    assert "cpu_time" not in run.evaluations and run.evaluations["fps"] == [1000.0, 1000.0]
    from benchmarks import time_to_score

    assert time_to_score.merged_runs({"time-to-score": {"Pendulum-v1": {"ppo": [run]}}}) == {}


def test_invalid_entry_fails_its_run_not_the_matrix(tmp_path):
    candidate = tmp_path / "candidate.yml"
    candidate.write_text("Pendulum-v1:\n  policy: MlpPolicy\n  n_timesteps: 1000\n  n_epochs: ten\n")
    spec = records.RunSpec("Pendulum-v1", suites.CANDIDATE, 0, 1000, 500, 1, str(tmp_path / "out"), candidate=str(candidate))
    # The manager ends a command on invalid settings (SystemExit); in the matrix that is one failed run.
    with pytest.raises(RuntimeError, match="n_epochs"):
        runner.run_one(spec)
