"""The ppo_ext search space, its converter, the shipped yml and the storage helper (in-process, no subprocess)."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import gymnasium as gym
import optuna
import pytest
import yaml
from helpers import modules_after_imports
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.hyperparams import PPO_EXT_YML
from sb3_ppo_ext.samplers import (
    convert_zoo_params,
    params_from_zoo_entry,
    ppo_ext_kwargs_from_params,
    sample_ppo_ext_params,
    sample_zoo_form,
    sample_zoo_params,
)
from sb3_ppo_ext.storage import StorageError, make_storage
from sb3_ppo_ext.validation import InvalidSettingError, activation_class, to_algorithm_kwargs
from sb3_ppo_ext.zoo_support import ZooConfigError, check_hyperparams

optuna.logging.set_verbosity(optuna.logging.WARNING)

N_CONFIGS = 200
N_LEARN = 20
# Settings of a yml entry that rl-zoo3 consumes itself before calling the algorithm.
ZOO_ONLY_KEYS = {"n_envs", "n_timesteps", "normalize", "env_wrapper", "vec_env_wrapper", "callback", "frame_stack"}


def _sampled_trials(n: int) -> list[tuple[optuna.trial.FrozenTrial, dict, bool]]:
    """``n`` trials of a random-sampler study: (trial, zoo-form settings, continuous); every 4th on a discrete env."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    asked = []
    for index in range(n):
        continuous = index % 4 != 3
        trial = study.ask()
        asked.append((sample_zoo_form(trial, continuous=continuous), continuous))
        study.tell(trial, 0.0)
    # the finished trials once, at the end (study.trials deep-copies every trial on each access)
    return [(trial, settings, continuous) for trial, (settings, continuous) in zip(study.trials, asked, strict=True)]


@pytest.fixture(scope="module")
def sampled():
    return _sampled_trials(N_CONFIGS)


@pytest.fixture(scope="module")
def envs():
    box = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    discrete = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    yield {True: box, False: discrete}
    box.close()
    discrete.close()


def test_200_sampled_configurations_construct(sampled, envs):
    assert len(sampled) == 200
    for _, settings, continuous in sampled:
        model = PPOExt("MlpPolicy", envs[continuous], device="cpu", **to_algorithm_kwargs(settings))
        assert (model.n_steps, model.batch_size, model.n_epochs) == (
            settings["n_steps"],
            settings["batch_size"],
            settings["n_epochs"],
        )
        assert model.kl_coef == settings.get("kl_coef", 0.0) and model.policy is not None


def test_20_sampled_configurations_learn_one_iteration(sampled):
    """One rollout and one update each; the rollout is capped at 128 steps (the batch kept <= the rollout) to stay tiny."""
    for trial, settings, continuous in sampled[:N_LEARN]:
        tiny = {**settings, "n_steps": min(settings["n_steps"], 128), "batch_size": min(settings["batch_size"], 128)}
        env = DummyVecEnv([lambda continuous=continuous: gym.make("Pendulum-v1" if continuous else "CartPole-v1")])
        model = PPOExt("MlpPolicy", env, device="cpu", seed=trial.number, **to_algorithm_kwargs(tiny))
        model.learn(total_timesteps=model.n_steps)
        assert model._n_updates > 0, trial.params
        env.close()


