"""The notebook stages 00 (``setup``) and 01 (``features``) as functions (02 and 03: kitlib.notebook.training); each
reads what the previous one saved in the working dir and names the notebook to run first when it is missing."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib._files import record_file
from kitlib.data.cache import Cache
from kitlib.data.featurize import tokenize_texts
from kitlib.data.lengths import length_report
from kitlib.data.tables import DataError, read_table
from kitlib.doctor.memory_plan import (
    GENERATING,
    checkpointing_needed,
    planned_parallel,
    run_line,
)
from kitlib.errors import KitError, SetupError
from kitlib.machine.hardware import check_torch_supports, cuda_devices, detect, fake_profile
from kitlib.machine.precision import PrecisionPlan, decide_stage_precision
from kitlib.machine.threads import cpu_threads
from kitlib.models.folders import check_model_dir, pretrained_dir, tiny_requested
from kitlib.notebook import handoff, presets
from kitlib.notebook.estimate import MINILM_MATMUL_PARAMS, VALID_FRACTION, estimate_run
from kitlib.notebook.handoff import Features

# params and load_params are the notebooks' first call (stages.params in 00, stages.load_params in 01-03): one import
from kitlib.notebook.params import (  # noqa: F401
    BUILT_FROM,
    TRAINING,
    Params,
    from_cell,
    load_params,
    params,
)
from kitlib.notebook.submission import check_sample_submission
from kitlib.notebook.tasks import get_task, task_entry
from kitlib.notebook.tasks.base import Encoder
from kitlib.progress import advise
from kitlib.tasks.baseline import Baseline, Gap, trivial_baseline
from kitlib.tasks.metrics import check_metric, get_metric
from kitlib.tasks.targets import describe_objective

# lazy: torch (+1.0 s), pandas (+0.2 s): importing the stages loads neither (0.3 s with numpy), so notebooks 00 and 01
# and the CLI that only read data and the run never pay for them (python -X importtime). transformers (+0.6 s): 00
# reads the model's tokenizer for its estimate only.

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from kitlib.data.tables import TargetSpec
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.handoff import SideInputs
    from kitlib.notebook.presets import Choice, Preset, ResolvedRun
    from kitlib.tasks.metrics import Metric

BASELINE_FILE = "baseline.json"  # in run/: the trivial baseline's and the model's validation scores (03 warns)
MIN_CLASS_ROWS = 2  # one to learn from and one to validate on; a rarer class trains only (with a warning)
# Rough tokens per whitespace word (WordPiece/BPE on English) where 00 has no tokenizer to ask; a model folder's own
# tokenizer is asked on TOKEN_SAMPLE_ROWS rows (docs/measurements.md); 01 measures the real lengths.
TOKENS_PER_WORD = 1.3
TOKEN_SAMPLE_ROWS = 500  # ~0.1 s for a fast tokenizer, plus ~0.3 s to load it
TOKENIZER_DIR = "tokenizer"  # in work_dir: 01's tokenizer, saved for the inference-only route
SPECIAL_TOKENS = 2  # [CLS] and [SEP], which every tokenized row carries


# ------------------------------------------------------------------------------------------------------ 00 setup
def setup(
    p: Params,
    hw: HardwareInfo | None = None,
    *,
    preset: str | Preset | None = None,
    overrides: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> Choice:
    """Check the hardware, the data and the choice (``p``'s, or the picker's) as 01 would, and save it (run.json,
    params.json). Resolves nothing."""
    hw = hw or detect()
    check_torch_supports(hw)  # e.g. a P100 with a torch build lacking sm_60: a clear error now, not in 02_train
    choice = choose(p, preset, overrides, world_size)
    presets.check(choice, planning_hw(p, hw))
    _check_model(p)
    # The data's problems surface here, in seconds, before anything is written: a bad parameter never replaces
    # the run.json/params.json of the last good run (01 reads and checks the same files again).
    data = read_competition(p, choice)
    _check_enough_rows(data.train[p.target], data.spec, p)
    choice = dataclasses.replace(choice, metric=data.metric.name, baseline=_baseline(p, data).to_dict())
    p.work_dir.mkdir(parents=True, exist_ok=True)
    choice.save(p.work_dir)
    chosen = {k: v for k, v in choice.overrides.items() if k in TRAINING}  # the picker's, as parameters
    dataclasses.replace(p, preset=choice.name, **chosen).save()  # the picker's choice: params.json and run.json agree
    return choice


def choose(
    p: Params,
    preset: str | Preset | None = None,
    overrides: Mapping[str, Any] | None = None,
    world_size: int | None = None,
) -> Choice:
    """The run ``p`` asks for, unresolved: ``preset`` (default ``p.preset``) as its task trains it, ``p``'s training
    parameters under ``overrides`` (the picker's): the one place they merge."""
    chosen = p.preset if preset is None else preset
    base = presets.get_preset(chosen) if isinstance(chosen, str) else chosen
    strategy = {"strategy": p.strategy} if p.strategy else {}  # None: the plan's (presets.resolve)
    merged = p.training() | strategy | dict(overrides or {})
    return presets.Choice(task_preset(p)(base), merged, world_size, task=p.task)


def resolve_run(
    p: Params,
    hw: HardwareInfo,
    lengths: Sequence[int] | np.ndarray | None = None,
    *,
    preset: str | Preset | None = None,
    overrides: Mapping[str, Any] | None = None,
    world_size: int | None = None,
    choice: Choice | None = None,
) -> ResolvedRun:
    """``choice`` (00's saved one, else ``choose``'s) resolved for ``lengths`` on the machine 02 trains on: 01 calls
    it once and saves it, the picker previews it."""
    return presets.resolve(choice or choose(p, preset, overrides, world_size), planning_hw(p, hw), lengths=lengths)


def _model_dir(p: Params) -> str | Path | None:
    """The folder of ``p``'s model, or None where the task builds it ("auto" without MiniLM: MissingModelError)."""
    if _built_by_task(p) or (p.model == "auto" and tiny_requested()):
        return None
    return pretrained_dir() if p.model == "auto" else p.model


@dataclass(frozen=True)
class DataFacts:
    """What 00's picker needs from the data: its time estimate and a max_length fitted to the texts."""

    n_rows: int  # train.csv's rows; each preset trains on at most its row_limit of them (the estimate applies it)
    lengths: np.ndarray  # rough tokens per row (int64): whitespace words x TOKENS_PER_WORD + SPECIAL_TOKENS
    n_test: int = 0  # test.csv's rows: 01 featurises them and 03 predicts them (the whole run's estimate)
    model_params: float | None = None  # matmul weights a token passes (the estimate's FLOPs); None: MiniLM's
    trees: bool = False  # columns beside the text, scikit-learn installed: the head regime fits trees on small tables


def data_facts(p: Params) -> DataFacts:
    """train.csv's rows and rough token lengths and test.csv's rows, read and checked as ``setup`` reads them; no
    weights loaded (a model folder's tokenizer reads TOKEN_SAMPLE_ROWS rows; Task.rough_cost may build a model)."""
    train = _read_train(p)
    cost = get_task(p.task).rough_cost(train, p)  # a task that knows its tokens and model better
    lengths, weights = (None, None) if cost is None else (cost.lengths, cost.weights)
    if lengths is None:
        words = train[p.text].str.split().str.len().to_numpy(dtype=np.float64)
        lengths = np.ceil(words * _tokens_per_word(p, train[p.text])).astype(np.int64) + SPECIAL_TOKENS
    test = read_table(p.data_dir / p.test_file, text=p.text, id=p.id)
    return DataFacts(len(train), lengths, len(test), weights, _trees(p))


def _trees(p: Params) -> bool:
    """Whether 02 fits trees beside the network (columns and scikit-learn); the estimate applies MAX_ROWS."""
    return bool(p.numeric or p.categorical) and find_spec("sklearn") is not None


def _tokens_per_word(p: Params, texts: Any) -> float:
    """Tokens per whitespace word of ``p``'s model's tokenizer on TOKEN_SAMPLE_ROWS texts; TOKENS_PER_WORD where
    there is none to load."""
    try:
        if (folder := _model_dir(p)) is None:
            return TOKENS_PER_WORD
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)  # never the network
    except (KitError, OSError, ValueError):
        return TOKENS_PER_WORD
    sample = [str(t) for t in texts.iloc[:TOKEN_SAMPLE_ROWS]]
    words = sum(len(t.split()) for t in sample)
    tokens = sum(map(len, tokenizer(sample, add_special_tokens=False, verbose=False)["input_ids"]))
    return tokens / words if words else TOKENS_PER_WORD


