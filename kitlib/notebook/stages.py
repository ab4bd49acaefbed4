"""The four notebook stages as functions: setup -> features -> train -> infer.

The notebooks are thin run-books (a ``parameters`` cell, calls into this module, displays); everything here runs
the same from a script, a test or ``jupyter nbconvert --execute``. Each stage reads what the previous one saved in
the working dir and says which notebook to run first when it is missing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib._files import read_json_object, record_file, write_atomic
from kitlib.config import TrainConfig
from kitlib.data.cache import Cache
from kitlib.data.featurize import tokenize_texts
from kitlib.data.lengths import length_report
from kitlib.data.tables import DataError, read_table
from kitlib.doctor.memory_plan import GENERATING, checkpointing_needed, model_config, run_line
from kitlib.errors import CheckpointError, KitError, MissingRunError, SetupError
from kitlib.machine.hardware import check_torch_supports, cpu_threads, cuda_devices, detect, fake_profile
from kitlib.models.adapters import add_adapter, describe_size, merge_adapter
from kitlib.models.loading import check_model_dir, frozen_dtype, pretrained_dir, tiny_requested
from kitlib.notebook import handoff, presets, trees
from kitlib.notebook.handoff import BUILT_FROM, Features

# params and load_params are the notebooks' first call (stages.params in 00, stages.load_params in 01-03): one import
from kitlib.notebook.params import (  # noqa: F401
    TRAINING,
    Params,
    from_cell,
    kaggle_input,
    keep_aside,
    load_params,
    params,
)
from kitlib.notebook.regimes import Encoder, Prepared
from kitlib.notebook.submission import check_sample_submission, write_submission
from kitlib.notebook.tasks import get_task, task_entry
from kitlib.progress import advise
from kitlib.tasks.baseline import Baseline, BestRows, Gap, compare, trivial_baseline
from kitlib.tasks.metrics import check_metric, get_metric
from kitlib.tasks.targets import describe_objective

# lazy: torch (+1.0 s), pandas (+0.2 s): importing the stages loads neither (0.3 s with numpy), so notebooks 00 and 01
# and the CLI that only read data and the run never pay for them (python -X importtime).
# lazy: safetensors (+1 ms), once torch is in: only export_merged's non-HF module writes one.
# lazy: transformers (+0.6 s): only export_merged loads it, to save the model folder's tokenizer.

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from kitlib.data.tables import TargetSpec
    from kitlib.engine.loop import FitResult
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.machine.precision import PrecisionPlan
    from kitlib.notebook.presets import Preset, ResolvedRun
    from kitlib.notebook.tasks.base import SideInputs
    from kitlib.tasks.metrics import Metric

BASELINE_FILE = "baseline.json"  # in run/: the trivial baseline's and the model's validation scores (03 warns)
VALID_FILE = "valid.json"  # in each fold's run dir: its validation rows' truth and predictions (the out-of-fold parts)
OOF_FILE = "oof.csv"  # in run/ with folds: every training row's out-of-fold prediction (row, fold, target, prediction)
INPUTS_FILE = "inputs.json"  # in run.new/: the config and features an attempt trained on (may it be continued?)
VALID_FRACTION = 0.1  # rows held out of train.csv for early stopping and the metric
MIN_CLASS_ROWS = 2  # one to learn from and one to validate on; a rarer class trains only (with a warning)
# Rough tokens per whitespace word for WordPiece/BPE tokenizers on English text (MiniLM's: ~1.2-1.4). Good enough for
# the picker's time estimate and a first max_length; 01 measures the real lengths with the model's tokenizer.
TOKENS_PER_WORD = 1.3
SPECIAL_TOKENS = 2  # [CLS] and [SEP], which every tokenized row carries


# ------------------------------------------------------------------------------------------------------ 00 setup
def setup(p: Params, hw: HardwareInfo | None = None, resolved: ResolvedRun | None = None) -> ResolvedRun:
    """Check the hardware can train, resolve the preset (or take the picker's run), save run.json."""

    hw = measured(p, hw)
    check_torch_supports(hw)  # e.g. a P100 with a torch build lacking sm_60: a clear error now, not in 02_train
    run = resolved or resolve_run(p, hw)
    if task_preset(p)(run.preset) != run.preset or not p.training().keys() <= run.overrides.keys():
        raise SetupError(
            f"the run to save was not resolved for these parameters (task {p.task!r}'s preset, the training "
            f"parameters {sorted(p.training())}): resolve it with stages.resolve_run(p, hw), as the picker does"
        )
    _check_model(p)
    # The data's problems surface here, in seconds, before anything is written: a bad parameter never replaces
    # the run.json/params.json of the last good run (01 reads and checks the same files again).
    data = read_competition(p, run)
    _check_enough_rows(data.train[p.target], data.spec, run, p)
    run = dataclasses.replace(run, task=p.task, metric=data.metric.name, baseline=_baseline(p, data).to_dict())
    run = planned_checkpointing(p, hw, run)
    p.work_dir.mkdir(parents=True, exist_ok=True)
    run.save(p.work_dir)
    chosen = {k: v for k, v in run.overrides.items() if k in TRAINING}  # the picker's, as parameters
    dataclasses.replace(p, preset=run.name, **chosen).save()  # the picker's choice: params.json and run.json agree
    return run


def resolve_run(
    p: Params,
    hw: HardwareInfo,
    lengths: Sequence[int] | np.ndarray | None = None,
    *,
    preset: str | Preset | None = None,
    overrides: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> ResolvedRun:
    """The run ``p`` trains: the one function from parameters + hardware + data lengths to a ResolvedRun, called by
    the picker (every click), 00's setup (without a picker) and 01 (with the tokenizer's lengths) alike.

    ``preset``: the picker's choice or 01's saved one (default ``p.preset``), as ``p``'s task trains it
    (``task_preset``, applied once); ``hw``: this machine, planned as the one 02 trains on (``planning_hw``);
    ``lengths``: tokens per training row (max_length covers the preset's share of them); ``overrides``: the picker's
    advanced fields (or 01's saved run's) over ``p``'s training parameters: the one place the two merge;
    ``world_size``: processes per step (None: every GPU of the planned machine; 01 keeps the saved run's)."""
    chosen = p.preset if preset is None else preset
    base = presets.get_preset(chosen) if isinstance(chosen, str) else chosen
    settings = p.training() | dict(overrides or {})
    return presets.resolve(
        task_preset(p)(base), planning_hw(p, hw), lengths=lengths, overrides=settings, world_size=world_size
    )


def measured(p: Params, hw: HardwareInfo | None = None, *, now: bool = False) -> HardwareInfo:
    """This machine (``hw``, else detected) with its CPU's bf16 autocast timed against fp32 on a block of ``p``'s
    model (kitlib.machine.speed.probe_cpu_bf16: a second or two, then kept in the cache dir per machine and torch
    version), which decides the plan's precision; only a CPU with bf16 instructions (AMX-BF16, AVX512-BF16) is
    probed: a GPU's rules are known, and without them bf16 is emulated. ``now`` (00): also the CPU's fp32 training
    speed at this moment (``measure_cpu_step``, never cached: a busy machine is priced into the run's estimate)."""
    from kitlib.machine import speed

    hw = hw or detect()
    if hw.device_type != "cpu":
        return hw
    if now and hw.cpu_flops_now is None:
        hw = dataclasses.replace(hw, cpu_flops_now=speed.measure_cpu_step(*_block(p)))
    if hw.cpu_bf16_probe is not None or not (hw.cpu_amx or hw.cpu_avx512_bf16):
        return hw
    return dataclasses.replace(hw, cpu_bf16_probe=speed.probe_cpu_bf16(*_block(p), cache_dir=p.cache_dir))


def _block(p: Params) -> tuple[int, int, int]:
    """(width, FFN width, heads) of ``p``'s model from its config.json (no weights); MiniLM's for a model the task
    builds from scratch (a generating task's "auto", "tiny", a model_factory)."""

    minilm = (384, 1536, 12)
    if _built_by_task(p) or (p.model == "auto" and tiny_requested()):
        return minilm
    try:
        _, config = model_config(pretrained_dir() if p.model == "auto" else p.model)
    except KitError:
        return minilm  # _check_model says what is wrong with the model
    width = int(getattr(config, "hidden_size", 0) or getattr(config, "d_model", 0) or minilm[0])
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "d_ff", None) or 4 * width
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "num_heads", 0) or width // 64)
    return width, int(ffn), heads


