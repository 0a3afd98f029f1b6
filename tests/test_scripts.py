"""The scripts in scripts/ run (their full runs are benchmarks, not tests)."""

import json
import runpy
import statistics
from pathlib import Path

import check_fast_tier  # scripts/check_fast_tier.py (scripts/ is on the tests' sys.path)
import pytest
from benchmarks.sections import throughput_table  # the report's (scripts/benchmarks/)
from helpers import REPO_ROOT, SCRIPTS


def test_gpu_check_self_check_on_cpu(capsys):
    """The CPU-vs-device comparison machinery works (run with --device cuda on a CUDA machine)."""
    gpu_check = runpy.run_path(str(SCRIPTS / "gpu_check.py"))
    env_id, kwargs = gpu_check["CONFIGS"]["squashed + clip + KL + value clip max"]
    assert gpu_check["check"]("t", env_id, kwargs, "cpu", 1e-6)
    out = capsys.readouterr().out
    assert "kl_penalty" in out and "MISMATCH" not in out


def test_throughput_json_is_cpu_time_based_and_read_by_the_report(tmp_path, capsys):
    """A tiny throughput.py run: CPU-time headline, wall clock beside it, and the keys the report reads."""
    throughput = runpy.run_path(str(SCRIPTS / "throughput.py"))
    path = tmp_path / "throughput.jsonl"
    path.write_text('{"an earlier": "measurement"}\n')
    argv = ["--steps", "64", "--n-envs", "2", "--n-steps", "32", "--n-epochs", "1", "--repeats", "2", "--warmup", "0"]
    result = throughput["main"]([*argv, "--json", str(path)])
    earlier, line = path.read_text().splitlines()  # appended: one measurement a line
    saved = json.loads(line)
    assert saved == json.loads(json.dumps(result)) and json.loads(earlier) == {"an earlier": "measurement"}
    assert saved["clock"] == "process_time" and saved["hyperparams"]["n_steps"] == 32
    stock = saved["variants"]["stock PPO"]
    assert stock["ratio_of_medians"] == stock["ratio_of_bests"] == stock["median_of_paired_ratios"] == 1.0
    for entry in saved["variants"].values():
        assert len(entry["fps"]) == len(entry["wall"]["fps"]) == 2
        assert entry["best"] == max(entry["fps"]) and entry["median"] == statistics.median(entry["fps"])
        assert entry["wall"]["best"] == max(entry["wall"]["fps"])
    assert saved["machine"]["cpu_count"] and "cpu_model" in saved["machine"]
    rows = [line for line in throughput_table([saved]) if line.startswith("| Pendulum-v1 |")]
    assert [row.split(" | ")[1] for row in rows] == list(saved["variants"])
    assert "process CPU time" in capsys.readouterr().out


def test_gpu_check_covers_maskable_and_recurrent_on_cpu(capsys):
    gpu_check = runpy.run_path(str(SCRIPTS / "gpu_check.py"))
    for name in (
        "MaskablePPOExt: masked MultiDiscrete + clip + KL + value clip",
        "RecurrentPPOExt: squashed LSTM + clip + KL + value clip max",
    ):
        env_id, kwargs = gpu_check["CONFIGS"][name]
        assert gpu_check["check"](name, env_id, kwargs, "cpu", 1e-6)
    out = capsys.readouterr().out
    assert out.count("kl_penalty") == 2 and "MISMATCH" not in out


def test_throughput_families_and_the_report_table(tmp_path):
    """--family maskable / recurrent time the Ext class against its upstream class; the report lists both."""
    throughput = runpy.run_path(str(SCRIPTS / "throughput.py"))
    measured = []
    for family, n_steps in (("maskable", 32), ("recurrent", 16)):
        argv = ["--family", family, "--steps", str(2 * n_steps), "--n-envs", "2", "--n-steps", str(n_steps)]
        result = throughput["main"]([*argv, "--batch-size", "16", "--n-epochs", "1", "--repeats", "1", "--warmup", "0"])
        assert result["family"] == family
        reference = next(iter(result["variants"].values()))
        assert reference["ratio_of_medians"] == 1.0
        measured.append(result)
    assert next(iter(measured[0]["variants"])) == "MaskablePPO" and next(iter(measured[1]["variants"])) == "RecurrentPPO"
    rows = [line.split(" | ")[:2] for line in throughput_table(measured) if line.startswith("| ") and "---" not in line]
    assert ["| InvalidActionEnvDiscrete", "MaskablePPO"] in rows and ["| Pendulum-v1", "RecurrentPPOExt, squash on"] in rows


