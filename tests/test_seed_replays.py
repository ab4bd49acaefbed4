"""benchmarks/seed_replays.py --quick runs end to end for one workload and prints its table and the doctor's lines."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from kitlib.doctor.probe import load_probes
from kitlib.doctor.report import diagnose
from kitlib.doctor.rules import RULES, RunRecord
from kitlib.machine.hardware import fake_profile

ROOT = Path(__file__).resolve().parents[1]


def _replays() -> ModuleType:
    spec = importlib.util.spec_from_file_location("seed_replays", ROOT / "benchmarks" / "seed_replays.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _tf32_state() -> dict[str, Any]:
    """The flags a TF32 switch changes (new-API names where torch has them: reading legacy ones can warn)."""
    b: Any = torch.backends
    state: dict[str, Any] = {"matmul_precision": torch.get_float32_matmul_precision()}
    if hasattr(b.cuda.matmul, "fp32_precision"):
        state |= {"matmul": b.cuda.matmul.fp32_precision, "mkldnn_matmul": b.mkldnn.matmul.fp32_precision,
                  "conv": b.cudnn.conv.fp32_precision, "rnn": b.cudnn.rnn.fp32_precision}  # fmt: skip
    else:
        state |= {"legacy_matmul": b.cuda.matmul.allow_tf32, "legacy_cudnn": b.cudnn.allow_tf32}
    return state


def test_the_sft_users_tf32_knob_holds_for_the_run_and_is_restored_and_a_cpu_run_touches_no_flag() -> None:
    """The SFT user's "after" turned TF32 on (their "before" had it off): on CUDA the plain loop runs inside that
    setting and every flag is back afterwards; on a CPU the knob touches nothing (the CPU replay stays as it was).
    Flags are set without a GPU here, as torch allows: what the GPU does with them is reasoned, not measured."""
    replays = _replays()
    sft = replays.WORKLOADS["sft"]
    assert sft.before.tf32 is False and sft.after.tf32 is True
    start = _tf32_state()
    with replays.tf32_flags(sft.after, torch.device("cuda")) as effective:
        assert effective["tf32_matmul"] is True and _tf32_state() != start
    assert _tf32_state() == start
    with replays.tf32_flags(sft.before, torch.device("cuda")) as effective:
        assert effective["tf32_matmul"] is False
    assert _tf32_state() == start
    with pytest.raises(RuntimeError), replays.tf32_flags(sft.after, torch.device("cuda")):
        raise RuntimeError("a failing run")
    assert _tf32_state() == start
    with replays.tf32_flags(sft.after, torch.device("cpu")) as effective:
        assert effective["tf32_matmul"] is False and _tf32_state() == start


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_asking_for_cuda_without_one_is_refused_naming_the_fix() -> None:
    cmd = [sys.executable, "benchmarks/seed_replays.py", "--workload", "sql", "--quick", "--device", "cuda"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr and "Fix: --device auto" in done.stderr


def test_demos_made_on_another_machine_give_the_same_competition(tmp_path: Path) -> None:
    """--make-data here, --demo-data on the GPU machine (which lacks the demos' packages): the replay cuts the same
    rows from the copy as from a demo made in place, and the copied folder is left whole for the next workload."""
    replays = _replays()
    w = replays.WORKLOADS["sql"]  # self-contained: its demo needs no package
    made = tmp_path / "made"
    replays.make_demo(w, made / "sql")
    here = replays.make_data(w, tmp_path / "here", w.quick)
    copied = replays.make_data(w, tmp_path / "copied", w.quick, made)
    for name in ("train.csv", "test.csv", "solution.csv", "sample_submission.csv", "sql_metric.py"):
        assert (copied / name).read_bytes() == (here / name).read_bytes(), name
    assert replays.about(copied) == {**replays.about(here), "metric": f"{copied.resolve() / 'sql_metric.py'}:record_f1"}
    kept = len((made / "sql" / "train.csv").read_text().splitlines())
    assert kept > len((copied / "train.csv").read_text().splitlines()) == w.quick[0] + 1


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
    assert set(rows) == {"before", "after", "kitlib"}
    assert all(float(r[2]) > 0 for r in rows.values())  # r[1] is the device, r[2] the wall seconds
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
def test_the_doctor_names_the_summarisers_micro_batch_fix_on_its_before_record_and_a_cpu_replay_says_cpu(
    tmp_path: Path,
) -> None:
    """Must-show 4 for the summariser: micro-batch 1 x accumulation 16 -> 4 x 4, named on the replay's own "before"
    record with the saving its probe measured (probes.json beside the record: 4 passes of 1 row vs 1 of 4 rows).
    --device cpu: every contender runs on the CPU (the table's device column, the plain loops' run records: cpu,
    fp32, TF32 off), and the ratios the table prints are the ones seed_replays.json keeps for the GPU suite."""
    # One replay for both claims (the --device cpu one had a replay of sql's of its own, ~50 s of CI's slow step):
    # sql's adapter differs from summary's (both seq2seq) in its tokenizer and model build only; sql's data cut runs
    # in test_demos_made_on_another_machine_give_the_same_competition.
    cmd = [sys.executable, "benchmarks/seed_replays.py", "--workload", "summary", "--quick", "--threads", "1",
           "--device", "cpu", "--root", str(tmp_path)]  # fmt: skip
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
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["before"],
            ["after"], ["kitlib"])}  # fmt: skip
    assert {name: row[1] for name, row in rows.items()} == {"before": "cpu", "after": "cpu", "kitlib": "cpu"}
    for name in ("before", "after"):
        run = json.loads((tmp_path / "summary" / f"{name}-0" / "timing.json").read_text())["run"]
        facts = {k: run[k] for k in ("device_type", "device_name", "precision", "tf32")}
        assert facts == {"device_type": "cpu", "device_name": "cpu", "precision": "fp32", "tf32": False}
    summary = json.loads((tmp_path / "seed_replays.json").read_text())["summary"]
    printed = f"before/kitlib {summary['before/kitlib']:.2f}x, after/kitlib {summary['after/kitlib']:.2f}x"
    assert printed in done.stdout
    assert {runs[0]["device"] for runs in summary["results"].values()} == {"cpu"}
