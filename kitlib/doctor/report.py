"""The speed doctor: a run's timing record -> where the time went, and ranked changes that would save the most,
each saving estimated from the recorded seconds by a stated model (``Finding.basis``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pandas as pd

from kitlib.doctor.flops import flops_per_token, measure_cpu_peak
from kitlib.doctor.probe import MicroBatchProbe, load_probes
from kitlib.doctor.rules import RULES, Finding, RunRecord
from kitlib.engine.timing import PHASES
from kitlib.machine.amp import TORCH_DTYPES
from kitlib.machine.hardware import detect, fake_profile
from kitlib.machine.peaks import PeakDtype, gpu_key, peak_flops
from kitlib.machine.threads import cpu_threads
from kitlib.progress import THROUGHPUT, figure, throughput

if TYPE_CHECKING:
    from kitlib.config import Dtype
    from kitlib.machine.hardware import HardwareInfo

__all__ = ["Finding", "Report", "diagnose"]

MIN_SHARE = 0.02  # findings saving less than 2% of the wall time are noise, not advice
NO_FINDING = f"no finding: nothing here would save more than {MIN_SHARE:.0%} of the wall time"


@dataclass(frozen=True)
class Report:
    wall_seconds: float
    breakdown: dict[str, float]  # phase -> seconds, plus "other" (untimed); sums to the wall time
    epoch_gaps_s: list[float]  # between one epoch's last step and the next one's first (overlaps eval, checkpoint)
    summary: dict[str, Any]  # steps, epochs, throughput, padding efficiency, device, precision
    findings: list[Finding]  # largest estimated saving first
    hardware: str

    def table(self) -> pd.DataFrame:
        """The findings, ranked: rank, rule, title, saving_s, saving_share, evidence, fix. With none, one cell saying
        so (column "finding"): a notebook shows that line, not an empty table. ``findings`` is the list to test."""
        if not self.findings:
            return pd.DataFrame({"finding": [NO_FINDING]}, index=[""])
        rows = [(i, f.rule, f.title, round(f.estimated_saving_s, 3), round(f.saving_share, 3), f.evidence, f.fix)
                for i, f in enumerate(self.findings, 1)]  # fmt: skip
        return pd.DataFrame(rows, columns=["rank", "rule", "title", "saving_s", "saving_share", "evidence", "fix"])

    def share(self, seconds: float) -> float:
        return seconds / self.wall_seconds if self.wall_seconds else 0.0

    def phases(self) -> list[tuple[str, float]]:
        """(phase, seconds): the breakdown, then the epoch gaps, which overlap it."""
        return [*self.breakdown.items(), ("between epochs", sum(self.epoch_gaps_s))]

    def times(self) -> pd.DataFrame:
        """Where the time went: seconds and share of the wall per phase (and the epoch gaps, which overlap them)."""
        return pd.DataFrame([(n, s, self.share(s)) for n, s in self.phases()], columns=["phase", "seconds", "share"])

    def __str__(self) -> str:
        s = self.summary
        lines = [
            f"kitlib doctor: wall {self.wall_seconds:.2f} s, {s.get('epochs_done')} epochs, {s.get('steps')} steps, "
            f"{s.get('device_name')} {s.get('precision')}; advice for {self.hardware}",
            "where the time went:",
        ]
        for name, seconds in self.breakdown.items():
            share = self.share(seconds)
            lines.append(f"  {name:<12} {seconds:9.3f} s {share:6.1%}  {'#' * round(40 * share)}")
        if self.epoch_gaps_s:
            lines.append(f"  between epochs (eval, checkpoint, loader restart): {sum(self.epoch_gaps_s):.3f} s")
        rates = s.get("throughput") or [{}]  # 02's history rows' figures, by epoch (an older record: the run's)
        facts = [f"{_listed([r[k] for r in rates])} {name}" for k, name in THROUGHPUT.items() if k in rates[-1]]
        if s.get("padding_efficiency") is not None:
            facts.append(f"padding efficiency {figure(s['padding_efficiency'])}")
        over = "by epoch" if s.get("by_epoch") else "over the run"
        if facts:
            lines.append(f"throughput {over}: " + "; ".join(facts))
        if s.get("mfu") is not None:  # model FLOPs only: padding and recomputation are not credited
            lines.append(
                f"compute{' in the last epoch' if s.get('by_epoch') else ''}: {_flops(s['achieved_flops'])} "
                f"achieved of {_flops(s['peak_flops'])} "
                f"({s['peak_basis']}): MFU {s['mfu']:.1%}"
            )
            if s["mfu"] > 1.0:  # the run beat the peak: the peak was taken while other work held the cores
                lines.append("  (over 100%: the peak was measured on a busier CPU than the run had: run it again free)")
        if not self.findings:
            lines.append(NO_FINDING)
        for i, f in enumerate(self.findings, 1):
            lines += [
                f"{i}. {f.title} -- saves ~{f.estimated_saving_s:.2f} s ({f.saving_share:.0%} of the wall)",
                f"   evidence: {f.evidence}",
                f"   fix:      {f.fix}",
                f"   estimate: {f.basis}",
            ]
        return "\n".join(lines)

    def plot(self, ax: Any = None) -> Any:
        """Horizontal bars of where the time went (phases, untimed, epoch gaps); returns the matplotlib Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError as err:
            raise ImportError(
                "Report.plot() needs matplotlib: pip install matplotlib (print(report) needs none)"
            ) from err
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 0.35 * len(self.breakdown) + 1.2))
        names, seconds = zip(*self.phases()[::-1], strict=True)
        ax.barh(names, seconds, color=["tab:gray"] + ["tab:blue"] * len(self.breakdown))
        ax.set_xlabel("seconds")
        ax.set_title(f"where {self.wall_seconds:.1f} s went (gray: gaps between epochs, overlapping eval/checkpoint)")
        return ax

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=str)