def task_preset(p: Params) -> Callable[[Preset], Preset]:
    """The preset as ``p``'s task trains it (Task.preset), applied once: a preset it made (``adjusted_for``) comes
    back as it is."""

    task = get_task(p.task)

    def adjust(preset: Preset) -> Preset:
        adjusted = preset if preset.adjusted_for == p.task else task.preset(preset, p)
        if adjusted == preset:
            return preset
        # the description says what the task changed: "balanced: ... frozen input embeddings" read as a lie when
        # causal-lm trains every weight
        changed = [f"{f.name} {getattr(adjusted, f.name)}" for f in dataclasses.fields(preset)
                   if getattr(adjusted, f.name) != getattr(preset, f.name)]  # fmt: skip
        description = f"{preset.description}; as task {p.task!r} trains it: {', '.join(changed)}"
        return dataclasses.replace(adjusted, adjusted_for=p.task, description=description)

    return adjust


def _built_by_task(p: Params) -> bool:
    """``p``'s model is built by its task, with no config to read ("tiny", "auto" of a generating task, custom)."""
    kind = task_entry(p.task).model_kind
    return not kind or p.model == "tiny" or (p.model == "auto" and kind in GENERATING)


def planned_strategy(p: Params, hw: HardwareInfo, run: ResolvedRun) -> ResolvedRun:
    """``run`` sharded with FSDP where ``strategy`` is None and the memory plan fits the planned GPUs only sharded."""
    if p.strategy or run.world_size == 1 or run.config.strategy == "fsdp" or _built_by_task(p):
        return run
    try:
        chosen = planned_parallel(p.model, task_entry(p.task).model_kind, planning_hw(p, hw), run)
    except KitError:  # no plan for this model: DDP, as resolved
        return run
    if chosen != "fsdp":
        return run
    why = "strategy fsdp: the plan's: the weights, gradients and optimizer state fit these GPUs only sharded"
    print(why)
    reasons = (*(r for r in run.reasons if not r.startswith("strategy ")), why)
    return dataclasses.replace(run, config=dataclasses.replace(run.config, strategy="fsdp"), reasons=reasons)