def test_upstream_tests_command_runs_whole_files_that_name_the_replaced_classes(tmp_path):
    upstream = runpy.run_path(str(SCRIPTS / "upstream_tests.py"))
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_ppo.py").write_text("from stable_baselines3 import A2C, PPO\n")
    (tests / "test_a2c.py").write_text("from stable_baselines3 import A2C  # PPOs are elsewhere\n")
    (tests / "test_utils.py").write_text("from stable_baselines3 import PPO  # needs a package not installed\n")
    (tests / "test_lstm.py").write_text("from sb3_contrib import RecurrentPPO\n")
    needs = upstream["NEEDS_PACKAGE"]["sb3"]  # the script's own dict (runpy copies the globals shallowly)
    needs.clear()
    needs.update({"tests/test_utils.py": "no_such_package", "tests/test_ppo.py::test_video": "no_such_package"})
    needs["tests/test_ppo.py::test_render"] = "json"  # importable: it runs
    command = upstream["pytest_command"]("sb3", tmp_path, 2)
    assert "-k" not in command and [arg for arg in command if arg.startswith("tests/")] == ["tests/test_ppo.py"]
    assert "--deselect=tests/test_run.py::test_ppo_warnings" in command and command[-2:] == ["-n", "2"]
    assert "--deselect=tests/test_sde.py::test_only_sde_squashed" in command
    assert "--deselect=tests/test_ppo.py::test_video" in command and "--deselect=tests/test_ppo.py::test_render" not in command
    contrib = upstream["pytest_command"]("sb3-contrib", tmp_path, 1)
    assert "-n" not in contrib and [arg for arg in contrib if arg.startswith("tests/")] == ["tests/test_lstm.py"]
    assert "MaskablePPO = MaskablePPOExt" in upstream["SUITES"]["sb3-contrib"][1]


def test_workload_measurement_and_the_current_measurement(tmp_path):
    """--workload runs rl-zoo3's settings (normalize included); the report shows the newest measurement of each variant."""
    throughput = runpy.run_path(str(SCRIPTS / "throughput.py"))
    path = tmp_path / "mc.json"
    argv = ["--workload", "mountaincar", "--steps", "16", "--repeats", "1", "--warmup", "0"]
    result = throughput["main"]([*argv, "--variants", "PPOExt, squash off", "--json", str(path)])
    assert result["workload"] == "mountaincar" and result["normalize"] is True and result["n_envs"] == 1
    assert list(result["variants"]) == ["stock PPO", "PPOExt, squash off"]
    assert result["hyperparams"]["n_steps"] == 8 and result["hyperparams"]["use_sde"] is True
    saved = json.loads(path.read_text())  # schedules and classes are written by name

    def shown(throughputs):
        return [line for line in throughput_table(throughputs) if line.startswith("| mountaincar (MountainCarContinuous-v0)")]

    paired = saved["variants"]["PPOExt, squash off"]["median_of_paired_ratios"]
    assert f"| {paired:.3f} |" in shown([saved])[1] and "16 steps x 1" in shown([saved])[1]
    # Two measurements of the same variant on the same workload: the newest is shown, in either order.
    newer = json.loads(json.dumps(saved))
    newer["measured_at"] = "9999-01-01T00:00:00Z"
    newer["variants"]["PPOExt, squash off"]["median_of_paired_ratios"] = 0.5
    for order in ([saved, newer], [newer, saved]):
        assert len(shown(order)) == 2 and "| 0.500 |" in shown(order)[1]
    newer["warm_model"] = True  # another protocol (SBX's reference row): shown beside the other
    assert len(shown([saved, newer])) == 4
    on_envpool = dict(saved, env_backend="envpool")  # the same workload on EnvPool's envs: a row pair of its own
    assert sum("on EnvPool" in line for line in shown([saved, on_envpool])) == 2 and len(shown([saved, on_envpool])) == 4
    assert result["env_backend"] == "gymnasium"
    with pytest.raises(SystemExit):
        throughput["main"]([*argv, "--variants", "no such variant"])


