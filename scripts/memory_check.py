"""A training command's memory and CPU time over its whole run, sampled from outside the process (Linux ``/proc``).

Runs the command and, every ``--every`` seconds, reads its resident memory (``VmRSS``), its CPU time (user + system,
all threads: EnvPool's included) and the last ``total_timesteps`` it logged (SB3's logger table, printed by rl-zoo3's
``train`` at ``--verbose 1``). Each sample is a JSON line in ``--out``; the summary gives the resident memory at 10 %,
50 % and 100 % of the steps, its growth per million steps over the second half (a least-squares line), and the
env-steps per CPU-second of the whole run:

    python scripts/memory_check.py --out logs/memory/hopper-5m.jsonl -- python -m rl_zoo3.train --algo ppo_ext \\
        --env Hopper-v5 --conf-file sb3_ppo_ext.hyperparams.envpool -n 5000000 --eval-freq -1 --num-threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

STEPS = re.compile(r"\|\s*total_timesteps\s*\|\s*(\d+)\s*\|")


def read_proc(pid: int) -> tuple[float, float]:
    """(resident MiB, CPU-seconds of all threads) of the live process ``pid``."""
    with open(f"/proc/{pid}/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kib / 1024, (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def summary(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Memory at 10 / 50 / 100 % of the steps, its growth per million steps over the second half, steps per CPU-s."""
    logged = [sample for sample in samples if sample["steps"] > 0]
    if len(logged) < 4:
        raise SystemExit(f"memory_check: {len(logged)} samples with logged steps; run longer or sample more often")
    total = logged[-1]["steps"]
    # Up to the first sample at the last logged step: later ones may catch the process freeing memory as it exits.
    logged = logged[: next(i for i, sample in enumerate(logged) if sample["steps"] >= total) + 1]

    def at(share: float) -> float:
        return next(sample["rss_mb"] for sample in logged if sample["steps"] >= share * total)

    half = [sample for sample in logged if sample["steps"] >= total / 2]
    mean_x = sum(sample["steps"] for sample in half) / len(half)
    mean_y = sum(sample["rss_mb"] for sample in half) / len(half)
    spread = sum((sample["steps"] - mean_x) ** 2 for sample in half)
    slope = sum((sample["steps"] - mean_x) * (sample["rss_mb"] - mean_y) for sample in half) / spread if spread else 0.0
    return {
        "steps": total,
        "rss_mb_at_10pct": at(0.1),
        "rss_mb_at_50pct": at(0.5),
        "rss_mb_at_end": logged[-1]["rss_mb"],
        "rss_mb_peak": max(sample["rss_mb"] for sample in samples),
        "rss_mb_per_million_steps_second_half": slope * 1e6,
        "steps_per_cpu_second": total / logged[-1]["cpu_s"],
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON lines of the samples (the summary is the last line)")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between two samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.every <= 0:
        parser.error("give the command after -- and --every > 0")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    steps = [0]

    def follow() -> None:  # the child's output, its last logged step count kept
        for line in process.stdout or ():
            match = STEPS.search(line)
            if match:
                steps[0] = int(match.group(1))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    samples: list[dict[str, Any]] = []
    start = time.time()
    with open(args.out, "w") as out:
        while process.poll() is None:
            try:
                rss_mb, cpu_s = read_proc(process.pid)
            except (OSError, StopIteration):  # the process ended between poll and read
                break
            sample = {"wall_s": round(time.time() - start, 1), "cpu_s": cpu_s, "rss_mb": round(rss_mb, 1), "steps": steps[0]}
            samples.append(sample)
            out.write(json.dumps(sample) + "\n")
            out.flush()
            time.sleep(args.every)
        reader.join()
        if process.wait() != 0:
            raise SystemExit(f"memory_check: the command exited with {process.returncode}")
        result = summary(samples)
        out.write(json.dumps({"summary": result, "command": command}) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