@dataclass(frozen=True)
class DataFacts:
    """What 00's preset picker needs from the data: its time estimate and a max_length fitted to the texts."""

    n_rows: int  # train.csv's rows; each preset trains on at most its row_limit of them (the estimate applies it)
    lengths: np.ndarray  # rough tokens per row (int64): whitespace words x TOKENS_PER_WORD + SPECIAL_TOKENS
    n_test: int = 0  # test.csv's rows: 01 featurises them and 03 predicts them (the whole run's estimate)
    model_params: float | None = None  # matmul weights a token passes (the estimate's FLOPs); None: MiniLM's


def data_facts(p: Params) -> DataFacts:
    """train.csv's row count and rough token lengths, and test.csv's row count, for the picker before anything is
    written: read and checked as ``setup`` reads them (its DataError, a cell earlier), in about the time of reading
    the CSVs. No tokenizer or
    model is loaded (that costs seconds to minutes on a large train.csv; 01 does it and re-fits max_length)."""
    train = _read_train(p)
    lengths, weights = get_task(p.task).rough_cost(train, p)  # a task that knows its tokens and model better
    words = train[p.text].str.split().str.len().to_numpy(dtype=np.float64)
    lengths = np.ceil(words * TOKENS_PER_WORD).astype(np.int64) + SPECIAL_TOKENS if lengths is None else lengths
    test = read_table(p.data_dir / p.test_file, text=p.text, id=p.id)
    return DataFacts(len(train), lengths, len(test), weights)


def task_preset(p: Params) -> Callable[[Preset], Preset]:
    """The preset as ``p``'s task trains it (kitlib.notebook.tasks.base.Task.preset): the picker's ``adjust`` and
    setup's, the one place it is applied. Once only: a preset it made (``adjusted_for``) comes back as it is, so the
    picker's run passes setup unchanged and a task's adjustment need not be idempotent."""

    task = get_task(p.task)

    def adjust(preset: Preset) -> Preset:
        adjusted = preset if preset.adjusted_for == p.task else task.preset(preset, p)
        return preset if adjusted == preset else dataclasses.replace(adjusted, adjusted_for=p.task)

    return adjust


def _built_by_task(p: Params) -> bool:
    """``p``'s model is built by its task, with no config to read: "tiny", "auto" for a generating task (built
    from scratch), or a task's own model (custom)."""
    kind = task_entry(p.task).model_kind
    return not kind or p.model == "tiny" or (p.model == "auto" and kind in GENERATING)


def planned_checkpointing(p: Params, hw: HardwareInfo, run: ResolvedRun) -> ResolvedRun:
    """``run`` with gradient checkpointing on where the memory plan says it fits only so (``gradient_checkpointing``
    left at None: the plan's; kitlib.doctor.memory_plan.checkpointing_needed), the reason among its reasons; else
    ``run``. A model the task builds has no config to plan from."""
    cfg = run.config
    if cfg.gradient_checkpointing or "gradient_checkpointing" in run.overrides or run.preset.regime == "head":
        return run
    if _built_by_task(p):
        return run
    try:
        why = checkpointing_needed(p.model, task_entry(p.task).model_kind, planning_hw(p, hw), run)
    except KitError:  # no plan for this model: memory_line says why in the picker
        return run
    if not why:
        return run
    print(why)
    config = dataclasses.replace(cfg, gradient_checkpointing=True)
    return dataclasses.replace(run, config=config, reasons=(*run.reasons, why))


def memory_line(p: Params, hw: HardwareInfo) -> Callable[[ResolvedRun], str]:
    """The picker's ``memory``: the memory plan (kitlib.plan_memory) of ``p``'s model and task for a run on the
    machine 02 will train on (``planning_hw``), one plan per length and batch kept, so clicking through the presets
    rebuilds no model. A model built from scratch (model="tiny", or "auto" for a generating task) or a task of one's
    own has no config to plan from."""
    if _built_by_task(p):
        return lambda run: f"no plan for model={p.model!r}, task={p.task!r}: it is built by the task, not from a config"
    kind, hw = task_entry(p.task).model_kind, planning_hw(p, hw)
    lines: dict[tuple[Any, ...], str] = {}

    def line(run: ResolvedRun) -> str:
        cfg = run.config
        key = (cfg.max_length, cfg.micro_batch_size, cfg.grad_accum_steps, run.preset.regime, run.preset.max_length_cap)
        if key not in lines:
            lines[key] = run_line(p.model, kind, hw, run)
        return lines[key]

    return line


# --------------------------------------------------------------------------------------------------- 01 features
@dataclass(frozen=True)
class Competition:
    """The competition's files as read and checked: what 00 validates and 01 featurises."""

    train: pd.DataFrame  # at most the preset's row_limit rows
    test: pd.DataFrame
    test_ids: list[Any]  # Python ints/strs, in test.csv's order
    columns: tuple[str, ...]  # sample_submission.csv's
    spec: TargetSpec  # decided on every training row, before any row limit
    metric: Metric  # the metric parameter, checked against the target's kind
    side: SideInputs  # the task's inputs besides the text (numeric and categorical columns), fitted on train


def read_competition(p: Params, run: ResolvedRun) -> Competition:
    """Read train/test/sample_submission and check all that training and the submission depend on (columns, ids,
    text cells, targets, the task, the sample's ids and columns): a DataError naming the file and the fix."""
    workload = get_task(p.task)
    if run.regime.name not in workload.regimes:
        fits = [name for name, preset in presets.PRESETS.items() if preset.regime in workload.regimes]
        raise SetupError(
            f"preset {run.name!r} trains in the {run.regime.name} regime, which task {p.task!r} cannot use (it needs "
            f"{' or '.join(workload.regimes)}): pick one of {fits} in 00_setup (preset, or KIT_PRESET headless)"
        )
    train = _read_train(p)
    spec = workload.target(train[p.target], p, p.metric)
    metric = get_metric(p.metric, spec.kind, data_dir=p.data_dir)
    check_metric(metric, train[p.target])
    if run.preset.row_limit is not None and len(train) > run.preset.row_limit:
        train = train.sample(run.preset.row_limit, random_state=p.seed).sort_index()
    test = read_table(p.data_dir / p.test_file, text=p.text, id=p.id)
    test_ids = [i.item() if isinstance(i, np.generic) else i for i in test[p.id]]
    columns = check_sample_submission(p.data_dir / p.sample_submission, test_ids, id=p.id, target=p.target)
    side = workload.side_inputs(p, train, test)
    _check_folds(p, train, spec)
    return Competition(train, test, test_ids, columns, spec, metric, side)


def _check_folds(p: Params, train: pd.DataFrame, spec: TargetSpec) -> None:
    """The fold parameters against the rows that train: the group column exists, and each fold can validate a whole
    group (folds <= groups) or, stratified, a row of every class (folds <= the rarest class's rows)."""
    if p.group_column and p.group_column not in train.columns:
        raise DataError(
            f"group_column {p.group_column!r} is not a column of {p.train_file}: its columns are "
            f"{list(train.columns)}. Fix: group_column in 00's parameters ('' for independent rows)"
        )
    if p.folds == 1:
        return
    if p.group_column:
        groups = train[p.group_column].nunique(dropna=False)
        if groups < p.folds:
            raise DataError(
                f"folds = {p.folds}, but {p.train_file} has {groups} groups in {p.group_column!r}: each fold validates "
                f"whole groups. Fix: folds <= {groups} in 00's parameters"
            )
    elif spec.kind in ("binary", "multiclass"):
        counts = train[p.target].value_counts()
        if counts.iloc[-1] < p.folds:
            raise DataError(
                f"folds = {p.folds}, but class {counts.index.tolist()[-1]!r} has {int(counts.iloc[-1])} rows: "
                f"stratified folds put each class in every fold. Fix: folds <= {int(counts.iloc[-1])} in 00's "
                "parameters, or merge the rare classes"
            )
    if len(train) < 2 * p.folds:
        raise DataError(f"folds = {p.folds} needs at least {2 * p.folds} training rows; there are {len(train)}")


