"""Every preset x task x machine x override resolved as 00/01 resolve it (stages.resolve_run): the fixture
tests/fixtures/resolved_runs.json.gz pins them, so a change in how presets are declared cannot move a resolved value.
``python tests/resolved_runs.py`` rewrites the fixture (only when a change in resolved values is intended)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from kitlib.machine.hardware import fake_profile
from kitlib.notebook.params import Params
from kitlib.notebook.presets import PRESETS
from kitlib.notebook.stages import resolve_run
from kitlib.notebook.tasks import TASKS

FIXTURE = Path(__file__).parent / "fixtures" / "resolved_runs.json.gz"
MACHINES = ("CPU", "T4", "2XT4", "A100")
LENGTHS = {"none": None, "short": [12, 30, 31, 44, 60] * 700, "long": [100, 300, 700, 900] * 50}
OVERRIDES: dict[str, dict[str, Any]] = {
    "none": {},
    "set": {"epochs": 3, "lr": 2e-4, "micro_batch_size": 8, "full_eval_every": 0},
    "lora": {"adapter": "lora"},
}


def resolved_runs() -> dict[str, Any]:
    """{"preset/task/machine/lengths/overrides": the resolved run's values, or the error it raised}."""
    runs: dict[str, Any] = {}
    for preset in PRESETS:
        for task in TASKS:
            p = Params(task=task, model_factory="f.py:build" if task.startswith("custom") else "")
            for machine in MACHINES:
                hw = fake_profile(machine, interactive=False)
                for lengths, rows in LENGTHS.items():
                    for over, values in OVERRIDES.items():
                        key = f"{preset}/{task}/{machine}/{lengths}/{over}"
                        try:
                            run = resolve_run(p, hw, rows, preset=preset, overrides=values)
                        except Exception as err:  # the refusal is part of the behaviour
                            runs[key] = f"{type(err).__name__}: {err}"
                            continue
                        values_ = run.to_dict()
                        values_.pop("kitlib_version")
                        runs[key] = values_
    return json.loads(json.dumps(runs, default=str))


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    text = json.dumps(resolved_runs(), indent=0, sort_keys=True) + "\n"
    FIXTURE.write_bytes(gzip.compress(text.encode(), mtime=0))
    print(FIXTURE, FIXTURE.stat().st_size)
