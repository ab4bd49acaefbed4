"""benchmarks/seed_replays.py --quick runs end to end for one workload and prints its table and the doctor's lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kitlib.doctor.probe import load_probes
from kitlib.doctor.report import diagnose
from kitlib.doctor.rules import RULES, RunRecord
from kitlib.machine.hardware import fake_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three contenders in fresh processes: ~40 s on an idle 2-core CPU, minutes on a loaded one
def test_quick_replay_prints_the_table_ratios_and_doctor(tmp_path: Path) -> None:
    pytest.importorskip("bokeh_sampledata", reason="the price demo's data comes with bokeh-sampledata")
    cmd = [sys.executable, "benchmarks/seed_replays.py", "--workload", "price", "--quick", "--root", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for column in ("wall s", "featurise", "train", "eval_gaps", "saves", "infer", "samples/s", "tokens/s", "pad eff",
                   "peak MB", "smape"):  # fmt: skip
        assert column in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["before"], ["after"],
            ["kitlib"])}  # fmt: skip
    assert set(rows) == {"before", "after", "kitlib"} and all(float(r[1]) > 0 for r in rows.values())
    assert "before/kitlib" in out and "after/kitlib" in out
    assert "doctor on before's record" in out
    # The doctor's features rule on each record, before its 2%-of-the-wall cut (tokenising 48 rows costs ~1% of a
    # quick run, so whether diagnose() prints it depends on the machine's load): before recomputed, after read a cache.
    hw = fake_profile("CPU", platform="local", interactive=False)
    found = {}
    for name in ("before", "after"):
        record = RunRecord(json.loads((tmp_path / "price" / f"{name}-0" / "timing.json").read_text()), {})
        found[name] = [f for rule in RULES if (f := rule(record, hw)) is not None and f.rule == "features"]
    assert len(found["before"]) == 1 and not found["after"], found
    featurise = RunRecord(json.loads((tmp_path / "price" / "before-0" / "timing.json").read_text()), {}).facts
    assert f"featurising took {featurise.featurise_s:.2f} s" in found["before"][0].evidence


@pytest.mark.slow  # three contenders in fresh processes: ~1 min on a 2-core CPU
def test_the_doctor_names_the_summarisers_micro_batch_fix_on_its_before_record(tmp_path: Path) -> None:
    """Must-show 4 for the summariser: micro-batch 1 x accumulation 16 -> 4 x 4, named on the replay's own "before"
    record with the saving its probe measured (probes.json beside the record: 4 passes of 1 row vs 1 of 4 rows)."""
    cmd = [sys.executable, "benchmarks/seed_replays.py", "--workload", "summary", "--quick", "--threads", "1", "--root",
           str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    before = tmp_path / "summary" / "before-0"
    report = diagnose(before)
    found = [f for f in report.findings if f.rule == "micro_batch"]
    assert len(found) == 1, str(report)
    finding = found[0]
    assert finding.changes == {"micro_batch_size": 4, "grad_accum_steps": 4}
    probe = load_probes(before)["micro_batch"]
    compute = sum(RunRecord(json.loads((before / "timing.json").read_text()), {}).seconds(p)
                  for p in ("forward", "backward"))  # fmt: skip
    assert finding.estimated_saving_s == pytest.approx(compute * (1 - 1 / probe.ratio))
    assert "micro_batch" in done.stdout  # printed under the table