def planned_checkpointing(p: Params, hw: HardwareInfo, run: ResolvedRun) -> ResolvedRun:
    """``run`` with gradient checkpointing on where it is None and the memory plan fits the run only so."""
    cfg = run.config
    if cfg.gradient_checkpointing or "gradient_checkpointing" in run.choice.overrides or run.preset.regime == "head":
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
    """The picker's ``memory``: the memory plan's line for a run of ``p``'s model on the machine 02 trains on, one
    plan kept per length and batch."""
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


def read_competition(p: Params, run: Choice | ResolvedRun) -> Competition:
    """Read and check train/test/sample_submission (columns, ids, texts, targets, the task): a DataError naming the
    file and the fix."""
    workload = get_task(p.task)
    if run.preset.regime not in workload.regimes:
        fits = [name for name, preset in presets.PRESETS.items() if preset.regime in workload.regimes]
        raise SetupError(
            f"preset {run.name!r} trains in the {run.preset.regime} regime, which task {p.task!r} cannot use (it needs "
            f"{' or '.join(workload.regimes)}): pick one of {fits} in 00_setup (preset, or KIT_PRESET headless)"
        )
    train = _read_train(p)
    spec = workload.target(train[p.target], p, p.metric)
    metric = get_metric(p.metric, spec.kind, data_dir=p.data_dir)
    check_metric(metric, train[p.target], f"{p.train_file} column {p.target!r}")
    if run.preset.row_limit is not None and len(train) > run.preset.row_limit:
        train = train.sample(run.preset.row_limit, random_state=p.seed).sort_index()
    test = read_table(p.data_dir / p.test_file, text=p.text, id=p.id)
    test_ids = [i.item() if isinstance(i, np.generic) else i for i in test[p.id]]
    columns = check_sample_submission(p.data_dir / p.sample_submission, test_ids, id=p.id, target=p.target)
    side = workload.side_inputs(p, train, test)
    _check_folds(p, train, spec)
    return Competition(train, test, test_ids, columns, spec, metric, side)


def _check_folds(p: Params, train: pd.DataFrame, spec: TargetSpec) -> None:
    """The group column exists, and each fold can validate a whole group, or a row of every class (stratified)."""
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
    """This machine's CPU standing in for the planned accelerator (``rehearse``): gloo processes, ``precision``."""

    hw: HardwareInfo  # this machine without its accelerators: every process on the CPU, gloo between them
    precision: PrecisionPlan


def _cpu(hw: HardwareInfo | None) -> HardwareInfo:
    return dataclasses.replace(hw or detect(), accelerators=())


