"""Start and read out rl-zoo3 ``-optimize`` studies of PPOExt.

``seed`` creates the study (direction "maximize", as rl-zoo3 creates it) and enqueues the shipped
``ppo_ext.yml`` entry as its first trial, so the study starts from the shipped settings and its
best trial is never worse than them on the study's own measure. Then run rl-zoo3's workers on the
same storage and study name (any number, on any machines for a database storage). ``best`` prints
the best trial as a ``ppo_ext.yml`` entry marked ``# Tuned`` with the study command (``# Candidate``
for a study of fewer than ``--min-trials`` finished trials, 50 by default), next to the
shipped entry's own result in the same study. ``status`` prints a study's progress (trials by state,
the best complete trial, the shipped entry's result); ``scripts/benchmark_report.py --study`` puts
the same line in the report.

    python scripts/zoo_study.py seed --env LunarLanderContinuous-v3 --storage logs/ll.log --study-name ppo_ext-ll
    python -m rl_zoo3.train --algo ppo_ext --env LunarLanderContinuous-v3 -optimize --n-trials 8 \\
        -n 300000 --storage logs/ll.log --study-name ppo_ext-ll        # one or more workers
    python scripts/zoo_study.py best --env LunarLanderContinuous-v3 --storage logs/ll.log --study-name ppo_ext-ll \\
        --command "python -m rl_zoo3.train --algo ppo_ext ... -optimize ..."

A tuned entry is the shipped entry with the trial's sampled settings on top, exactly what
rl-zoo3 trained in that trial (it keeps the keys the space does not sample, such as ``n_envs``,
``normalize`` and ``vf_coef``, from the entry).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import optuna
import yaml

from sb3_ppo_ext.hyperparams import PPO_EXT_YML, load_hyperparams
from sb3_ppo_ext.samplers import convert_zoo_params, params_from_zoo_entry
from sb3_ppo_ext.storage import make_storage

SHIPPED_ATTR = "shipped_entry"
# Finished (complete or pruned) trials a study needs for its best trial to be called tuned.
MIN_TUNED_TRIALS = 50


def _is_continuous(env_id: str) -> bool:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return isinstance(env.action_space, gym.spaces.Box)
    finally:
        env.close()


def seed_study(env_id: str, storage: str, study_name: str, entry: dict[str, Any] | None = None) -> optuna.Study:
    """
    Create (or open) the study and enqueue the entry's settings once (a second call enqueues nothing).

    :param env_id: gymnasium env id (its ``ppo_ext.yml`` entry is the starting point)
    :param storage: Optuna storage URL or journal file path, as rl-zoo3's ``--storage`` takes it
    :param study_name: the study's name, as rl-zoo3's ``--study-name`` takes it
    :param entry: settings to enqueue instead of the shipped entry
    :return: the study
    """
    entry = load_hyperparams(env_id) if entry is None else entry
    params = params_from_zoo_entry(entry, continuous=_is_continuous(env_id))
    study = optuna.create_study(
        storage=make_storage(storage), study_name=study_name, direction="maximize", load_if_exists=True
    )
    study.enqueue_trial(params, user_attrs={SHIPPED_ATTR: True}, skip_if_exists=True)
    return study


def tuned_entry(env_id: str, trial: optuna.trial.FrozenTrial, entry: dict[str, Any] | None = None) -> dict[str, Any]:
    """The yml entry that reproduces ``trial``: the shipped entry with the trial's settings on top."""
    entry = load_hyperparams(env_id) if entry is None else entry
    return {**entry, **convert_zoo_params(trial.params)}


def _best_and_shipped(
    trials: list[optuna.trial.FrozenTrial],
) -> tuple[list[optuna.trial.FrozenTrial], optuna.trial.FrozenTrial | None, optuna.trial.FrozenTrial | None]:
    """The complete trials, the best of them (None: none complete) and the shipped entry's trial in any state."""
    complete = [trial for trial in trials if trial.state == optuna.trial.TrialState.COMPLETE]
    shipped = next((trial for trial in trials if trial.user_attrs.get(SHIPPED_ATTR)), None)
    return complete, max(complete, key=lambda trial: trial.value, default=None), shipped


