"""Every preset x task x machine x lengths x overrides resolves to what main 359bdcc resolved (the fixture): how the
presets are declared may change, what they resolve to may not."""

from __future__ import annotations

import dataclasses
import gzip
import json

from tests.resolved_runs import FIXTURE, resolved_runs


def test_every_preset_and_task_resolves_as_before() -> None:
    before = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    now = resolved_runs()
    assert sorted(now) == sorted(before)
    changed = [key for key in before if now[key] != before[key]]
    first = changed[0] if changed else None
    assert not changed, (len(changed), first, first and now[first], first and before[first])


def test_a_preset_overrides_declared_parameters_within_their_declaration() -> None:
    """A preset's epochs, lr and full_eval_every are the declared training parameters' values (None: the preset's):
    each passes the declaration's own check, and every other preset field is the preset's or the trainer's."""
    from typing import get_type_hints

    from kitlib.config import TrainConfig
    from kitlib.notebook import params
    from kitlib.notebook.presets import PRESETS, Preset

    fields = {f.name for f in dataclasses.fields(Preset)}
    declared = fields & set(params.TRAINING)
    assert declared == {"epochs", "lr", "full_eval_every"}
    hints = get_type_hints(params.Params)
    for preset in PRESETS.values():
        for name in declared:
            assert params._declared(params.Params(**{name: getattr(preset, name)}), name, hints[name]) == ""
    trainer = {f.name for f in dataclasses.fields(TrainConfig)}
    own = {"name", "description", "regime", "target_effective_batch", "length_coverage", "max_length_cap",
           "checkpoints", "min_steps", "row_limit", "adjusted_for"}  # fmt: skip
    assert fields - declared - trainer == own
