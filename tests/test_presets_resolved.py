"""Every preset x task x machine x lengths x overrides resolves to what main 359bdcc resolved (the fixture): how the
presets are declared may change, what they resolve to may not."""

from __future__ import annotations

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