def _groups(p: Params, train: pd.DataFrame) -> np.ndarray | None:
    """A code per training row for group_column's value (None without one): what the folds keep together."""
    if not p.group_column:
        return None
    return np.unique(train[p.group_column].astype(str).to_numpy(), return_inverse=True)[1].astype(np.int64)


def _read_train(p: Params) -> pd.DataFrame:
    """train.csv, every row, with its columns checked (kitlib.data.tables.read_table)."""
    rule = get_task(p.task).target_rule
    return read_table(p.data_dir / p.train_file, text=p.text, target=p.target, id=p.id, rule=rule)


def planning_hw(p: Params, hw: HardwareInfo) -> HardwareInfo:
    """The machine 02 will train on: this one, or the accelerator the ``hardware`` parameter names."""
    return fake_profile(p.hardware, platform=hw.platform, interactive=hw.interactive) if p.hardware else hw


@dataclass(frozen=True)
class StandIn:
    """This machine's CPU standing in for the accelerator run.json was planned for (``rehearse``): 02 trains the plan
    in as many gloo processes as it has GPUs, and 02 and 03 compute in ``precision``, what the CPU runs."""

    hw: HardwareInfo  # this machine without its accelerators: every process on the CPU, gloo between them
    precision: PrecisionPlan

    def line(self, hardware: str, run: ResolvedRun, processes: int) -> str:
        """The one line a rehearsing stage prints: what stands in for what."""
        cpu = "this machine's CPU"
        who = f"{processes} gloo processes on {cpu} stand" if processes > 1 else f"{cpu} stands"
        return (
            f"rehearsal: {who} in for {hardware} ({run.hardware}), {self.precision.dtype} for {run.config.precision} "
            f"({self.precision.reason})"
        )


def _machine_for_plan(p: Params, feats: Features, hw: HardwareInfo | None, processes: int) -> StandIn | None:
    """02 and 03 on the accelerator run.json was planned for: a chain kernel without it would train (or predict)
    with settings made for another machine, unless the user rehearses the plan here (``rehearse``: a StandIn, and
    one printed line; None when this is the planned machine). Without ``hw``, counts GPUs the way that does not
    initialise CUDA (a DDP launch must follow in a process that has not touched it)."""
    from kitlib.machine.precision import decide_stage_precision

    if not p.hardware:
        return None
    planned = fake_profile(p.hardware)
    gpus = hw.num_gpus if hw is not None else len(cuda_devices())
    if planned.num_gpus == gpus:
        return None
    if p.rehearse and gpus < planned.num_gpus:
        cpu = _cpu(hw)
        stand_in = StandIn(cpu, decide_stage_precision(cpu, feats.run.preset.precision))
        print(stand_in.line(p.hardware, feats.run, processes))
        return stand_in
    rehearse = "" if p.rehearse else "; or rehearse it on this machine's CPU first: rehearse = True (KIT_REHEARSE=1)"
    raise SetupError(
        f"run.json was planned for {feats.run.hardware} (hardware = {p.hardware!r} in 00's parameters), but this "
        f"machine has {gpus} GPU(s). Fix: give this kernel that accelerator (kaggle build --gpu), or set "
        f"hardware = '' in 00 and re-run 00 and 01 on this machine{rehearse}"
    )


def _check_model(p: Params) -> None:
    """The model the parameters name must be there (found in 00, not after 01's reading): a saved model folder, or
    for "auto" the installed all-MiniLM-L6-v2."""
    if p.model == "auto" and not tiny_requested():
        pretrained_dir()
    elif p.model not in ("auto", "tiny") and Path(p.model).is_absolute():
        check_model_dir(p.model)


def _model_choice(p: Params) -> dict[str, Any]:
    if p.model == "auto":
        return {}
    if p.model == "tiny":
        return {"tiny": True}
    return {"model_dir": p.model}


def built_from(p: Params) -> dict[str, Any]:
    """The parameters the saved features depend on (a later stage compares them with its own), and test.csv's
    sha256: a code competition's rerun swaps in the hidden test set, and 03 must not predict the old one's rows.
    Cost: one read of test.csv (about 0.2 s per 100 MB), no parsing."""
    test = p.data_dir / p.test_file
    values = {name: list(v) if isinstance(v := getattr(p, name), tuple) else v for name in BUILT_FROM}  # as JSON
    return values | {"test_sha256": record_file(test)["sha256"] if test.is_file() else None}


@cpu_threads()  # tokenizing, and the head regime's encoder pass: this process's share of the CPUs, restored after
def features(
    p: Params,
    run: ResolvedRun | None = None,
    *,
    cache: Cache | None = None,
    quiet: bool = False,
    hw: HardwareInfo | None = None,
) -> Features:
    """Read and validate the data (sample submission included), fit max_length to it, tokenize (and embed, for the
    head regime) through the cache, and save it all for 02 and 03 (features.json + features/)."""
    run = run or presets.load_run(p.work_dir)
    hw = measured(p, hw)  # the precision 00 measured (a cache hit), for the plan and the head regime's encoder pass
    log = (lambda _msg: None) if quiet else print
    # one line for the whole stage at the end, not one per entry (the token tables alone are three: lengths, train,
    # test); seeds: the inputs' caches, as data
    summed = cache is None
    cache = cache or Cache(p.cache_dir, seed_dirs=p.seed_caches, log=None)
    data = read_competition(p, run)

    train, test, spec = data.train, data.test, data.spec
    texts = train[p.text].tolist()
    workload = get_task(p.task)
    tokenizer, model, identity = workload.load(run, spec, train, p, _model_choice(p))
    texts, test_texts = workload.prompts(texts, tokenizer), workload.prompts(test[p.text].tolist(), tokenizer)
    cap = int(getattr(tokenizer, "model_max_length", 512) or 512)
    cap = min(cap, max(512, run.preset.max_length_cap))  # 512 for encoders; a causal LM's preset: its positions
    full = tokenize_texts(texts, tokenizer, max_length=cap, cache=cache)
    lengths = workload.lengths(train, p, tokenizer, full.lengths)
    shown = run  # what 00 showed and saved, fitted to 00's rough lengths (or none): now the tokenizer's decide
    run = resolve_run(p, hw, lengths, preset=run.preset, overrides=run.overrides, world_size=run.world_size)
    run = dataclasses.replace(run, task=p.task, metric=data.metric.name, baseline=shown.baseline)
    if run.config.max_length != shown.config.max_length:
        log(_max_length_changed(shown, run))
    run = planned_checkpointing(p, hw, run)  # at the tokenizer's length
    run = workload.tune(run, lengths, model)
    _check_enough_rows(train[p.target], spec, run, p)
    if spec.kind == "regression":
        log(describe_objective(spec, data.metric.name, p.objective))
    max_length = run.config.max_length or cap
    report = length_report(lengths, run.config.micro_batch_size, max_length=max_length, used=run.config.batching)
    report = dataclasses.replace(report, what=f"inputs: the {p.text!r} column, cut at their end")
    train_tokens = tokenize_texts(texts, tokenizer, max_length=max_length, cache=cache)
    test_tokens = tokenize_texts(test_texts, tokenizer, max_length=max_length, cache=cache)
    encoder = Encoder(tokenizer, model, max_length, run, hw, cache, progress=not quiet)
    extra = workload.extra(texts, test_texts, encoder)
    feats = Features(
        spec=spec,
        run=run,
        model_identity=identity,
        max_length=max_length,
        vocab_size=len(tokenizer),
        pad_id=getattr(tokenizer, "pad_token_id", None) or 0,
        labels=workload.labels(spec, train, p, tokenizer, model, cache),
        train_tokens=train_tokens,
        test_tokens=test_tokens,
        test_ids=data.test_ids,
        submission_columns=data.columns,
        embeddings=extra.embeddings,
        ngrams=extra.ngrams,
        side=dataclasses.replace(data.side, state={**data.side.state, **workload.saved_state(tokenizer, p)}),
        groups=_groups(p, train),
        report=report,
    )
    handoff.save(feats, p.work_dir, built_from(p))
    if summed:
        log(str(cache.stats))
    return feats