def _flops(rate: float) -> str:
    unit, scale = next((u, s) for u, s in (("T", 1e12), ("G", 1e9), ("M", 1e6)) if rate >= s or u == "M")
    return f"{rate / scale:.1f} {unit}FLOP/s"


# ---------------------------------------------------------------------------------------------------- the run record
def _load(run: Any) -> RunRecord:
    if isinstance(run, (str, Path)):
        folder = Path(run)
        if not (folder / "timing.json").is_file():
            raise FileNotFoundError(f"{folder}/timing.json not found: pass the run_dir given to fit(run_dir=...)")
        config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
        timing = json.loads((folder / "timing.json").read_text())
        return RunRecord(timing, config.get("config") or {}, load_probes(folder))  # probes: measured on its model
    if isinstance(run, Mapping):
        if "phases" in run:  # a bare timing record (FitResult.timing or timing.json)
            return RunRecord(run, {})
        config = run.get("config") or {}
        return RunRecord(run["timing"], config.get("config", config))
    timing = getattr(run, "timing", None)  # a FitResult
    if isinstance(timing, Mapping):
        run_dir = getattr(run, "run_dir", None)
        if run_dir is not None and (Path(run_dir) / "config.json").is_file():
            return _load(run_dir)
        return RunRecord(timing, {})
    raise TypeError(f"diagnose() takes a run_dir, a FitResult or a records dict, not {type(run).__name__}")


def _hardware_for(run: RunRecord) -> HardwareInfo:
    """The hardware the run was on: its GPU's profile when known (a Kaggle run read on a laptop), else this machine."""
    key = gpu_key(str(run.facts.device_name or "")) if run.facts.device_type == "cuda" else None
    return fake_profile(key.split("-")[0], interactive=False) if key else detect()  # every PEAK_TFLOPS family