def test_sbx_reference_row_runs_only_when_asked_for_and_says_what_it_needs(monkeypatch):
    """SBX's PPO is a reference row: never in a default run; without SBX installed, a clear message."""
    import builtins

    throughput = runpy.run_path(str(SCRIPTS / "throughput.py"))
    assert throughput["SBX"] in throughput["VARIANTS"] and throughput["SBX"] in throughput["OPTIONAL"]
    real_import = builtins.__import__

    def no_sbx(name, *args, **kwargs):
        if name == "sbx":
            raise ImportError("No module named 'sbx'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sbx)
    with pytest.raises(SystemExit, match="pip install sbx-rl"):
        throughput["sbx_ppo"]("MlpPolicy", "CartPole-v1")


def test_check_fast_tier_judges_bodies_not_def_lines(tmp_path: Path):
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    def_lines = {2, 7, 11, 12, 15, 18, 22, 26}  # what an import runs
    missing, without_code, judged = check_fast_tier.not_run({str(path.resolve()): def_lines}, [(path, "mod")])
    assert missing == ["mod.used", "mod.unused", "mod.Thing", "mod.Thing.__init__", "mod.Thing.method"]
    assert without_code == ["mod.Error"] and judged == 5
    ran = def_lines | {4, 13}  # used() and Thing() ran
    missing, _, _ = check_fast_tier.not_run({str(path.resolve()): ran}, [(path, "mod")])
    assert missing == ["mod.unused", "mod.Thing.method"]


def test_check_fast_tier_counts_an_installed_copy_of_a_repository_file():
    """CI installs the package (not editable): the startup hook runs from site-packages, and counts there."""
    hook = REPO_ROOT / "sb3_ppo_ext_zoo_hook.py"
    installed = "/venv/lib/python3.11/site-packages/sb3_ppo_ext_zoo_hook.py"
    none_ran, _, judged = check_fast_tier.not_run({}, [(hook, "sb3_ppo_ext_zoo_hook")])
    assert judged > 0 and len(none_ran) == judged
    all_lines = set(range(1, len(hook.read_text().splitlines()) + 1))
    missing, _, _ = check_fast_tier.not_run({installed: all_lines}, [(hook, "sb3_ppo_ext_zoo_hook")])
    assert missing == []


SOURCE = '''
def used(x):
    """Docstring."""
    return x


def unused(x):
    return x


class Thing:
    def __init__(self):
        self.x = 1

    def method(self):
        return 2

    def _private(self):
        return 3


class Error(ValueError):
    """No code of its own."""


def _helper():
    return 4
'''


def test_memory_check_samples_a_command_from_outside_and_fits_the_growth(tmp_path: Path):
    """A child that logs 1,000 steps and keeps 8 MiB more every 0.3 s: the fitted growth is ~8,000 MiB per 1M steps."""
    import sys

    import memory_check  # scripts/memory_check.py

    child = (
        "import time\nkeep = []\nfor i in range(1, 11):\n"
        "    keep.append(bytearray(b'x') * (8 << 20))\n"
        "    print(f'| total_timesteps | {i * 1000} |', flush=True)\n    time.sleep(0.3)\n"
    )
    out = tmp_path / "memory.jsonl"
    result = memory_check.main(["--out", str(out), "--every", "0.05", "--", sys.executable, "-c", child])
    *samples, last = [json.loads(line) for line in out.read_text().splitlines()]
    assert last["summary"] == result and result["steps"] == 10_000 and len(samples) > 20
    assert 5_000 < result["rss_mb_per_million_steps_second_half"] < 11_000
    assert result["rss_mb_at_end"] - result["rss_mb_at_10pct"] > 50 and result["steps_per_cpu_second"] > 0
    flat = memory_check.summary([{"steps": s, "rss_mb": 100.0, "cpu_s": s / 1000} for s in range(0, 5000, 500)])
    assert flat["rss_mb_per_million_steps_second_half"] == 0.0 and flat["steps_per_cpu_second"] == 1000.0