def _max_length_changed(shown: ResolvedRun, fitted: ResolvedRun) -> str:
    """Why 01 trains at another max_length than 00 showed: 00 had word counts (or no lengths), 01 the tokens."""
    before = (
        f"00 estimated lengths from word counts (x{TOKENS_PER_WORD} tokens per word + {SPECIAL_TOKENS})"
        if shown.mean_tokens is not None
        else "00 had no lengths (the preset's cap)"
    )
    why = next((r.split(": ", 1)[1] for r in fitted.reasons if r.startswith("max_length")), "")
    return (
        f"max_length {fitted.config.max_length} tokens, not the {shown.config.max_length} 00 showed: {before}; 01 "
        f"counted every row with the model's tokenizer ({why})"
    )


def load_features(p: Params) -> Features:
    """What 01_features saved: no CSV read, no tokenizer or model loaded (a fraction of a second)."""
    return handoff.load(p.work_dir, built_from(p))


# ------------------------------------------------------------------------------------------------------ 02 train
def _check_enough_rows(target: pd.Series, spec: TargetSpec, run: ResolvedRun, p: Params) -> None:
    """What 02 would find after minutes of set-up, found in 01: too few rows for one training batch after the
    validation hold-out (an error); a class too rare to be both learned and validated (a warning: it trains only)."""
    n_train = len(target) - len(_split(len(target), p.seed)[1])
    batch = run.config.micro_batch_size * run.world_size
    if n_train < batch:
        raise DataError(
            f"{p.train_file} has {len(target)} rows: after holding out {len(target) - n_train} for validation, "
            f"{n_train} are left, fewer than one training batch of {batch} (batches are full: drop_last). Add rows, "
            "or lower micro_batch_size in the picker's advanced settings"
        )
    if spec.kind not in ("binary", "multiclass"):
        return
    counts = target.value_counts()
    rare = counts[counts < MIN_CLASS_ROWS]
    if len(rare) == len(counts):
        raise DataError(
            f"{p.train_file}: every one of its {len(counts)} classes has fewer than {MIN_CLASS_ROWS} rows (class "
            f"{rare.index[0]!r} has {int(rare.iloc[0])} row): none can be validated. Fix: merge classes so that some "
            "have at least 2 rows, or check that target names the label column (a number or a text to generate: "
            "task = 'regress', 'seq2seq' or 'causal-lm')"
        )
    if len(rare):  # a competition's rows cannot be added: the class is learned, and left out of the metric
        advise(
            f"{p.train_file}: class {rare.index[0]!r} has {int(rare.iloc[0])} row ({len(rare)} class(es) with fewer "
            f"than {MIN_CLASS_ROWS} rows, of {len(counts)} classes in {len(target)} rows): their rows all train, "
            "and the validation metric never sees those classes",
            stacklevel=2,
        )


def _split(n: int, seed: int, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) row indices, seeded. ``labels`` (class codes): rows of a class with fewer than
    MIN_CLASS_ROWS rows stay in training, so every class is learned; without such rows the split is the plain one."""
    order = np.random.default_rng(seed).permutation(n)
    n_valid = max(1, round(VALID_FRACTION * n))
    if labels is not None:
        values, counts = np.unique(labels, return_counts=True)
        rare = np.isin(labels[order], values[counts < MIN_CLASS_ROWS])
        order = np.concatenate([order[~rare], order[rare]])  # last: never among the first n_valid
        n_valid = max(1, min(n_valid, int(np.sum(~rare))))
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


def splits(
    n: int, seed: int, folds: int = 1, labels: np.ndarray | None = None, groups: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, validation) row indices, seeded, one pair per fold. ``folds`` = 1: the VALID_FRACTION hold-out
    (``_split``); k > 1: every row validated by exactly one fold, each class (``labels``: class codes) spread evenly
    over the folds. ``groups`` (a code per row): a group's rows all in one fold, the largest groups placed first on
    the fold with fewest rows (classes are then not stratified); with folds = 1 the hold-out is one of
    1/VALID_FRACTION such folds."""
    if groups is None and folds == 1:
        return [_split(n, seed, labels)]
    rng, k = np.random.default_rng(seed), folds if folds > 1 else round(1 / VALID_FRACTION)
    fold = np.empty(n, dtype=np.int64)
    if groups is not None:
        inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)[1:]
        order = rng.permutation(len(sizes))
        rows, of_group = np.zeros(k, dtype=np.int64), np.empty(len(sizes), dtype=np.int64)
        for g in order[np.argsort(-sizes[order], kind="stable")]:  # largest first, ties in seeded order
            of_group[g] = int(np.argmin(rows))
            rows[of_group[g]] += sizes[g]
        fold = of_group[inverse.ravel()]
    else:
        order = rng.permutation(n)
        if labels is not None:
            order = order[np.argsort(labels[order], kind="stable")]  # class by class, shuffled within: dealt out
        fold[order] = np.arange(n) % k
    return [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in range(folds)]


def _splits(p: Params, feats: Features) -> list[tuple[np.ndarray, np.ndarray]]:
    """The run's (train, validation) rows per fold (``p.fold`` picks the one a stage trains or predicts with)."""
    classes = feats.labels if feats.spec.kind in ("binary", "multiclass") else None
    return splits(feats.n_train, p.seed, p.folds, classes, feats.groups)


def _baseline(p: Params, data: Competition) -> Baseline:
    """The trivial baseline's score on the validation rows 02 will hold out (the same seeded split), in 00; with
    folds, on every row (each is validated out of fold), the constant chosen on them all."""
    y = data.train[p.target].to_numpy()
    every = np.arange(len(y))
    train_idx, valid_idx = splits(len(y), p.seed, 1, None, _groups(p, data.train))[0] if p.folds == 1 else (every,) * 2
    return trivial_baseline(data.metric, kind=data.spec.kind, train=y[train_idx], valid=y[valid_idx])


def _judge_baseline(
    p: Params, feats: Features, result: FitResult, staging: Path, watched: BestRows | None = None, oof: bool = False
) -> FitResult:
    """The model's validation score beside the baseline's: in ``baseline.json``
    (what 03 warns from) and in 02's summary, with the model-minus-baseline interval (``watched``: the validation
    predictions at the best score; ``oof``: every fold's, out of fold) and one line saying what to try when the
    model does not clearly beat it."""
    from kitlib.machine.distributed import dist_env

    if feats.run.baseline is None:  # a run.json from an older kitlib
        return result
    baseline = Baseline.from_dict(feats.run.baseline)
    score = _model_score(result.history, baseline.metric, result.best_epoch)
    blended = (staging / trees.TREES_FILE).is_file() and watched is not None and watched.score is not None
    score = watched.score if (blended or oof) and watched is not None else score  # the blend: what 03 will write
    gap = None
    if watched is not None and watched.rows is not None and baseline.value is not None:
        y_true, y_pred = watched.rows
        gap = compare(watched.metric, y_true, y_pred, baseline.constant(len(y_true)), seed=p.seed)
    limits = getattr(result.model, "kitlib_limits", None)  # a generating task's: how many training targets are cut
    record = baseline.to_dict() | {"model_score": score, "kind": feats.spec.kind, "done": _done(feats)}
    record |= {"gap": None if gap is None else dataclasses.asdict(gap), "cut_targets": getattr(limits, "cut", 0)}
    record |= {"folds": p.folds} if oof else {}
    record["beaten"] = baseline.verdict(score, feats.spec.kind, gap) is None
    if dist_env().is_main:  # under DDP only rank 0 writes: the others' staging folder is rank 0's, moved when done
        write_atomic(staging / BASELINE_FILE, json.dumps(record, indent=1) + "\n")
    return dataclasses.replace(result, notes=(*result.notes, baseline.line(), _verdict_line(record)))


def _verdict_line(record: Mapping[str, Any]) -> str:
    """02's verdict line from a baseline.json record: "verdict: ..." when the model beats the baseline, else
    "warning: ..."."""
    return ("verdict: " if record["beaten"] else "warning: ") + verdict_of(record)


