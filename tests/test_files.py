"""The algorithms' model files (ModelFiles in sb3_ppo_ext.reliability).

Foreign, truncated and in-memory files; ``load`` running the constructor's checks; saved settings
checked; the beta carried on, or not, at load.
"""

from __future__ import annotations

import io
import json
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_ONE_BATCH, pendulum_vec_env
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, PPO, SAC
from stable_baselines3.common.logger import configure

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.reliability import (
    ForeignModelFileError,
    ModelFileError,
    check_model_file,
    model_family,
)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")

    def small() -> dict:  # a fresh policy_kwargs each: SB3 algorithms add to it
        return dict(policy_kwargs=dict(net_arch=[8]), device="cpu")

    models = {
        "PPOExt": PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, **small()),
        "PPO": PPO("MlpPolicy", "Pendulum-v1", n_steps=64, **small()),
        "A2C": A2C("MlpPolicy", "Pendulum-v1", **small()),
        "SAC": SAC("MlpPolicy", "Pendulum-v1", buffer_size=64, **small()),
        "MaskablePPO": MaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=8, n_invalid_actions=2), n_steps=64, **small()),
        "RecurrentPPO": RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=64, **small()),
    }
    paths = {}
    for name, model in models.items():
        paths[name] = folder / f"{name}.zip"
        model.save(paths[name])
    return paths


def _data(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("data"))


def test_model_family_of_real_files(model_files: dict[str, Path]):
    families = {name: model_family(_data(path)) for name, path in model_files.items()}
    assert families == {
        "PPOExt": "PPO",
        "PPO": "PPO",
        "A2C": "on-policy",
        "SAC": "SAC",
        "MaskablePPO": "MaskablePPO",
        "RecurrentPPO": "RecurrentPPO",
    }
    ppo_data = _data(model_files["PPO"])
    for module, family in [
        ("sb3_ppo_ext.maskable", "MaskablePPO"),
        ("sb3_ppo_ext.maskable_policies", "MaskablePPO"),
        ("sb3_ppo_ext.recurrent.policies", "RecurrentPPO"),
        ("sb3_ppo_ext.policies", "PPO"),
        ("my_project.policies", "PPO"),
    ]:
        assert model_family({**ppo_data, "policy_class": {"__module__": module}}) == family, module


@pytest.mark.parametrize(
    "saved_by, message",
    [
        ("MaskablePPO", r"saved by MaskablePPO \(its policy class comes from sb3_contrib\.common\.maskable\.policies\)"),
        ("RecurrentPPO", r"saved by RecurrentPPO \(its policy class comes from sb3_contrib\.common\.recurrent\.policies\)"),
    ],
)
def test_sb3_contrib_ppo_files_do_not_load_into_ppo_ext(model_files: dict[str, Path], saved_by: str, message: str):
    with pytest.raises(
        ForeignModelFileError, match=rf"{message}, not by the PPO family that PPOExt loads.*sb3_contrib\.{saved_by}"
    ):
        PPOExt.load(model_files[saved_by], device="cpu")


def test_file_objects_are_checked_too(model_files: dict[str, Path]):
    """An A2C zip in a BytesIO is rejected like its path; a good BytesIO loads; the position is kept."""
    foreign = io.BytesIO(model_files["A2C"].read_bytes())
    with pytest.raises(ForeignModelFileError, match=r"<BytesIO> was saved by another on-policy algorithm"):
        PPOExt.load(foreign, device="cpu")
    good = io.BytesIO(model_files["PPOExt"].read_bytes())
    good.seek(7)
    assert check_model_file(good, "PPOExt", {"PPO"}) is good and good.tell() == 7
    assert isinstance(PPOExt.load(io.BytesIO(model_files["PPOExt"].read_bytes()), device="cpu"), PPOExt)
    with open(model_files["SAC"], "rb") as file, pytest.raises(ForeignModelFileError, match=r"SAC\.zip was saved by SAC"):
        PPOExt.load(file, device="cpu")