def _machine_for_plan(p: Params, feats: Features, hw: HardwareInfo | None, processes: int) -> StandIn | None:
    """None on the machine run.json was planned for; a StandIn where ``rehearse`` plays it on this CPU; else an
    error naming the fix. Without ``hw``, GPUs are counted without initialising CUDA."""

    if not p.hardware:
        return None
    planned = fake_profile(p.hardware)
    gpus = hw.num_gpus if hw is not None else len(cuda_devices())
    if planned.num_gpus == gpus:
        return None
    if p.rehearse and gpus < planned.num_gpus:
        cpu = _cpu(hw)
        plan, run = decide_stage_precision(cpu, feats.run.preset.precision), feats.run
        who = (
            f"{processes} gloo processes on this machine's CPU stand" if processes > 1 else "this machine's CPU stands"
        )
        print(f"rehearsal: {who} in for {p.hardware} ({run.hardware}), {plan.dtype} for {run.config.precision} "
              f"({plan.reason})")  # fmt: skip
        return StandIn(cpu, plan)
    rehearse = "" if p.rehearse else "; or rehearse it on this machine's CPU first: rehearse = True (KIT_REHEARSE=1)"
    raise SetupError(
        f"run.json was planned for {feats.run.hardware} (hardware = {p.hardware!r} in 00's parameters), but this "
        f"machine has {gpus} GPU(s). Fix: give this kernel that accelerator (kaggle build --gpu), or set "
        f"hardware = '' in 00 and re-run 00 and 01 on this machine{rehearse}"
    )


def _check_model(p: Params) -> None:
    """The model the parameters name is there (a model folder, or for "auto" the installed all-MiniLM-L6-v2)."""
    if p.model == "auto" and not tiny_requested():
        pretrained_dir()
    elif p.model not in ("auto", "tiny") and Path(p.model).is_absolute():
        check_model_dir(p.model)


def _model_choice(p: Params) -> dict[str, Any]:
    return {"auto": {}, "tiny": {"tiny": True}}.get(p.model, {"model_dir": p.model})


def built_from(p: Params) -> dict[str, Any]:
    """The parameters the saved features depend on (``BUILT_FROM``) and test.csv's sha256 (a code competition's
    rerun swaps the test set): one read of test.csv, no parsing."""
    test = p.data_dir / p.test_file
    values = {name: list(v) if isinstance(v := getattr(p, name), tuple) else v for name in BUILT_FROM}  # as JSON
    return values | {"test_sha256": record_file(test)["sha256"] if test.is_file() else None}


@cpu_threads()  # tokenizing, the head regime's encoder pass: this process's share of the CPUs, restored after
def features(
    p: Params,
    choice: Choice | None = None,
    *,
    cache: Cache | None = None,
    quiet: bool = False,
    hw: HardwareInfo | None = None,
) -> Features:
    """01: read and check the data, resolve the choice once at the tokenizer's lengths, tokenize (and embed, for the
    head regime) through the cache, and save it all for 02 and 03 (features.json + features/)."""
    from kitlib.models.facts import non_embedding_params

    choice = choice or presets.load_choice(p.work_dir)
    hw = hw or detect()
    log = (lambda _msg: None) if quiet else print
    # one cache line for the whole stage, at its end; seeds: the inputs' caches
    summed = cache is None
    cache = cache or Cache(p.cache_dir, seed_dirs=p.seed_caches, log=None)
    data = read_competition(p, choice)

    train, test, spec = data.train, data.test, data.spec
    texts = train[p.text].tolist()
    workload = get_task(p.task)
    tokenizer, model, identity = workload.load(choice, spec, train, p, _model_choice(p))
    texts, test_texts = workload.prompts(texts, tokenizer), workload.prompts(test[p.text].tolist(), tokenizer)
    cap = int(getattr(tokenizer, "model_max_length", 512) or 512)
    cap = min(cap, max(512, choice.preset.max_length_cap))  # 512 for encoders; a causal LM's preset: its positions
    full = tokenize_texts(texts, tokenizer, max_length=cap, cache=cache)
    lengths = workload.lengths(train, p, tokenizer, full.lengths)
    # the one resolution of the run, at the tokenizer's lengths: features.json saves it, 02, 03 and the doctor read it
    run = resolve_run(p, hw, lengths, choice=choice)
    run = workload.tune(planned_strategy(p, hw, planned_checkpointing(p, hw, run)), lengths, model)
    log(run.summary())
    # 00 headless resolves nothing to show; the loaded model's matmul weights, MiniLM's without one
    weights = non_embedding_params(model) if hasattr(model, "modules") else MINILM_MATMUL_PARAMS
    estimate = estimate_run(run, len(train), len(test), hw, model_params=weights, folds=p.folds, trees=_trees(p))
    log(f"estimate: {estimate.text()}")
    if run.world_size > max(hw.num_gpus, 1):  # planned for a bigger machine: how 02 runs there (docs/guide.md: Slurm)
        log(f"02 on the planned {run.world_size} GPUs (the work dir on that machine): torchrun --standalone "
            f"--nproc_per_node {run.world_size} -m kitlib train --work-dir {p.work_dir}")  # fmt: skip
    _check_enough_rows(train[p.target], spec, p, run.config.micro_batch_size * run.world_size)
    if spec.kind == "regression":
        log(describe_objective(spec, data.metric.name, p.objective))
    max_length = run.config.max_length or cap
    report = length_report(lengths, run.config.micro_batch_size, max_length=max_length, used=run.config.batching)
    report = dataclasses.replace(report, what=f"inputs: the {p.text!r} column, cut at their end")
    extra = workload.extra(texts, test_texts, Encoder(tokenizer, model, max_length, run, hw, cache, progress=not quiet))
    feats = Features(
        spec=spec,
        run=run,
        model_identity=identity,
        max_length=max_length,
        vocab_size=len(tokenizer),
        pad_id=getattr(tokenizer, "pad_token_id", None) or 0,
        labels=workload.labels(spec, train, p, tokenizer, model, cache),
        train_tokens=tokenize_texts(texts, tokenizer, max_length=max_length, cache=cache),
        test_tokens=tokenize_texts(test_texts, tokenizer, max_length=max_length, cache=cache),
        test_ids=data.test_ids,
        submission_columns=data.columns,
        embeddings=extra.embeddings,
        ngrams=extra.ngrams,
        side=dataclasses.replace(data.side, state={**data.side.state, **workload.saved_state(tokenizer, p)}),
        groups=_groups(p, train),
        report=report,
    )
    handoff.save(feats, p.work_dir, built_from(p))
    if callable(save := getattr(tokenizer, "save_pretrained", None)):  # what a published run tokenizes test rows with
        save(p.work_dir / TOKENIZER_DIR)  # (kitlib.notebook.inference); a tiny model's is trained here: ~100 KB
    if summed:
        log(str(cache.stats))
    return feats