def _blend_trees(p: Params, feats: Features, watched: BestRows, staging: Path) -> str | None:
    """02: trees beside the network where the run wants them (kitlib.notebook.trees): fitted on the training split,
    blended with the network's best validation predictions by the weight the metric scores best there. The weight
    goes to run/trees.json for 03, the blend into ``watched`` (the verdict judges what 03 will write); 02's line."""
    from kitlib.machine.distributed import dist_env

    if not trees.wanted(feats) or watched.rows is None:
        return None
    kind = feats.spec.kind
    train_idx, valid_idx = _splits(p, feats)[p.fold]
    y_true, net = watched.rows
    if len(y_true) != len(valid_idx) or not np.array_equal(feats.spec.decode(feats.labels[valid_idx]), y_true):
        return "trees: skipped (the full eval's rows are not the validation split in order)"
    fitted = trees.Trees.fit(feats, train_idx, p.seed)
    if fitted is None:
        return None
    metric, by_trees = watched.metric, fitted.predict(feats, valid_idx)
    weight, score = trees.blend(metric, y_true, net, by_trees, kind)
    said = {"weight": weight, "network": watched.score, "trees": metric(y_true, by_trees), "blend": score}
    if dist_env().is_main:
        write_atomic(staging / trees.TREES_FILE, json.dumps(said, indent=1) + "\n")
    watched.score, watched.rows = score, (y_true, trees.mix(net, by_trees, weight, kind))
    return (
        f"trees (scikit-learn HistGradientBoosting on the columns + text embeddings): validation {metric.name} "
        f"{said['trees']:.4g}, network {said['network']:.4g}; 03 writes {weight:g} x trees + {1 - weight:g} x network "
        f"({score:.4g})"
    )


def _with_trees(p: Params, feats: Features, values: np.ndarray) -> np.ndarray:
    """03: the submission's values blended with the trees by 02's weight (run/trees.json), the trees refitted on the
    same training rows with the same seed (seconds; nothing pickled). With folds, each fold's trees by its weight,
    the blends averaged (classes: fold 1's)."""
    blends = []
    for fold, (train_idx, _) in enumerate(_splits(p, feats)):
        try:
            run_dir = dataclasses.replace(p, fold=fold).run_dir
            weight = float(json.loads((run_dir / trees.TREES_FILE).read_text())["weight"])
        except (OSError, ValueError, KeyError):
            continue  # no trees in this run
        fitted = trees.Trees.fit(feats, train_idx, p.seed) if weight > 0 else None
        if fitted is not None:
            print(f"trees: {weight:g} x trees + {1 - weight:g} x network (02's blend: {run_dir.name}/trees.json)")
            blends.append(trees.mix(values, fitted.predict(feats, None), weight, feats.spec.kind))
            if feats.spec.kind != "regression":
                break  # classes take the first fold's blend: the other folds' trees need not be fitted
    if not blends:
        return values
    return np.mean(blends, axis=0) if feats.spec.kind == "regression" else blends[0]


def _done(feats: Features) -> list[str]:
    """What the run did already, as the verdict's advice reads it: the preset's name, the regression loss."""
    return [feats.run.name, *([feats.spec.loss] if feats.spec.kind == "regression" else [])]


def verdict_of(record: Mapping[str, Any]) -> str:
    """The run's verdict, one line, from ``baseline.json``'s record (02 writes it; 02's summary, 03 and its summary
    read it): the model beats the trivial baseline (its model-minus-baseline interval above zero), or is "unclear"
    (the interval straddles zero), or does not beat it, with what to try that the run did not do; and how many
    training targets were cut at the length cap (each such row a guaranteed miss)."""
    gap = Gap(**record["gap"]) if record.get("gap") else None
    baseline, score = Baseline.from_dict(record), record.get("model_score")
    line = baseline.verdict(score, str(record.get("kind", "")), gap, record.get("done", ())) or (
        f"the model ({baseline.metric} {score:.4g}) beats the trivial baseline ({baseline.what}: "
        f"{baseline.score:.4g})" + (f": {gap.line()}" if gap else "")
    )
    cut = int(record.get("cut_targets") or 0)
    line = f"out of fold ({record['folds']} folds): {line}" if record.get("folds") else line
    return line + (f"; {cut} training targets are cut at the length cap (the score gives them away)" if cut else "")


def _model_score(history: pd.DataFrame, metric: str, best_epoch: int | None) -> float | None:
    """The kept checkpoint's metric: its epoch's, else the last one computed (a metric scored at the end only)."""
    if metric not in history or history[metric].isna().all():
        return None
    scored = history.dropna(subset=[metric])
    kept = scored[scored["epoch"] == best_epoch] if best_epoch is not None else scored.iloc[0:0]
    return float((kept if len(kept) else scored.tail(1))[metric].iloc[0])


def prepare(p: Params, feats: Features, hw: HardwareInfo) -> Prepared:
    """Loaders and the model to train for the features' run (the same split every time: seeded): the regime's text
    model inside what the task builds around it (kitlib.notebook.tasks), with the run's adapter when it has one."""

    prepared = get_task(p.task).prepare(feats, hw, _splits(p, feats)[p.fold], p.seed, _model_choice(p))
    cfg = feats.run.config
    half = frozen_dtype(cfg.precision, cfg.adapter, hw.device_type)  # a frozen base needs no fp32 master copy
    generating = feats.spec.kind == "sequence"
    model = add_adapter(prepared.model, cfg.adapter, generating=generating, base_dtype=half, seed=p.seed)
    return dataclasses.replace(prepared, model=model)


def train(
    p: Params,
    feats: Features | None = None,
    *,
    hw: HardwareInfo | None = None,
    callbacks: tuple[object, ...] = (),
) -> FitResult:
    """fit() the model of the features' run (the one fitted to the data); artifacts land in ``p.run_dir``. With
    ``folds`` > 1, once per fold (run/, run-fold2/, ...), then the verdict on the out-of-fold predictions
    (``run/oof.csv``, ``run/baseline.json``); the result is fold 1's with every fold's lines. After an interruption
    02 again keeps the folds it finished (``_finished_folds``), continues the interrupted one and trains the rest.

    A run resolved for several GPUs (Kaggle's 2xT4) trains in that many forked DDP workers, each loading the saved
    features; this process must not have touched CUDA before (kitlib.machine.distributed.launch says so clearly).
    """
    feats = feats or load_features(p)
    kept = _finished_folds(p, feats)
    said = f"folds {', '.join(str(fold + 1) for fold in kept)} of {p.folds} kept: an earlier 02 finished them"
    if kept:
        print(f"{said} with these inputs (best/ and out-of-fold predictions saved); the others train, an interrupted "
              "one continuing from its last/")  # fmt: skip
    results: dict[int, FitResult] = {}
    for fold in (fold for fold in range(p.folds) if fold not in kept):
        if p.folds > 1:
            print(f"fold {fold + 1} of {p.folds}: {dataclasses.replace(p, fold=fold).run_dir}")
        results[fold] = _train_fold(dataclasses.replace(p, fold=fold), feats, hw, callbacks)
        if results[fold].stop_reason == "sigterm":  # 02 again continues this fold (its run.new/ is kept)
            return results[fold]
    if p.folds == 1:
        return results[0]
    cpu = feats.run.world_size > 1  # DDP: this process must not touch CUDA (02 again launches), as _train_fold
    first = results[0] if 0 in results else _finished_result(p, feats, _cpu(hw) if cpu else hw or detect())
    judged = _out_of_fold(p, feats, first)
    return dataclasses.replace(judged, notes=(*judged.notes, said)) if kept else judged


def _finished_folds(p: Params, feats: Features) -> list[int]:
    """The folds an interrupted 02 finished, which 02 keeps (``folds`` > 1): while the folds' run is unfinished
    (no run/oof.csv, its last file), a fold whose run dir holds best/ and its predictions for this split's
    validation rows, trained on these features with this config (what the machine decides aside: the batching it
    measured, a rehearsal's precision), and no later attempt at it begun (a run.new/, which 02 continues)."""
    from kitlib.engine import checkpoint

    if p.folds == 1 or (p.run_dir / OOF_FILE).exists():
        return []
    wanted, kept = _inputs(p, _train_config(p, feats)), []
    machine = ("batching", "batching_measured", "precision", "tf32")
    for fold, (_, valid_idx) in enumerate(_splits(p, feats)):
        run_dir, staging = dataclasses.replace(p, fold=fold).run_dir, _staging(dataclasses.replace(p, fold=fold))
        saved = read_json_object(run_dir / INPUTS_FILE)
        config = {k: v for k, v in saved.get("config", {}).items() if k not in machine}
        alike = saved.get("features") == wanted["features"] and config == {
            k: v for k, v in wanted["config"].items() if k not in machine
        }
        rows = read_json_object(run_dir / VALID_FILE).get("row")
        if alike and rows == valid_idx.tolist() and checkpoint.latest(run_dir, "best") and not staging.exists():
            kept.append(fold)
    return kept