def test_space_covers_every_branch(sampled):
    """Each conditional branch is reached, and conditional parameters exist only in their branch."""
    keys = ("objective", "vf_clip", "exploration", "squash", "lr_schedule", "kl_adaptive", "action_dist", "separate_lr")
    seen = {key: set() for key in keys}
    for trial, settings, continuous in sampled:
        params = trial.params
        for key in seen:
            if key in params:
                seen[key].add(params[key])
        assert ("clip_range" in params) == ("clip" in params["objective"])
        assert ("kl_coef" in params) == ("kl" in params["objective"])
        assert ("kl_target" in params) == bool(params.get("kl_adaptive"))
        assert ("clip_range_vf" in params) == (params["vf_clip"] != "none")
        assert ("squash" in params) == continuous
        assert ("action_dist" in params) == bool(params.get("squash"))
        beta = params.get("action_dist") == "beta"
        assert ("entropy_estimator" in params) == (bool(params.get("squash")) and not beta)
        assert ("exploration" in params) == ("log_std_init" in params) == (continuous and not beta)
        assert ("sde_sample_freq" in params) == (params.get("exploration") == "gsde")
        assert ("lr_vf_ratio" in params) == params["separate_lr"]
        assert ("learning_rates" in settings["policy_kwargs"]) == params["separate_lr"]
        assert (settings["policy_kwargs"].get("action_dist") == "beta") == beta
        assert settings["batch_size"] <= settings["n_steps"]
        assert trial.user_attrs["n_steps"] == settings["n_steps"] and math.isclose(
            trial.user_attrs["gamma"], settings["gamma"]
        )
    assert seen["objective"] == {"clip", "kl", "clip+kl"}
    assert seen["vf_clip"] == {"none", "clipped", "max"}
    assert seen["exploration"] == {"gaussian", "state_dependent_std", "gsde"}
    assert seen["squash"] == seen["kl_adaptive"] == seen["separate_lr"] == {True, False}
    assert seen["action_dist"] == {"gaussian", "beta"}
    assert seen["lr_schedule"] == {"constant", "linear"}


def test_converter_replays_the_sampler(sampled):
    for trial, settings, _ in sampled:
        assert convert_zoo_params(trial.params) == settings
        kwargs = ppo_ext_kwargs_from_params(trial.params)
        if isinstance(settings["learning_rate"], str):
            assert math.isclose(kwargs["learning_rate"](1.0), float(settings["learning_rate"][4:]))
            assert kwargs["learning_rate"](0.0) == 0.0


def test_sample_ppo_ext_params_returns_objects():
    trial = optuna.trial.FixedTrial(
        {
            "n_steps_pow": 6,
            "batch_size_pow": 9,
            "one_minus_gamma": 0.01,
            "one_minus_gae_lambda": 0.05,
            "n_epochs": 5,
            "learning_rate": 1e-3,
            "lr_schedule": "linear",
            "max_grad_norm": 0.5,
            "ent_coef": 1e-4,
            "target_kl": None,
            "objective": "kl",
            "kl_coef": 1.0,
            "kl_adaptive": True,
            "kl_target": 0.01,
            "vf_clip": "max",
            "clip_range_vf": 0.2,
            "net_arch": "tiny",
            "activation_fn": "relu",
            "ortho_init": False,
            "squash": True,
            "action_dist": "gaussian",
            "exploration": "state_dependent_std",
            "log_std_init": -1.0,
            "entropy_estimator": "mc",
            "separate_lr": True,
            "lr_vf_ratio": 4.0,
        }
    )
    kwargs = sample_ppo_ext_params(trial)
    assert kwargs["batch_size"] == kwargs["n_steps"] == 64  # batch clamped to the rollout
    assert kwargs["clip_range"] is None and kwargs["kl_coef"] == 1.0 and kwargs["kl_target"] == 0.01
    assert kwargs["vf_clip_mode"] == "max" and kwargs["clip_range_vf"] == 0.2
    assert kwargs["policy_kwargs"]["activation_fn"] is activation_class("relu")
    assert kwargs["policy_kwargs"]["state_dependent_std"] is True and kwargs["use_sde"] is False
    assert callable(kwargs["learning_rate"])
    assert kwargs["policy_kwargs"]["learning_rates"] == {"pi": "lin_0.001", "vf": "lin_0.004"}


def test_activation_names():
    assert activation_class("tanh") is activation_class("nn.Tanh") is activation_class("torch.nn.Tanh")
    with pytest.raises(ValueError, match=r"activation_fn='nn\.Sigmoidal'"):
        activation_class("nn.Sigmoidal")


def _yml_entries():
    with open(PPO_EXT_YML) as file:
        return yaml.safe_load(file)


REQUIRED_ENVS = [
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "LunarLanderContinuous-v3",
    "BipedalWalker-v3",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Swimmer-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
    "Reacher-v5",
    "CartPole-v1",
    "LunarLander-v3",
    "Acrobot-v1",
    "default",
]