def test_truncated_files_are_reported_as_truncated(model_files: dict[str, Path], tmp_path: Path):
    """Cut anywhere (zipfile alone reads most cuts as an embedded .pth archive), the file is "truncated or corrupt"."""
    data = model_files["PPOExt"].read_bytes()
    broken = tmp_path / "cut.zip"
    for size in range(1, len(data), 61):
        broken.write_bytes(data[:size])
        with pytest.raises(ModelFileError, match=r"cut\.zip is truncated or corrupt: it starts as a zip archive"):
            check_model_file(broken, "PPOExt", {"PPO"})


def test_a_file_that_is_not_a_zip_keeps_sb3s_words(tmp_path: Path):
    text = tmp_path / "notes.zip"
    text.write_text("not a model\n")
    with pytest.raises(
        ModelFileError, match=rf"is not a valid zip archive: the file {re.escape(str(text))} wasn't a zip-file"
    ):
        PPOExt.load(text, device="cpu")


LSTM_TINY = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8), device="cpu")


FAMILY = {
    "PPOExt": (PPOExt, "MlpPolicy", pendulum_vec_env, TINY_ONE_BATCH),
    "MaskablePPOExt": (
        MaskablePPOExt,
        "MlpPolicy",
        lambda: InvalidActionEnvDiscrete(dim=8, n_invalid_actions=2),
        TINY_ONE_BATCH,
    ),
    "RecurrentPPOExt": (RecurrentPPOExt, "MlpLstmPolicy", pendulum_vec_env, LSTM_TINY),
}


# Upstream algorithm (same family) of each class, for files saved by stock PPO / MaskablePPO / RecurrentPPO.
UPSTREAM = {"PPOExt": PPO, "MaskablePPOExt": MaskablePPO, "RecurrentPPOExt": RecurrentPPO}


BAD_LOAD_SETTINGS = [
    dict(gamma=1.5),
    dict(gae_lambda=-1),
    dict(normalize_advantage="false"),
    dict(n_epochs=0),
    dict(n_steps=0),
    dict(batch_size=1),
    dict(learning_rate=-1.0),
    dict(ent_coef=float("nan")),
    dict(vf_coef="0.5"),
    dict(max_grad_norm=float("nan")),
    dict(target_kl=-0.1),
    dict(clip_range=-0.2),
    dict(kl_coef=-1.0),
    dict(kl_coef_bounds=(1.0, 0.5)),
    dict(kl_adapt_factor=1.0),
]


def _fresh(kwargs: dict) -> dict:
    """A copy with a fresh policy_kwargs (SB3 algorithms add to it)."""
    return {**kwargs, "policy_kwargs": dict(kwargs["policy_kwargs"])}


def _new(name: str, **kwargs):
    algorithm, policy, env, tiny = FAMILY[name]
    return algorithm(policy, env(), **{**_fresh(tiny), **kwargs})


@pytest.fixture(scope="module")
def family_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per class: its own file with the penalty off ("off"), fixed beta 1 ("fixed"), adapted beta ("adaptive"), and
    a file of the upstream algorithm ("upstream")."""
    folder = tmp_path_factory.mktemp("family")
    files = {}
    for name, (_, policy, env, tiny) in FAMILY.items():
        for kind, kwargs in {"off": {}, "fixed": dict(kl_coef=1.0), "adaptive": dict(kl_coef=1.0, kl_target=10.0)}.items():
            model = _new(name, seed=0, **kwargs)
            if kind == "adaptive":
                model.learn(32)
                assert model.current_kl_coef == 0.5  # one update below the target halves beta
            files[f"{name}/{kind}"] = folder / f"{name}-{kind}.zip"
            model.save(files[f"{name}/{kind}"])
        files[f"{name}/upstream"] = folder / f"{name}-upstream.zip"
        UPSTREAM[name](policy, env(), **_fresh(tiny)).save(files[f"{name}/upstream"])
    return files


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize("bad", BAD_LOAD_SETTINGS, ids=lambda bad: next(iter(bad)))
def test_load_runs_the_constructors_checks(family_files: dict[str, Path], name: str, bad: dict):
    """load(path, **kwargs) raises the constructor's own error for every setting the constructor checks."""
    from sb3_ppo_ext.validation import InvalidSettingError

    with pytest.raises(InvalidSettingError) as constructed:
        _new(name, **bad)
    with pytest.raises(InvalidSettingError) as loaded:
        FAMILY[name][0].load(family_files[f"{name}/off"], device="cpu", **bad)
    assert str(loaded.value) == str(constructed.value)
    assert not isinstance(loaded.value, ModelFileError)  # the keyword argument is to blame, not the file