def _cpu(hw: HardwareInfo | None) -> HardwareInfo:
    return dataclasses.replace(hw or detect(), accelerators=())


def _finished_result(p: Params, feats: Features, hw: HardwareInfo) -> FitResult:
    """Fold 1's FitResult, read back from run/ when an earlier 02 finished that fold: the model at best/, and the
    history, timing and config its fit wrote (what 02's later cells show and diagnose)."""
    import pandas as pd

    from kitlib.engine import checkpoint
    from kitlib.engine.loop import FitResult
    from kitlib.machine.precision import PrecisionPlan

    ran, timing = read_json_object(p.run_dir / "config.json"), read_json_object(p.run_dir / "timing.json")
    model, best = prepare(p, feats, hw).model, checkpoint.load(_trained_checkpoint(p.run_dir, p))
    checkpoint.restore_model(model, best)
    history, monitor = pd.read_csv(p.run_dir / "history.csv"), ran["monitor"]
    return FitResult(model=model, history=history, stop_reason=timing["run"]["stop_reason"],
                     best_metric=best.meta["metrics"].get(monitor), best_epoch=best.meta["epoch"],
                     steps=timing["run"]["steps"], skipped_steps=int(history["skipped_steps"].iloc[-1]),
                     precision=PrecisionPlan(**ran["precision"]), timing=timing, run_dir=p.run_dir, monitor=monitor,
                     config=TrainConfig.from_dict(ran["config"]))  # fmt: skip


def _out_of_fold(p: Params, feats: Features, first: FitResult) -> FitResult:
    """Every fold's validation predictions as one out-of-fold set: run/oof.csv, and the verdict judged on it (the
    interval over every training row) in run/baseline.json, what 03 and ``outcome`` read; ``first``: fold 1's result,
    the one 02 returns, with each fold's verdict (its run dir's baseline.json) under it."""
    import pandas as pd

    parts, notes = [], []
    for fold, (_, valid_idx) in enumerate(_splits(p, feats)):
        run_dir = dataclasses.replace(p, fold=fold).run_dir
        try:
            rows = json.loads((run_dir / VALID_FILE).read_text())
        except OSError:  # background_eval = "process" scores elsewhere and keeps no rows here
            why = f"no out-of-fold verdict: fold {fold + 1} kept no validation predictions"
            return dataclasses.replace(first, notes=(*first.notes, why))
        if len(rows["prediction"]) != len(valid_idx):
            raise CheckpointError(f"fold {fold + 1}: {len(rows['prediction'])} predictions for {len(valid_idx)} rows")
        parts.append(pd.DataFrame({"row": valid_idx, "fold": fold + 1} | rows))
        record = read_json_object(run_dir / BASELINE_FILE)
        notes.append(f"fold {fold + 1}: {_verdict_line(record) if record else ''}")
    oof = pd.concat(parts).sort_values("row")
    write_atomic(p.run_dir / OOF_FILE, oof.to_csv(index=False))
    watched = BestRows(_run_metric(p, feats))
    watched.rows = (oof["target"].to_numpy(), oof["prediction"].to_numpy())
    watched.score = watched.metric(*watched.rows)
    judged = _judge_baseline(p, feats, first, p.run_dir, watched, oof=True)
    notes.append(f"out-of-fold predictions: {p.run_dir / OOF_FILE}")
    return dataclasses.replace(judged, notes=(*judged.notes, *notes))


def _train_fold(p: Params, feats: Features, hw: HardwareInfo | None, callbacks: tuple[object, ...]) -> FitResult:
    """One fold's training (``p.fold``; the whole run without folds) into its run dir."""
    stand_in = _machine_for_plan(p, feats, hw, processes=feats.run.world_size)
    hw = stand_in.hw if stand_in is not None else hw
    cfg = _train_config(p, feats, stand_in)
    prepared = None
    if feats.run.world_size == 1 or stand_in is not None:  # this process reaches the device that trains
        prepared = prepare(p, feats, hw or detect())
        cfg, prepared = measured_batching(p, feats, cfg, prepared, hw or detect())
    resume = _stage(p, cfg)  # here, once, before any DDP worker exists
    if feats.run.world_size > 1:
        from kitlib.engine import checkpoint
        from kitlib.machine.distributed import WorkerDied, launch

        cpu = stand_in.hw if stand_in is not None else None
        try:
            result, weights = launch(_train_worker, p, cfg, cpu, callbacks, resume, nprocs=feats.run.world_size)
        except WorkerDied as err:
            kept = [str(c) for n in ("last", "best") if (c := checkpoint.latest(_staging(p), n)) is not None]
            saved = ", ".join(kept) or "no checkpoint of this attempt yet"
            raise WorkerDied(
                f"{str(err).partition('. Fix:')[0]}. Saved: {saved}. Fix: run "
                "notebooks/02_train.ipynb again (headless: the same `python -m kitlib notebooks run` command): it "
                f"continues from {_staging(p).name}/last when one is saved, else it starts this run again"
            ) from None
        # Rebuilt on the CPU (a qlora base in 4 bits there too): this process must not touch CUDA, so 02 can run again
        model = prepare(p, feats, _cpu(hw)).model
        checkpoint.restore_model(model, checkpoint.Snapshot(weights, None, {}))  # an adapter's tensors only
        return dataclasses.replace(result, model=model)
    return _train(p, feats, cfg, hw=hw, callbacks=callbacks, resume=resume, prepared=prepared)


# In the cache dir: 02's measured tokens/s per batching, machine and run. v2: packed batches hold a bucketed batch's
# tokens since #31 (v1 measured batch_size full rows), so a v1 figure would pick by a layout no longer trained.
BATCHING_PROBE_FILE = "batching_probe_v2.json"


def measured_batching(
    p: Params, feats: Features, cfg: TrainConfig, prepared: Prepared, hw: HardwareInfo
) -> tuple[TrainConfig, Prepared]:
    """The faster of the task's batchings on the device that trains (``prepared.choices`` against ``train``: a causal
    LM's packed rows against length buckets; kitlib.doctor.probe.probe_batching, a few steps' time), as ``cfg``'s
    batching with the tokens/s it measured (run/config.json and timing.json record both), and its loader as
    ``train``. Kept in the cache dir per machine, model and run shape, so a resumed run batches as it began. CUDA
    DDP measures nothing (the parent must not touch CUDA): its workers train 01's batching."""
    import torch

    from kitlib.doctor.probe import probe_batching
    from kitlib.engine.step import enable_activation_checkpointing
    from kitlib.machine.precision import Precision, decide_precision

    if not prepared.choices:
        return cfg, prepared
    loaders = {**prepared.choices, cfg.batching: prepared.train}  # packed first: the token budget the others match
    plan = decide_precision(hw, cfg.precision, tf32=cfg.tf32)
    threads = torch.get_num_threads() if plan.device_type == "cpu" else ""
    shape = (feats.model_identity, cfg.adapter, plan.dtype, cfg.gradient_checkpointing, cfg.max_length,
             cfg.micro_batch_size, feats.n_train)  # fmt: skip
    key = " | ".join(str(v) for v in (hw.device_name, threads, torch.__version__, *shape))
    file = p.cache_dir / BATCHING_PROBE_FILE
    known = read_json_object(file)
    measured: dict[str, float] | None = known.get(key)
    if measured is None:
        model = prepared.model.to(plan.device_type)
        if cfg.gradient_checkpointing:  # as fit trains it: the probe fits where training does
            enable_activation_checkpointing(model, cfg.checkpoint_modules)
        try:
            measured = probe_batching(model, loaders, loss_fn=get_task(p.task).loss_fn(feats.spec),
                                      autocast=Precision(plan).autocast)  # fmt: skip
        except torch.OutOfMemoryError:  # fit's back-off halves the micro-batch; the probe does not: 01's batching
            torch.cuda.empty_cache()
            print(f"batching {cfg.batching}: not measured (the probe ran out of device memory)")
            return cfg, dataclasses.replace(prepared, choices={})
        write_atomic(file, json.dumps({**known, key: measured}, indent=1) + "\n")
    chosen = max(measured, key=lambda b: measured[b])
    said = ", ".join(f"{b} {v:,.0f}" for b, v in sorted(measured.items(), key=lambda kv: -kv[1]))
    print(f"batching {chosen}: measured real tokens/s on {hw.device_name}: {said}")
    cfg = dataclasses.replace(cfg, batching=chosen, batching_measured=tuple(sorted(measured.items())))  # type: ignore[arg-type]
    return cfg, dataclasses.replace(prepared, train=loaders[chosen], choices={})