@pytest.mark.parametrize("env_id", REQUIRED_ENVS)
def test_yml_entry_is_valid(env_id):
    """Every required entry exists and passes the same check rl-zoo3 registration applies."""
    entries = _yml_entries()
    assert env_id in entries
    settings = {k: v for k, v in entries[env_id].items() if k not in ZOO_ONLY_KEYS}
    checked = check_hyperparams(settings, f"ppo_ext.yml ({env_id})")
    assert "n_timesteps" in entries[env_id] and "policy" in entries[env_id]
    if isinstance(checked.get("policy_kwargs"), dict):
        assert not isinstance(checked["policy_kwargs"].get("activation_fn"), str)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "CartPole-v1", "Acrobot-v1"])
def test_yml_entry_constructs(env_id):
    entry = {k: v for k, v in _yml_entries()[env_id].items() if k not in ZOO_ONLY_KEYS}
    PPOExt(env=DummyVecEnv([lambda: gym.make(env_id)]), device="cpu", **to_algorithm_kwargs(check_hyperparams(entry, env_id)))


def test_check_hyperparams_names_unknown_and_reserved():
    with pytest.raises(ZooConfigError, match=r"unknown key 'kl_targt' \(did you mean 'kl_target'\?\)"):
        check_hyperparams({"kl_targt": 0.01}, "x.yml")
    with pytest.raises(ZooConfigError, match="'seed' is set by rl-zoo3 itself"):
        check_hyperparams({"seed": 1}, "x.yml")
    with pytest.raises(ZooConfigError, match="activation_fn='swish'"):
        check_hyperparams({"policy_kwargs": {"activation_fn": "swish"}}, "x.yml")


def test_make_storage(tmp_path):
    assert make_storage(None) is None
    sqlite = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert isinstance(sqlite, optuna.storages.RDBStorage)
    journal = make_storage(str(tmp_path / "sub" / "study.log"))
    assert isinstance(journal, optuna.storages.JournalStorage)
    with pytest.raises(StorageError, match=r"postgresql://user:\*\*\*@127\.0\.0\.1:9/db"):
        make_storage("postgresql://user:secret@127.0.0.1:9/db")
    with pytest.raises(StorageError, match="neither a database URL"):
        make_storage("study.db")


def test_importing_the_package_imports_neither_rl_zoo3_nor_optuna():
    loaded = modules_after_imports()["sb3_ppo_ext.samplers"]  # after sb3_ppo_ext, its zoo module and the samplers
    assert {"sb3_ppo_ext", "sb3_ppo_ext.zoo", "sb3_ppo_ext.samplers"} <= loaded
    assert sorted(m for m in ("rl_zoo3", "optuna") if m in loaded) == []


# --- entry -> trial params (warm-starting a study with the shipped entry) ----------------------