def test_load_checks_n_steps_times_n_envs_like_ppos_constructor(family_files: dict[str, Path]):
    with pytest.raises(AssertionError, match=r"n_steps \* n_envs"):
        PPOExt.load(family_files["PPOExt/off"], env=pendulum_vec_env(), n_steps=1)
    assert PPOExt.load(family_files["PPOExt/off"], n_steps=1).n_steps == 1  # no env: nothing to multiply


def _rewrite_data(source: Path, target: Path, **changes) -> Path:
    """A copy of the model file ``source`` whose saved attributes ``changes`` are replaced (in its ``data`` JSON)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for info in original.infolist():
            content = original.read(info.filename)
            if info.filename == "data":
                content = json.dumps({**json.loads(content), **changes}).encode()
            copy.writestr(info, content)
    return target


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize(
    "saved, message",
    [
        (dict(current_kl_coef=float("nan")), r"current_kl_coef=nan is invalid: expected a finite number >= 0"),
        (dict(current_kl_coef="0.5"), r"current_kl_coef='0\.5' is invalid"),
        (dict(current_kl_coef=None), r"current_kl_coef=None is invalid"),
        (dict(current_kl_coef=-5), r"current_kl_coef=-5 is invalid"),
        (dict(current_kl_coef=1e5), r"current_kl_coef=100000\.0 \(the adaptive beta carried on\) is invalid: .*_bounds"),
        (dict(gamma=1.5), r"gamma=1\.5 is invalid"),
        (dict(n_epochs=0), r"n_epochs=0 is invalid"),
        (dict(normalize_advantage=True, batch_size=1), r"batch_size=1 is invalid with normalize_advantage=True"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_bad_saved_settings_are_model_file_errors_naming_the_file(
    family_files: dict[str, Path], tmp_path: Path, name: str, saved: dict, message: str
):
    """A file whose saved live beta (or another saved setting) is invalid does not load (a NaN beta turned the penalty off)."""
    broken = _rewrite_data(family_files[f"{name}/adaptive"], tmp_path / "broken.zip", **saved)
    where = rf"{name}\.load: model file {re.escape(str(broken))}"
    with pytest.raises(ModelFileError, match=rf"{where} holds an invalid setting: {message}"):
        FAMILY[name][0].load(broken, device="cpu")


def test_a_bad_saved_setting_mended_at_load_loads(family_files: dict[str, Path], tmp_path: Path):
    broken = _rewrite_data(family_files["PPOExt/off"], tmp_path / "broken.zip", gamma=1.5)
    assert PPOExt.load(broken, device="cpu", gamma=0.9).gamma == 0.9


def _beta_used(model) -> float:
    """The beta of one update: ``train/kl_coef`` as logged (and the live beta after it, for a fixed beta)."""
    model.set_logger(configure(None, []))
    model.learn(32, reset_num_timesteps=False)
    return model.logger.name_to_value["train/kl_coef"]


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize("saved", ["off", "upstream"])
def test_a_penalty_switched_on_at_load_starts_at_the_given_kl_coef(family_files: dict[str, Path], name: str, saved: str):
    algorithm, _, env, _ = FAMILY[name]
    model = algorithm.load(family_files[f"{name}/{saved}"], env=env(), device="cpu", kl_coef=0.5)
    assert model.current_kl_coef == 0.5 and _beta_used(model) == 0.5 and model.current_kl_coef == 0.5
    adaptive = algorithm.load(family_files[f"{name}/{saved}"], env=env(), device="cpu", kl_coef=0.5, kl_target=10.0)
    assert adaptive.current_kl_coef == 0.5 and _beta_used(adaptive) == 0.5 and adaptive.current_kl_coef == 0.25


@pytest.mark.parametrize("name", list(FAMILY))
def test_a_fixed_beta_is_the_configured_kl_coef(family_files: dict[str, Path], name: str):
    algorithm, _, env, _ = FAMILY[name]
    model = algorithm.load(family_files[f"{name}/fixed"], env=env(), device="cpu", kl_coef=0.1)
    assert model.current_kl_coef == 0.1 and _beta_used(model) == 0.1
    # an adaptive file made fixed: its beta is kl_coef (the configured value), not the adapted one
    fixed = algorithm.load(family_files[f"{name}/adaptive"], env=env(), device="cpu", kl_target=None)
    assert fixed.current_kl_coef == 1.0 and _beta_used(fixed) == 1.0


@pytest.mark.parametrize("name", list(FAMILY))
def test_an_adaptive_beta_carries_on_unless_kl_coef_is_changed_at_load(family_files: dict[str, Path], name: str):
    algorithm, _, env, _ = FAMILY[name]
    path = family_files[f"{name}/adaptive"]
    assert algorithm.load(path, device="cpu").current_kl_coef == 0.5
    # the saved kl_coef given again (as rl-zoo3's -i passes the yml's): the adapted beta carries on
    again = algorithm.load(path, env=env(), device="cpu", kl_coef=1.0, kl_target=10.0)
    assert again.current_kl_coef == 0.5 and _beta_used(again) == 0.5
    restarted = algorithm.load(path, env=env(), device="cpu", kl_coef=0.2)
    assert restarted.current_kl_coef == 0.2 and _beta_used(restarted) == 0.2
    assert algorithm.load(path, device="cpu", current_kl_coef=0.3).current_kl_coef == 0.3  # the live beta set directly
    with pytest.raises(ValueError, match=r"current_kl_coef=0\.5 \(the adaptive beta carried on\) is invalid: .*\(0\.9, 2"):
        algorithm.load(path, device="cpu", kl_coef_bounds=(0.9, 2.0))


def test_stock_recurrent_ppo_training_a_squashed_ext_file_warns_once(tmp_path: Path):
    from sb3_ppo_ext import RecurrentPPOExt
    from sb3_ppo_ext.policies import SquashedActionsWarning

    lstm = dict(TINY_ONE_BATCH, n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SquashedActionsWarning)
        ext = RecurrentPPOExt("MlpLstmPolicy", pendulum_vec_env(), **lstm)
        ext.learn(16)  # its own collection squashes the actions it sends
        ext.save(tmp_path / "ext")
        RecurrentPPOExt.load(tmp_path / "ext", env=pendulum_vec_env()).learn(16)
        stock = RecurrentPPO.load(tmp_path / "ext", env=pendulum_vec_env())
        obs = stock.get_env().reset()
        action, _ = stock.predict(obs, episode_start=np.ones(1, dtype=bool))  # predict squashes under either class
        assert action.shape == (1, 1)
        unsquashed = dict(lstm, policy_kwargs=dict(lstm["policy_kwargs"], squash_output=False))
        RecurrentPPOExt("MlpLstmPolicy", pendulum_vec_env(), **unsquashed).save(tmp_path / "unsquashed")
        RecurrentPPO.load(tmp_path / "unsquashed", env=pendulum_vec_env()).learn(16)  # upstream's head: nothing to warn of
    with pytest.warns(SquashedActionsWarning, match=r"sb3_contrib\.RecurrentPPO\.load.*RecurrentPPOExt\.load") as caught:
        stock.learn(32)
    assert len([w for w in caught if w.category is SquashedActionsWarning]) == 1  # once, not every step