def _train_worker(
    p: Params, cfg: TrainConfig, hw: HardwareInfo | None, callbacks: tuple[object, ...], resume: bool
) -> tuple[FitResult, dict[str, Any]]:
    """Rank 0's result and trained weights (on the CPU; with an adapter its tensors only, as a checkpoint holds them:
    a 4-bit base's quantisation state is rebuilt with it): the parent rebuilds the model and loads them. The model
    itself may not cross: a custom task's class comes from a file that only the worker imported. ``hw``: a rehearsal's
    CPU, else None (each worker detects its machine)."""
    import torch

    from kitlib.engine import checkpoint

    result = _train(p, load_features(p), cfg, hw=hw, callbacks=callbacks, resume=resume)
    weights = {name: t.cpu() for name, t in checkpoint.saved_state(result.model).items()}
    return dataclasses.replace(result, model=torch.nn.Module()), weights


def _monitor_task_metric(cfg: TrainConfig, metric: Metric) -> TrainConfig:
    """Keep the checkpoint the competition would score best: the metric, whenever a cadence computes it (every N
    epochs: best/ and patience judge those epochs only, the ones in between carry the loss alone).

    Loss and accuracy part ways as a classifier grows confident: on the demo, ``best`` (4 epochs) had its lowest
    validation loss after epoch 2 (accuracy 0.827) and its highest accuracy after epoch 4 (0.839).
    """
    if cfg.full_eval_every < 1 or cfg.monitor != "eval_loss":  # the metric only at the end, or chosen by hand
        return cfg
    return dataclasses.replace(cfg, monitor=metric.name, mode=metric.mode)


def _run_metric(p: Params, feats: Features) -> Metric:

    return get_metric(feats.run.metric, feats.spec.kind, data_dir=p.data_dir)


def _train_config(p: Params, feats: Features, stand_in: StandIn | None = None) -> TrainConfig:
    """The config 02 trains: run.json's, seeded, following the task's metric; a rehearsal's in the CPU's precision
    (what ran is then what run/config.json and timing.json record)."""
    cfg = dataclasses.replace(feats.run.config, seed=p.seed)
    if stand_in is not None:
        cfg = dataclasses.replace(cfg, precision=stand_in.precision.dtype, tf32=stand_in.precision.tf32)
    return _monitor_task_metric(cfg, _run_metric(p, feats))


def _staging(p: Params) -> Path:
    return p.run_dir.with_name(p.run_dir.name + ".new")  # this run's files until it finishes


def _inputs(p: Params, cfg: TrainConfig) -> dict[str, Any]:
    """What a run trains on, as its inputs.json keeps it (read back: tuples are lists): the config, the features."""
    inputs = {"config": cfg.to_dict(), "features": record_file(p.work_dir / handoff.FEATURES_FILE)["sha256"]}
    return dict(json.loads(json.dumps(inputs, default=str)))


def _stage(p: Params, cfg: TrainConfig) -> bool:
    """Prepare ``run.new/``; True when it holds an interrupted attempt (killed, or stopped by SIGTERM) with the same
    config and features and a complete ``last/`` checkpoint: 02 continues it, so a restarted session picks up where
    the last one ended. Anything else there is superseded by this run."""
    from kitlib.engine import checkpoint

    staging, inputs = _staging(p), _inputs(p, cfg)
    try:
        saved = json.loads((staging / INPUTS_FILE).read_text())
    except (OSError, ValueError):
        saved = None
    resumable = checkpoint.latest(staging, "last") is not None
    if saved == inputs and resumable:
        print(f"continuing the interrupted run in {staging} from its last checkpoint (same config, same features)")
        return True
    if saved is not None and resumable:  # resumable, but not this run: kept
        changed = sorted(k for k in inputs["config"] if inputs["config"][k] != saved.get("config", {}).get(k))
        why = f"config: {', '.join(changed)}" if changed else "the features changed (01 ran again)"
        aside = keep_aside(staging)
        print(f"an interrupted run with other inputs ({why}) was not continued: kept as {aside}; this run starts fresh")
    shutil.rmtree(staging, ignore_errors=True)
    write_atomic(staging / INPUTS_FILE, json.dumps(inputs, indent=1) + "\n")
    return False


def _train(
    p: Params,
    feats: Features,
    cfg: TrainConfig,
    *,
    hw: HardwareInfo | None,
    callbacks: tuple[object, ...],
    resume: bool,
    prepared: Prepared | None = None,
) -> FitResult:
    import torch

    from kitlib.engine.loop import fit
    from kitlib.machine.distributed import dist_env

    hw = hw or detect()
    prepared = prepared or prepare(p, feats, hw)
    if prepared.choices:  # a DDP worker: the batching the parent measured (cfg), or 01's
        chosen = prepared.choices.get(cfg.batching)
        prepared = dataclasses.replace(prepared, train=chosen or prepared.train, choices={})
    device = torch.device("cuda" if hw.device_type == "cuda" else hw.device_type)
    staging = _staging(p)
    watched = BestRows(_run_metric(p, feats))  # the validation predictions the verdict's interval resamples
    result = fit(
        prepared.model,
        prepared.train,
        config=cfg,
        loss_fn=get_task(p.task).loss_fn(feats.spec),
        eval_loader=prepared.valid,
        full_eval=get_task(p.task).evaluate(feats.spec, watched.watching(), prepared.valid, device),
        run_dir=staging,
        resume=resume,
        hw=hw,
        callbacks=callbacks,
    )
    result = dataclasses.replace(result, notes=(*result.notes, *prepared.notes))
    line = _blend_trees(p, feats, watched, staging)
    result = dataclasses.replace(result, notes=(*result.notes, line)) if line else result
    result = _judge_baseline(p, feats, result, staging, watched)
    if p.folds > 1 and watched.rows is not None and dist_env().is_main:  # this fold's part of the out-of-fold rows
        rows = {"row": _splits(p, feats)[p.fold][1].tolist(), "target": watched.rows[0].tolist(),
                "prediction": watched.rows[1].tolist()}  # fmt: skip
        write_atomic(staging / VALID_FILE, json.dumps(rows) + "\n")
    best = staging / "best" / "model.safetensors"
    if cfg.adapter != "none" and best.is_file():
        print(f"best/ holds the {cfg.adapter} adapter only: {describe_size(best.stat().st_size, result.model)}")
    if result.stop_reason == "sigterm":  # not a finished run: run/ stays as it was; the next 02 continues this one
        print(f"stopped by SIGTERM: {staging}/last saved; run 02_train again to continue from there")
        return dataclasses.replace(result, run_dir=staging)
    if dist_env().is_main:
        _publish(staging, p.run_dir)
    return dataclasses.replace(result, run_dir=p.run_dir)


def _publish(staging: Path, final: Path) -> None:
    """A finished run replaces ``run/``; the one before stays as ``run.prev/``. A run that raised never gets here,
    so the last good run/ (best/ checkpoint included) is never destroyed by a failed one."""
    previous = final.with_name(final.name + ".prev")
    if final.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(final, previous)
    os.rename(staging, final)