def _compute(run: RunRecord, tokens_per_s: float | None, peak: float | None, measure: bool) -> dict[str, Any]:
    """Achieved model FLOP/s, the peak for the run's precision (a GPU's datasheet, a CPU's matmul peak measured now
    when ``measure``, or ``peak``) and their ratio (MFU), when the run recorded its model's shape."""
    facts = run.facts
    params, samples = facts.model_non_embedding_params, facts.samples or 0
    if not params or not tokens_per_s or not samples:
        return {"mfu": None}
    dtype = cast("PeakDtype", facts.precision or "fp32")
    basis = "given"
    if peak is None and facts.device_type == "cuda":
        mode: PeakDtype = "tf32" if dtype == "fp32" and facts.tf32 else dtype  # fp32 matmuls on TF32 cores
        peak, basis = peak_flops(str(facts.device_name or ""), mode), f"{mode} datasheet peak"
    elif peak is None and facts.device_type == "cpu" and measure:
        torch_dtype = TORCH_DTYPES[cast("Dtype", dtype)]  # a CPU run's precision: fp32, bf16 or fp16
        # The peak of the threads the run had (1 thread: about half of 2): the doctor's own pool may differ.
        threads = (run.timing.get("run") or {}).get("intra_op_threads")
        with cpu_threads(int(threads) if threads else None) as n:
            peak = measure_cpu_peak(torch_dtype)
        basis = f"{dtype} matmul peak measured now on this CPU, {n} thread{'s' * (n != 1)}"
    width = round((facts.computed_tokens or 0) / samples)  # mean padded row length: the attention context
    achieved = tokens_per_s * flops_per_token(
        int(params), int(facts.model_layers or 0), width, int(facts.model_width or 0)
    )
    if not peak:
        return {"mfu": None, "achieved_flops": achieved}
    return {"mfu": achieved / peak, "achieved_flops": achieved, "peak_flops": peak, "peak_basis": basis}


def _summary(run: RunRecord, peak: float | None, measure: bool) -> dict[str, Any]:
    facts = run.facts
    train_s = sum(facts.epoch_train_s or []) or run.wall
    real, computed, world = facts.real_tokens or 0, facts.computed_tokens or 0, facts.world_size or 1
    keys = ("steps", "epochs_done", "epochs_planned", "device_name", "precision", "micro_batch_size", "stop_reason")
    # the history rows' own figures; a record from before they were kept: the run's, by the same function
    rates = facts.epoch_throughput or ([throughput(facts.samples or 0, real, train_s, world)] if train_s else [])
    tokens_per_s = rates[-1].get("tokens_per_s", 0) / world if rates else None  # this rank's: MFU is per device
    return (
        {k: getattr(facts, k) for k in keys}
        | {"throughput": rates, "by_epoch": bool(facts.epoch_throughput)}
        | {"padding_efficiency": real / computed if computed else None}
        | _compute(run, tokens_per_s, peak, measure)
    )


def _listed(values: list[float]) -> str:
    """Figures by ``figure``, at most 5: the first two and the last two around an ellipsis."""
    shown = [figure(v) for v in values]
    return ", ".join(shown if len(shown) <= 5 else [*shown[:2], "...", *shown[-2:]])


def diagnose(
    run: Any, hw: HardwareInfo | None = None, *, peak_flops: float | None = None, probe: MicroBatchProbe | None = None
) -> Report:
    """A run's time breakdown and ranked findings; ``run`` is a run_dir, a FitResult or ``{"timing", "config"}``.
    ``hw``: the hardware the advice is for; ``peak_flops`` overrides MFU's peak; ``probe`` (``probe_micro_batch``)
    replaces a run_dir's saved micro-batch probe."""
    record = _load(run)
    if probe is not None:
        record = dataclasses.replace(record, probes={**record.probes, "micro_batch": probe})
    given, hw = hw, hw or _hardware_for(record)
    breakdown = {name: round(record.seconds(name), 4) for name in PHASES if record.seconds(name) > 0}
    breakdown["other"] = round(max(0.0, record.wall - sum(breakdown.values())), 4)
    findings = [f for rule in RULES if (f := rule(record, hw)) is not None]
    findings = [f for f in findings if f.saving_share >= MIN_SHARE or f.rule == "time_budget"]
    findings.sort(key=lambda f: f.estimated_saving_s, reverse=True)
    summary = _summary(record, peak_flops, measure=given is None)
    return Report(
        wall_seconds=record.wall,
        breakdown=breakdown,
        epoch_gaps_s=[float(g) for g in record.facts.epoch_gaps_s or []],
        summary=summary,
        findings=findings,
        hardware=hw.device_name if hw.primary is not None else f"CPU ({hw.cpu_count} cores)",
    )