# Every key the search space samples, in yml form (``policy_kwargs`` compared on its own).
SAMPLED_KEYS = {"n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "learning_rate", "max_grad_norm", "ent_coef"}


@pytest.mark.parametrize(
    "env_id", ["Pendulum-v1", "LunarLanderContinuous-v3", "HalfCheetah-v5", "Hopper-v5", "LunarLander-v3", "default"]
)
def test_params_from_entry_replay_to_the_entry(env_id):
    """The sampler, replayed on the inverse's params, gives back the entry's own values."""
    entry = _yml_entries()[env_id]
    continuous = env_id != "LunarLander-v3"
    replayed = convert_zoo_params(params_from_zoo_entry(entry, continuous=continuous))
    for key in SAMPLED_KEYS & set(entry):
        if isinstance(entry[key], str):  # a schedule, "lin_<initial value>"
            kind, _, initial = entry[key].partition("_")
            replayed_kind, _, replayed_initial = replayed[key].partition("_")
            assert replayed_kind == kind and float(replayed_initial) == pytest.approx(float(initial), rel=1e-12), key
            continue
        expected = max(entry[key], 1e-8) if key == "ent_coef" else entry[key]
        assert replayed[key] == pytest.approx(expected, rel=1e-12), key
    assert replayed["clip_range"] == entry.get("clip_range", 0.2)
    assert replayed["kl_coef"] == entry.get("kl_coef", 0.0)
    assert replayed.get("target_kl") == entry.get("target_kl")
    assert replayed["clip_range_vf"] == entry.get("clip_range_vf")
    assert replayed.get("vf_clip_mode", "clipped") == entry.get("vf_clip_mode", "clipped")
    assert replayed.get("use_sde", False) == entry.get("use_sde", False)
    if entry.get("use_sde"):
        assert replayed["sde_sample_freq"] == entry["sde_sample_freq"]
    shipped_policy = entry.get("policy_kwargs") or {}
    for key, value in shipped_policy.items():
        assert replayed["policy_kwargs"][key] == value, key
    assert replayed["policy_kwargs"]["net_arch"] == shipped_policy.get("net_arch", dict(pi=[64, 64], vf=[64, 64]))
    if continuous:
        assert replayed["policy_kwargs"]["squash_output"] is True


def test_params_from_entry_covers_penalty_and_value_clip():
    entry = {
        "clip_range": None,
        "kl_coef": 0.5,
        "kl_target": 0.01,
        "clip_range_vf": 0.2,
        "vf_clip_mode": "max",
        "learning_rate": "lin_0.0003",
        "policy_kwargs": {"state_dependent_std": True, "entropy_estimator": "gaussian"},
    }
    params = params_from_zoo_entry(entry)
    assert params["objective"] == "kl" and params["kl_adaptive"] is True and params["vf_clip"] == "max"
    replayed = convert_zoo_params(params)
    for key in ("clip_range", "kl_coef", "kl_target", "clip_range_vf", "vf_clip_mode", "learning_rate"):
        assert replayed[key] == entry[key], key
    assert replayed["policy_kwargs"]["state_dependent_std"] is True
    assert replayed["policy_kwargs"]["entropy_estimator"] == "gaussian"


@pytest.mark.parametrize(
    "policy_kwargs, learning_rate",
    [
        ({"action_dist": "beta"}, 3e-4),
        ({"action_dist": "beta", "learning_rates": {"pi": "lin_0.0003", "vf": "lin_0.0012"}}, "lin_0.0003"),
        ({"learning_rates": {"pi": 3e-4, "vf": 1.5e-4}}, 3e-4),
    ],
)
def test_params_from_entry_replay_the_head_and_the_learning_rates(policy_kwargs, learning_rate):
    entry = {"learning_rate": learning_rate, "policy_kwargs": policy_kwargs}
    params = params_from_zoo_entry(entry)
    replayed = convert_zoo_params(params)
    assert replayed["learning_rate"] == learning_rate
    assert replayed["policy_kwargs"].get("action_dist", "gaussian") == policy_kwargs.get("action_dist", "gaussian")
    if policy_kwargs.get("action_dist") == "beta":
        assert "log_std_init" not in replayed["policy_kwargs"] and "entropy_estimator" not in replayed["policy_kwargs"]
    expected, got = policy_kwargs.get("learning_rates"), replayed["policy_kwargs"].get("learning_rates")
    assert (expected is None) == (got is None)
    if expected is not None:
        as_float = lambda rate: float(rate[4:]) if isinstance(rate, str) else rate  # noqa: E731
        assert got["pi"] == expected["pi"] and as_float(got["vf"]) == pytest.approx(as_float(expected["vf"]), rel=1e-12)
    PPOExt("MlpPolicy", "Pendulum-v1", device="cpu", **to_algorithm_kwargs(replayed))


def test_trials_from_before_the_head_and_rate_parameters_replay_as_before(sampled):
    """A study's params without action_dist / separate_lr (the space before them) replay to the Gaussian head, one rate."""
    trial, settings, _ = next(
        t for t in sampled if t[0].params.get("action_dist") == "gaussian" and not t[0].params["separate_lr"]
    )
    old = {key: value for key, value in trial.params.items() if key not in ("action_dist", "separate_lr")}
    assert convert_zoo_params(old) == settings


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"policy_kwargs": {"learning_rates": {"pi": 1e-3, "vf": 1e-3}}}, "the search space has the actor at learning_rate"),
        ({"n_steps": 8}, "n_steps=8 is not a power of 2"),
        ({"clip_range": 0.18}, "clip_range=0.18 is invalid: expected one of"),
        ({"clip_range": "lin_0.2"}, "constant clip ranges only"),
        ({"learning_rate": 0.5}, "learning_rate=0.5 is outside"),
        ({"gamma": 0.5}, "one_minus_gamma=0.5 is outside"),
        ({"clip_range": None}, "no policy objective"),
        ({"policy_kwargs": {"net_arch": [32]}}, "net_arch=[32]"),
        ({"policy_kwargs": {"squash_output": "false"}}, "policy_kwargs.squash_output='false' is invalid"),
        ({"policy_kwargs": {"state_dependent_std": "false"}}, "policy_kwargs.state_dependent_std='false' is invalid"),
        ({"use_sde": "false"}, "use_sde='false' is invalid"),
    ],
)
def test_params_from_entry_rejects_values_outside_the_space(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        params_from_zoo_entry(entry)


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_zoo_study_seeds_the_shipped_entry_and_writes_a_tuned_entry(tmp_path):
    """``scripts/zoo_study.py``: the shipped entry is trial 0 (once), the best trial becomes a loadable entry."""
    from benchmarks.sections import tuned_comments  # the report's reader of # Tuned comments (scripts/benchmarks/)

    from sb3_ppo_ext.hyperparams import load_hyperparams

    spec = importlib.util.spec_from_file_location(
        "zoo_study", Path(__file__).resolve().parents[1] / "scripts" / "zoo_study.py"
    )
    zoo_study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_study)
    storage = str(tmp_path / "study.log")
    study = zoo_study.seed_study("Pendulum-v1", storage, "s")
    zoo_study.seed_study("Pendulum-v1", storage, "s")  # idempotent
    assert len(study.trials) == 1
    shipped = load_hyperparams("Pendulum-v1")
    first = study.ask()
    settings = sample_zoo_form(first, continuous=True)
    assert settings["gamma"] == pytest.approx(shipped["gamma"]) and settings["n_steps"] == shipped["n_steps"]
    study.tell(first, -300.0)
    second = study.ask()
    sample_zoo_form(second, continuous=True)
    study.tell(second, -150.0)
    # Two trials are a lead, not a tuning: marked # Candidate unless the bar is lowered (default 50 finished trials).
    toy = zoo_study.entry_yaml("Pendulum-v1", study, None)
    assert toy.startswith("# Candidate (not tuned: 2 finished trials < 50): best of 2 complete trials")
    assert "Pendulum-v1" not in tuned_comments(_written(tmp_path / "toy.yml", toy))
    text = zoo_study.entry_yaml("Pendulum-v1", study, "python -m rl_zoo3.train --algo ppo_ext -optimize", min_trials=2)
    assert text.startswith("# Tuned: best of 2 complete trials (0 pruned) of study 's': trial 1, -150.0")
    assert "trial 0: -300.0" in text and "study command: python -m rl_zoo3.train" in text
    written = tmp_path / "tuned.yml"
    written.write_text(text)
    entry = load_hyperparams("Pendulum-v1", written)
    assert entry == {**shipped, **convert_zoo_params(study.best_trial.params)}
    assert entry["n_envs"] == shipped["n_envs"]  # not sampled: kept from the shipped entry
    # When the shipped entry wins, it is written back as it was (same keys), marked as such.
    other = zoo_study.seed_study("Pendulum-v1", storage, "t")
    for value in (10.0, 5.0):
        trial = other.ask()
        sample_zoo_form(trial, continuous=True)
        other.tell(trial, value)
    text = zoo_study.entry_yaml("Pendulum-v1", other, None, min_trials=2)
    assert "= the shipped entry itself" in text
    written.write_text(text)
    assert load_hyperparams("Pendulum-v1", written) == shipped