# ------------------------------------------------------------------------------------------------------ 03 infer
@cpu_threads()  # predicting on the CPU: this process's share of the CPUs, restored after
def infer(
    p: Params,
    feats: Features | None = None,
    *,
    run_dirs: list[Path] | None = None,
    hw: HardwareInfo | None = None,
) -> pd.DataFrame:
    """Predict the test set with the best checkpoint of each run dir (mean of their predictions), check the
    submission against what 01 saw in sample_submission.csv, and write ``work_dir/submission.csv``."""
    import pandas as pd
    import torch

    from kitlib.engine import checkpoint
    from kitlib.machine.precision import Precision, decide_precision

    hw = hw or detect()
    feats = feats or load_features(p)
    stand_in = _machine_for_plan(p, feats, hw, processes=1)  # prediction runs in this process
    if stand_in is not None:
        hw, plan = stand_in.hw, stand_in.precision
    else:
        plan = decide_precision(hw, feats.run.config.precision)
    precision = Precision(plan)
    device = torch.device(precision.plan.device_type)
    prepared = prepare(p, feats, hw)  # one architecture: each strict restore overwrites every weight
    predictions = []
    workload = get_task(p.task)
    runs = [kaggle_input(Path(d)) for d in run_dirs or []] or [p.run_dir]
    for run_dir in runs + [d for d in _fold_dirs(p) if d not in runs]:  # the k fold models, averaged
        checkpoint.restore_model(prepared.model, checkpoint.load(_trained_checkpoint(run_dir, p)))
        predictions.append(
            workload.predict(prepared.model, prepared.test, precision=precision, device=device, spec=feats.spec,
                             interactive=hw.interactive, desc=f"predict ({run_dir.name})")
        )  # fmt: skip
    _warn_unbeaten(p.run_dir)
    values = _with_trees(p, feats, workload.submission(workload.combine(predictions), feats.spec))
    submission = pd.DataFrame({p.id: feats.test_ids, p.target: values})
    return write_submission(submission, feats.submission_columns, feats.n_test, p.work_dir / "submission.csv")


EXPORT_MARK = "kitlib-export.json"  # in a folder export-merged wrote: the only kind it moves aside to write again


def export_merged(
    work_dir: str | os.PathLike[str], out: str | os.PathLike[str], hw: HardwareInfo | None = None
) -> Path:
    """One model folder at ``out``: 03's model (the model folder's weights + best/'s adapter) with the adapter
    merged in (kitlib.models.adapters.merge_adapter), and the model folder's tokenizer files beside it; a
    transformers ``from_pretrained`` loads it without peft. ``python -m kitlib export-merged WORK_DIR OUT``."""
    import torch

    from kitlib.engine import checkpoint

    target = Path(out)
    made = (target / EXPORT_MARK).is_file()
    if target.is_file() or (target.is_dir() and any(target.iterdir()) and not made):
        held = sorted(f.name for f in target.iterdir())[:5] if target.is_dir() else "a file"
        raise SetupError(
            f"export-merged's folder {target} already holds {held}, not written by export-merged: writing there would "
            "replace them. Fix: name a new or empty folder for the merged model"
        )
    p = load_params(work_dir)
    feats = load_features(p)
    adapter = feats.run.config.adapter
    if adapter == "none":
        raise SetupError(f"{p.run_dir} trained without an adapter: best/ is already the whole model. Fix: use it as is")
    hw = hw or detect()
    if adapter == "qlora" and hw.device_type != "cuda":
        raise SetupError(
            "this run trained qlora adapters on 4-bit weights: merging rebuilds that 4-bit model and dequantises it, "
            "with bitsandbytes on a CUDA GPU, and this machine has none. Fix: export on a CUDA machine, or keep base "
            "+ adapter (03 loads them)"
        )
    model = prepare(p, feats, hw).model
    checkpoint.restore_model(model, checkpoint.load(_trained_checkpoint(p.run_dir, p)))
    merged = merge_adapter(model)
    if made:  # an earlier export: kept, never written over
        print(f"the earlier export in {target} is kept as {keep_aside(target)}")
    target.mkdir(parents=True, exist_ok=True)
    (target / EXPORT_MARK).write_text(json.dumps({"work_dir": str(work_dir), "adapter": adapter}) + "\n")
    save = getattr(merged, "save_pretrained", None)
    if callable(save):
        save(target)
    else:  # a task's own module around the pretrained model: its state_dict, for the model 03 builds
        from safetensors.torch import save_model

        save_model(merged, str(target / "model.safetensors"))
    folder = Path(p.model)
    if folder.is_dir():  # saved by transformers, so every file it loads from comes along (chat_template.jinja, ...)
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(folder).save_pretrained(target)
    size = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
    weights = sum(t.numel() for t in merged.state_dict().values() if isinstance(t, torch.Tensor))
    print(f"merged: the {adapter} adapter of {p.run_dir.name}/ folded into {p.model}: {target} ({size / 1e6:.1f} MB, "
          f"{weights / 1e6:.1f} M weights; loads without peft)")  # fmt: skip
    return target


def outcome(work_dir: str | os.PathLike[str]) -> list[str]:
    """What a finished run recorded, in a few lines: the validation score beside the trivial baseline's and the
    verdict (run/baseline.json, as 02 judged it), the kept epoch (best/), where the submission is. 03's last cell
    and the end of ``python -m kitlib notebooks run`` print them."""
    run, lines = Path(work_dir) / "run", []
    try:
        record = json.loads((run / BASELINE_FILE).read_text())
        baseline, score = Baseline.from_dict(record), record.get("model_score")
        shown = "no score" if score is None else f"{score:.4g}"
        lines.append(f"validation {baseline.metric}: {shown}, {baseline.line()}")
        lines.append(f"verdict: {verdict_of(record)}")
    except (OSError, ValueError, KeyError):
        lines.append(f"verdict: none recorded ({run / BASELINE_FILE} is missing: 02 did not finish)")
    try:
        epoch = json.loads((run / "best" / "meta.json").read_text())["epoch"]
        lines.append(f"kept: the checkpoint of epoch {epoch} ({run / 'best'})")
    except (OSError, ValueError, KeyError):
        lines.append(f"kept: no best/ checkpoint in {run}")
    submission = Path(work_dir) / "submission.csv"
    lines.append(f"submission: {submission}" if submission.is_file() else "submission: none written")
    return lines


def _warn_unbeaten(run_dir: Path) -> None:
    """A UserWarning before the submission is written when 02 found the model no better than a constant."""
    try:
        record = json.loads((run_dir / BASELINE_FILE).read_text())
    except (OSError, ValueError):
        return  # a run from an older kitlib, or trained outside the notebooks
    if not record.get("beaten", True):
        verdict = verdict_of(record)
        # 4: past infer and the contextlib frame of its @cpu_threads, so the box names the 03 cell, not contextlib.py
        advise(f"{verdict}. The submission is written anyway.", stacklevel=4)


def _fold_dirs(p: Params) -> list[Path]:
    return [dataclasses.replace(p, fold=fold).run_dir for fold in range(1, p.folds)]


def _trained_checkpoint(run_dir: Path, p: Params) -> Path:
    """``run_dir``'s best (else last) checkpoint, trained on the features 01 saved; else an error naming the fix."""
    from kitlib.engine import checkpoint

    found = checkpoint.latest(run_dir, "best") or checkpoint.latest(run_dir, "last")
    if found is None:
        for name in ("best", "last"):
            if (run_dir / name).exists():
                try:
                    checkpoint.load(run_dir / name)  # fails, saying what is wrong with it
                except CheckpointError as err:
                    raise CheckpointError(
                        f"{err} In the notebooks: run 02_train again ({run_dir.name}.prev/ holds the run before)"
                    ) from None
        interrupted = _staging(p)
        if run_dir == p.run_dir and checkpoint.latest(interrupted, "last") is not None:
            raise MissingRunError(
                f"no finished training run in {run_dir}: the last one was interrupted ({interrupted}/last is saved). "
                "Fix: run notebooks/02_train.ipynb again; it continues from there"
            )
        raise MissingRunError(f"no checkpoint in {run_dir}: run notebooks/02_train.ipynb first")
    if run_dir not in (p.run_dir, *_fold_dirs(p)):  # an extra run (another seed or machine): the restore checks shapes
        return found
    try:
        trained_on = json.loads((run_dir / INPUTS_FILE).read_text())["features"]
    except (OSError, ValueError, KeyError):
        return found  # a run from an older kitlib, or trained outside the notebooks: nothing to compare
    if trained_on != record_file(p.work_dir / handoff.FEATURES_FILE)["sha256"]:
        raise CheckpointError(
            f"{run_dir} was trained on other features than the ones 01_features saved since (another preset, model, "
            "data or parameters). Fix: run notebooks/02_train.ipynb again, or re-run 01 with the settings that run "
            "was trained with"
        )
    return found