def describe(study: optuna.Study) -> tuple[optuna.trial.FrozenTrial, optuna.trial.FrozenTrial | None, int]:
    """The best complete trial, the shipped entry's trial (if it completed) and the complete-trial count."""
    complete, best, shipped = _best_and_shipped(study.get_trials(deepcopy=False))
    if best is None:
        raise SystemExit(f"study {study.study_name!r} has no complete trial yet")
    return best, (shipped if shipped in complete else None), len(complete)


def entry_yaml(
    env_id: str,
    study: optuna.Study,
    command: str | None,
    min_trials: int = MIN_TUNED_TRIALS,
    entry: dict[str, Any] | None = None,
) -> str:
    """
    The yml block for ``env_id`` from the study's best trial: marked ``# Tuned`` when the study has
    at least ``min_trials`` finished (complete or pruned) trials, else ``# Candidate`` (a smaller
    study's best is a lead to validate, not a tuned entry; the report lists ``# Tuned`` entries only).
    ``entry``: the study's starting entry (default: the shipped ``ppo_ext.yml`` one).
    """
    shipped_entry = load_hyperparams(env_id) if entry is None else entry
    best, shipped, n_complete = describe(study)
    n_pruned = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)))
    finished = n_complete + n_pruned
    label = "Tuned" if finished >= min_trials else f"Candidate (not tuned: {finished} finished trials < {min_trials})"
    lines = [
        f"# {label}: best of {n_complete} complete trials ({n_pruned} pruned) of study {study.study_name!r}: "
        f"trial {best.number}, {best.value:.1f}"
    ]
    if shipped is not None and best.number == shipped.number:
        # Written back as it was (same keys), so that results recorded with it stay valid.
        lines.append("#   = the shipped entry itself (enqueued as the first trial): no sampled configuration beat it")
        entry = shipped_entry
    else:
        if shipped is not None:
            lines.append(f"#   (the previous shipped entry, enqueued as trial {shipped.number}: {shipped.value:.1f})")
        entry = tuned_entry(env_id, best, shipped_entry)
    if command:
        lines.append(f"#   study command: {command}")
    block = yaml.safe_dump({env_id: entry}, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + block


def study_status(study: optuna.Study) -> str:
    """
    One paragraph on a study's progress: trials by state, the best complete trial and the shipped
    entry's own trial (for a study that is still running or was stopped, as the report shows it).
    """
    trials = study.get_trials(deepcopy=False)
    states = optuna.trial.TrialState
    counts = {state: sum(trial.state == state for trial in trials) for state in states}
    parts = [f"{counts[state]} {state.name.lower()}" for state in states if counts[state]]
    text = f"study {study.study_name!r}: {len(trials)} trials" + (f" ({', '.join(parts)})" if parts else "")
    complete, best, shipped = _best_and_shipped(trials)
    if best is not None:
        lowest = min(trial.value for trial in complete)
        text += f"; best complete trial {best.number}: {best.value:.1f} (complete trials {lowest:.1f} to {best.value:.1f})"
    if shipped is not None:
        result = f"{shipped.value:.1f}" if shipped.state == states.COMPLETE else shipped.state.name.lower()
        text += f"; the shipped entry (trial {shipped.number}): {result}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["seed", "best", "status"])
    parser.add_argument("--env", required=True)
    parser.add_argument("--storage", required=True, help="as rl-zoo3's --storage: database URL or journal file")
    parser.add_argument("--study-name", required=True)
    parser.add_argument("--command", help="the study command to record in the # Tuned comment")
    parser.add_argument("--conf-file", help=f"yml file of the starting entry (default: the shipped {PPO_EXT_YML.name})")
    parser.add_argument(
        "--min-trials",
        type=int,
        default=MIN_TUNED_TRIALS,
        help="finished trials a study needs for its best entry to be marked # Tuned (else # Candidate)",
    )
    args = parser.parse_args(argv)
    entry = None if args.conf_file is None else load_hyperparams(args.env, args.conf_file)
    if args.action == "seed":
        study = seed_study(args.env, args.storage, args.study_name, entry)
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        print(
            f"study {args.study_name!r}: {len(study.trials)} trials, {len(waiting)} waiting "
            f"(the {args.conf_file or PPO_EXT_YML.name} entry)"
        )
        return 0
    study = optuna.load_study(study_name=args.study_name, storage=make_storage(args.storage))
    if args.action == "status":
        print(study_status(study))
        return 0
    sys.stdout.write(entry_yaml(args.env, study, args.command, args.min_trials, entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
