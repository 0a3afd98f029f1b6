"""The settings a run trains with: rl-zoo3's and the shipped yml entries, candidate entries and each variant's overrides.

A finished run or a checkpoint counts only while the settings it recorded are the ones a run would
train with now (:func:`changed_settings`, :func:`expected_hyperparams`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .suites import ALGOS, CANDIDATE, CONF_FILES, GAUSSIAN_HEAD_ONLY, REPO, SHIPPED_SETTINGS, SQUASHED_HEAD_ONLY, ZOO_OWN

if TYPE_CHECKING:
    from .records import RunSpec


def changed_settings(spec: RunSpec, recorded: dict[str, Any]) -> list[str]:
    """
    The settings whose value in ``recorded`` (a done marker's ``hyperparams``) differs from what
    ``spec`` would run with now, sorted; empty when they agree or cannot be determined up front.
    """
    expected = expected_hyperparams(spec)
    if expected is None:
        return []
    recorded = _comparable(recorded)
    return sorted(key for key in expected.keys() | recorded.keys() if expected.get(key) != recorded.get(key))


def _comparable(hyperparams: dict[str, Any]) -> dict[str, str]:
    """Hyperparameters as ``repr`` strings, without the budget (``n_timesteps``), as the marker records them."""
    return {
        key: value if isinstance(value, str) else repr(value) for key, value in hyperparams.items() if key != "n_timesteps"
    }


def expected_hyperparams(spec: RunSpec) -> dict[str, str] | None:
    """
    The settings ``spec`` would run with now (yml entry plus the variant's overrides), in the
    marker's form; ``None`` when they cannot be determined up front (then only the budget counts).
    """
    zoo_algo, overrides, _ = ALGOS[spec.algo]
    algo = SHIPPED_SETTINGS.get(spec.algo, zoo_algo)  # whose yml holds the entry
    if zoo_algo in ZOO_OWN and spec.algo not in SHIPPED_SETTINGS:
        entry, _ = _zoo_entry(zoo_algo, spec.env)
    elif spec.algo == CANDIDATE:
        entry = candidate_entry(spec.candidate, spec.env)
    elif spec.algo in CONF_FILES:
        from sb3_ppo_ext import settings

        entry = settings.load_hyperparams(spec.env, settings.HYPERPARAMS_DIR / CONF_FILES[spec.algo], algo)
    else:
        from sb3_ppo_ext import settings

        entry = settings.load_hyperparams(spec.env, settings.ALGORITHMS[algo].hyperparams, algo)
    if entry is None:
        return None
    merged = {**entry, **(zoo_overrides(spec.env, overrides, algo) if overrides else {})}
    return _comparable({key: repr(value) for key, value in merged.items()})


def candidate_entry(path: str | None, env_id: str) -> dict[str, Any]:
    """
    The entry for ``env_id`` in a candidate file: a yml of entries by env id, as
    ``scripts/zoo_study.py best`` writes them (rl-zoo3 reads the same file as its ``--conf-file``).
    """
    import yaml

    if path is None:
        raise ValueError(f"{CANDIDATE} needs a candidate entry: pass --candidate FILE (a yml of entries by env id)")
    try:
        entries = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"candidate file {path}: cannot read it as yml ({error})") from None
    if not isinstance(entries, dict) or not isinstance(entries.get(env_id), dict):
        found = sorted(map(str, entries)) if isinstance(entries, dict) else "no entries"
        raise ValueError(
            f"candidate file {path}: no entry (a mapping) for {env_id}; found {found}. "
            "Write one with: python scripts/zoo_study.py best --env ENV --storage ... --study-name ..."
        )
    return entries[env_id]


def shown_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (as markers record it), else as it is."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def _zoo_entries(zoo_algo: str) -> dict[str, Any]:
    """rl-zoo3's own ``<zoo_algo>.yml``, YAML anchors and merge keys resolved."""
    import rl_zoo3
    import yaml

    return yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{zoo_algo}.yml").read_text())


def _zoo_entry(zoo_algo: str, env_id: str) -> tuple[dict[str, Any] | None, str]:
    """
    rl-zoo3's ``<zoo_algo>.yml`` entry for ``env_id``, or, for a ``-v5`` env without one, its ``-v4``
    entry (rl-zoo3 2.9.2 has MuJoCo entries for v4 only).

    :return: the entry (None: none, rl-zoo3 decides) and where it comes from
    """
    entries = _zoo_entries(zoo_algo)
    if env_id in entries:
        return entries[env_id], f"rl_zoo3/hyperparams/{zoo_algo}.yml: {env_id}"
    name, _, version = env_id.rpartition("-v")
    v4 = f"{name}-v4"
    if version == "5" and v4 in entries:
        return entries[v4], f"rl_zoo3/hyperparams/{zoo_algo}.yml: {v4} (the v4 entry, applied to {env_id})"
    return None, f"rl_zoo3/hyperparams/{zoo_algo}.yml: default"


def zoo_config(zoo_algo: str, env_id: str, folder: str) -> tuple[str | None, str]:
    """
    The config file rl-zoo3 should read for its own ``zoo_algo`` on ``env_id``: its own yml (None)
    or, for a ``-v5`` env, a copy of the ``-v4`` entry under the v5 id in ``folder``.

    :return: the config path (None: rl-zoo3's default file) and the name of the entry used
    """
    import yaml

    entry, source = _zoo_entry(zoo_algo, env_id)
    if entry is None or env_id in _zoo_entries(zoo_algo):
        return None, source
    copy = Path(folder) / f"{zoo_algo}_v5_from_v4.yml"
    copy.write_text(yaml.safe_dump({env_id: entry}))
    return str(copy), source


def zoo_overrides(env_id: str, overrides: dict[str, Any], algo: str = "ppo_ext") -> dict[str, Any]:
    """
    The variant's overrides, with ``policy_kwargs`` merged into the shipped entry's own (the entry of
    ``algo``'s shipped yml: ``ppo_lstm_ext.yml`` for a RecurrentPPOExt variant). A variant
    that turns the squashed head off also leaves out the entry's settings of that head
    (:data:`SQUASHED_HEAD_ONLY`), which PPOExt rejects for a Gaussian head; a variant that takes the
    Beta head leaves out the Gaussian heads' settings (:data:`GAUSSIAN_HEAD_ONLY`), which it rejects.
    """
    if "policy_kwargs" not in overrides:
        return dict(overrides)
    from sb3_ppo_ext import settings

    yml = settings.ALGORITHMS[algo].hyperparams
    shipped = settings.load_hyperparams(env_id, yml, algo).get("policy_kwargs") or {}
    if not isinstance(shipped, dict):
        raise ValueError(f"{yml.name} {env_id}: policy_kwargs must be a mapping, got {shipped!r}")
    policy_kwargs = {**shipped, **overrides["policy_kwargs"]}
    if policy_kwargs.get("squash_output") is False:
        policy_kwargs = {key: value for key, value in policy_kwargs.items() if key not in SQUASHED_HEAD_ONLY}
    if policy_kwargs.get("action_dist") == "beta":
        policy_kwargs = {key: value for key, value in policy_kwargs.items() if key not in GAUSSIAN_HEAD_ONLY}
    return {**overrides, "policy_kwargs": policy_kwargs}