def load_features(p: Params) -> Features:
    """What 01_features saved: no CSV read, no tokenizer or model loaded (a fraction of a second)."""
    return handoff.load(p.work_dir, built_from(p))


# --------------------------------------------------------------------- the split and the verdict (00 to 03 read them)
def _check_enough_rows(target: pd.Series, spec: TargetSpec, p: Params, batch: int = 1) -> None:
    """Too few rows for one training ``batch`` after the hold-out (an error); a class too rare to be learned and
    validated (an error when every class is, else a warning)."""
    n_train = len(target) - len(_split(len(target), p.seed)[1])
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
    """Seeded (train, validation) row indices per fold: the VALID_FRACTION hold-out, or k folds stratified by
    ``labels``; ``groups`` keep a group's rows in one fold (largest first, on the fold with fewest rows)."""
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
    """The trivial baseline's score on the rows 02 will validate on (with folds: every row)."""
    y = data.train[p.target].to_numpy()
    every = np.arange(len(y))
    train_idx, valid_idx = splits(len(y), p.seed, 1, None, _groups(p, data.train))[0] if p.folds == 1 else (every,) * 2
    return trivial_baseline(data.metric, kind=data.spec.kind, train=y[train_idx], valid=y[valid_idx])


def verdict_of(record: Mapping[str, Any]) -> str:
    """The run's verdict, one line, from 02's ``baseline.json`` record: beats the trivial baseline, unclear, or not
    (with what to try), and how many training targets the length cap cut."""
    gap = Gap(**record["gap"]) if record.get("gap") else None
    baseline, score = Baseline.from_dict(record), record.get("model_score")
    line = baseline.verdict(score, str(record.get("kind", "")), gap, record.get("done", ())) or (
        f"the model ({baseline.metric} {score:.4g}) beats the trivial baseline ({baseline.what}: "
        f"{baseline.score:.4g})" + (f": {gap.line()}" if gap else "")
    )
    cut = int(record.get("cut_targets") or 0)
    line = f"out of fold ({record['folds']} folds): {line}" if record.get("folds") else line
    return line + (f"; {cut} training targets are cut at the length cap (the score gives them away)" if cut else "")


def outcome(work_dir: str | os.PathLike[str]) -> list[str]:
    """A finished run in a few lines: score, baseline and verdict, the kept epoch, the submission (03's last cell
    and ``notebooks run`` print them)."""
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