def test_zoo_study_status_counts_trials_by_state(tmp_path):
    """``zoo_study.py status``: trials by state, the best complete trial and the shipped entry's result."""
    spec = importlib.util.spec_from_file_location(
        "zoo_study", Path(__file__).resolve().parents[1] / "scripts" / "zoo_study.py"
    )
    zoo_study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_study)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = zoo_study.seed_study("Pendulum-v1", storage, "s")
    assert zoo_study.study_status(study) == "study 's': 1 trials (1 waiting); the shipped entry (trial 0): waiting"
    shipped = study.ask()
    sample_zoo_form(shipped, continuous=True)
    study.tell(shipped, -300.0)
    for value in (-150.0, -900.0):
        trial = study.ask()
        sample_zoo_form(trial, continuous=True)
        study.tell(trial, value)
    pruned = study.ask()
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    study.ask()  # running
    assert zoo_study.study_status(study) == (
        "study 's': 6 trials (1 running, 3 complete, 1 pruned, 1 fail); best complete trial 1: -150.0 "
        "(complete trials -900.0 to -150.0); the shipped entry (trial 0): -300.0"
    )
    assert zoo_study.main(["status", "--env", "Pendulum-v1", "--storage", storage, "--study-name", "s"]) == 0


@pytest.mark.parametrize("racing", [True, False])
def test_storage_retries_only_the_table_creation_race(tmp_path, monkeypatch, racing):
    """SQLite workers started together: one sees "table studies already exists" and retries; other errors are not retried."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    real = optuna.storages.RDBStorage
    calls = []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            message = "table studies already exists" if racing else "unable to open database file"
            raise OperationalError("CREATE TABLE studies", {}, sqlite3.OperationalError(message))
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", flaky)
    url = f"sqlite:///{tmp_path / 'race.db'}"
    if racing:
        assert make_storage(url) is not None and len(calls) == 2
    else:
        with pytest.raises(StorageError, match="unable to open database file"):
            make_storage(url)
        assert len(calls) == 1


def test_many_env_rollouts_sample_the_minibatch_as_a_share_of_the_whole_rollout():
    """With n_envs > 1 the minibatch divides n_steps * n_envs (not one env's n_steps), the trial's params replay to the
    same settings without the entry, and the 32-env EnvPool entry seeds a study with its own minibatch of 512."""
    import optuna

    from sb3_ppo_ext.settings import HYPERPARAMS_DIR, load_hyperparams

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    batches = set()
    for _ in range(60):
        trial = study.ask()
        kwargs = sample_zoo_params(trial, n_actions=3, n_envs=12, additional_args={})
        rollout = kwargs["n_steps"] * 12
        assert rollout % kwargs["batch_size"] == 0 and 12 <= kwargs["batch_size"] <= rollout
        assert trial.params["n_envs"] == 12 and "batch_size_pow" not in trial.params
        assert convert_zoo_params(trial.params)["batch_size"] == kwargs["batch_size"]
        batches.add(rollout // kwargs["batch_size"])
    assert len(batches) > 4
    entry = load_hyperparams("Hopper-v5", HYPERPARAMS_DIR / "ppo_ext_envpool.yml")
    assert (entry["n_envs"], entry["n_steps"], entry["batch_size"]) == (32, 64, 128)
    assert convert_zoo_params(params_from_zoo_entry(entry))["batch_size"] == 128
    with pytest.raises(InvalidSettingError, match=r"batch_size=100 is not n_steps \* n_envs = 192"):
        params_from_zoo_entry({"n_envs": 3, "n_steps": 64, "batch_size": 100})


def test_zoo_study_seeds_and_writes_back_the_entry_of_a_conf_file(tmp_path, capsys):
    """``scripts/zoo_study.py --conf-file``: the study starts from that file's entry, and ``best`` writes it back."""
    spec = importlib.util.spec_from_file_location(
        "zoo_study", Path(__file__).resolve().parents[1] / "scripts" / "zoo_study.py"
    )
    zoo_study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo_study)
    from sb3_ppo_ext.settings import HYPERPARAMS_DIR, load_hyperparams

    conf, storage = str(HYPERPARAMS_DIR / "ppo_ext_envpool.yml"), str(tmp_path / "study.log")
    assert zoo_study.main(["seed", "--env", "Hopper-v5", "--storage", storage, "--study-name", "s", "--conf-file", conf]) == 0
    study = optuna.load_study(study_name="s", storage=make_storage(storage))
    trial = study.ask()  # the enqueued entry
    assert sample_zoo_params(trial, n_actions=3, n_envs=32, additional_args={})["batch_size"] == 128
    assert trial.params["n_envs"] == 32 and trial.params["n_minibatches_pow"] == 4
    study.tell(trial, 1000.0)
    capsys.readouterr()
    zoo_study.main(["best", "--env", "Hopper-v5", "--storage", storage, "--study-name", "s", "--conf-file", conf])
    written = yaml.safe_load(capsys.readouterr().out)["Hopper-v5"]
    assert written == load_hyperparams("Hopper-v5", conf) and written["env_backend"] == "envpool"
