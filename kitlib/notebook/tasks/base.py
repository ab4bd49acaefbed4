"""What differs between workloads, behind one ``Task``; a user's task subclasses it (``task="module:name"``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kitlib.data.featurize import embed_texts
from kitlib.data.ngrams import NgramBags, NgramVectorizer
from kitlib.machine.precision import decide_stage_precision
from kitlib.notebook.handoff import Features, SideInputs
from kitlib.progress import advance, progress_bar
from kitlib.tasks.targets import read_target, regression_loss

# lazy: torch (+1.0 s): task classes are read (names, presets) without training

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeAlias

    import pandas as pd
    import torch
    from torch import nn

    from kitlib.config import TargetRule
    from kitlib.data.cache import Cache
    from kitlib.data.tables import TargetSpec
    from kitlib.engine.evaluation import SplitEval
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.presets import Choice, Preset, RegimeName, ResolvedRun
    from kitlib.tasks.metrics import Metric

    # fit's full_eval: model -> metrics, or a SplitEval whose scoring runs where TrainConfig.background_eval says
    FullEval: TypeAlias = Callable[[nn.Module], Any] | SplitEval
    # predict's parts: one batch's outputs, every batch's joined in loader order, words for the progress bar
    Predictor: TypeAlias = tuple[Callable[..., Any], Callable[[list[Any]], Any], str]

Split = tuple[np.ndarray, np.ndarray]  # (train rows, validation rows) of the training set
HEAD_LAYERS = 3  # head: mean-pool MiniLM's last 3 layers (1152 floats per row; see featurize.embed_texts)


@dataclass(frozen=True)
class Context:
    """What 02 and 03 build a run from: saved features, machine, this fold's rows, seed, model choice."""

    feats: Features
    hw: HardwareInfo
    split: Split
    seed: int
    choice: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prepared:
    train: Any  # DataLoader
    valid: Any
    test: Any
    model: nn.Module  # model(**batch) -> .logits (and .loss given labels), in both regimes
    notes: tuple[str, ...] = ()  # lines for 02's summary (a causal LM's examples cut to the width)
    # Other training loaders by batching; 02 measures them against ``train`` and trains the faster
    choices: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Extra:
    """What 01 computes besides the tokens (the head regime's frozen inputs)."""

    embeddings: tuple[np.ndarray, np.ndarray] | None = None
    ngrams: tuple[NgramBags, NgramBags] | None = None


@dataclass(frozen=True)
class Encoder:
    """What 01 has at hand when a task computes its extra features."""

    tokenizer: Any
    model: Any
    max_length: int
    run: ResolvedRun
    hw: HardwareInfo
    cache: Cache
    progress: bool = True  # a bar over long passes (the head's embedding pass: 40-100 s on a 2-core CPU)


class Params(Protocol):
    """The parameters the tasks read, typed as declared in kitlib.notebook.params.Params (derived: a test checks
    it; importing the declaration here, even for types, would close a cycle, since params imports the tasks)."""

    @property
    def data_dir(self) -> Path: ...
    @property
    def train_file(self) -> str: ...
    @property
    def test_file(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def model(self) -> str: ...
    @property
    def max_length(self) -> int | None: ...
    @property
    def model_factory(self) -> str: ...
    @property
    def objective(self) -> str: ...
    @property
    def numeric(self) -> tuple[str, ...]: ...
    @property
    def categorical(self) -> tuple[str, ...]: ...
    @property
    def adapter(self) -> str: ...
    @property
    def metric(self) -> str: ...


@dataclass(frozen=True)
class RoughCost:
    """What 00's estimate reads of a model a task knows: its rows' tokens and weights."""

    lengths: np.ndarray | None  # tokens per row as the model reads them; None: whitespace words x its tokenizer's rate
    weights: float  # matmul weights a token passes (embedding lookups left out): 6 x that in FLOPs to train it


class Task:
    """The text-to-label task (today's default): one text column to a class or a number."""

    name: str = "auto"
    target_rule: TargetRule = "auto"  # how kitlib.data.tables.infer_target reads the target column
    regimes: tuple[RegimeName, ...] = ("head", "finetune")  # the ways (presets.REGIMES) it can train in

    # ---------------------------------------------------------------------------------------------------- 00 setup
    def check(self, p: Params) -> None:
        """Parameters this task needs or refuses, before any file is read (a SetupError naming the fix)."""

    def columns(self, p: Params) -> tuple[str, ...]:
        return ()

    def target(self, column: pd.Series, p: Params, metric: str) -> TargetSpec:
        return read_target(column, self.target_rule, metric, p.objective)

    def side_inputs(self, p: Params, train: pd.DataFrame, test: pd.DataFrame) -> SideInputs:
        return SideInputs()

    def preset(self, preset: Preset, p: Params) -> Preset:
        """The preset as this task trains it; the picker's changes apply on top. Default: unchanged."""
        return preset

    # ------------------------------------------------------------------------------------------------- 01 features
    def load(
        self, run: Choice | ResolvedRun, spec: TargetSpec, train: pd.DataFrame, p: Params, choice: Mapping[str, Any]
    ) -> tuple[Any, Any, str]:
        """(tokenizer, model, identity) for 01: the head regime's encoder or finetune's classifier."""
        from kitlib.models.loading import load_text_classifier, load_text_encoder

        texts = train[p.text].tolist()
        if run.preset.regime == "head":
            return load_text_encoder(train_texts=texts, seed=p.seed, **choice)
        return load_text_classifier(spec.num_labels, train_texts=texts, seed=p.seed, **choice)

    def labels(
        self, spec: TargetSpec, train: pd.DataFrame, p: Params, tokenizer: Any, model: Any, cache: Any
    ) -> np.ndarray:
        """02's targets (int64 class codes or float32 transformed values) for the training rows."""
        return spec.encode(train[p.target])

    def lengths(self, train: pd.DataFrame, p: Params, tokenizer: Any, lengths: np.ndarray) -> np.ndarray:
        """Token counts max_length must cover (a generating task adds its target's)."""
        return lengths

    def rough_cost(self, train: pd.DataFrame, p: Params) -> RoughCost | None:
        """00's estimate from this task's own model (None: whitespace words through MiniLM)."""
        return None

    def prompts(self, texts: list[str], tokenizer: Any) -> list[str]:
        """The text column as the model reads it (a chat model: through its chat template)."""
        return texts

    def tune(self, run: ResolvedRun, lengths: np.ndarray, model: Any) -> ResolvedRun:
        """The run fitted to the data in 01, adjusted for this task's model (the causal LM picks its batching)."""
        return run

    def extra(self, texts: list[str], test_texts: list[str], encoder: Encoder) -> Extra:
        """What 01 computes besides the tokens: the head regime's embeddings and n-grams, nothing for finetune."""
        return _head_inputs(texts, test_texts, encoder) if encoder.run.preset.regime == "head" else Extra()

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        """JSON-able facts 02/03 need besides the arrays (e.g. 01's tokenizer), saved in features.json."""
        return {}

    # ---------------------------------------------------------------------------------------------------- 02 train
    def prepare(self, ctx: Context) -> Prepared:
        """Loaders and model for 02/03: the head on 01's embeddings (head regime) or the whole classifier (finetune)."""
        from kitlib.models.loading import load_classifier

        feats, seed = ctx.feats, ctx.seed
        if feats.run.preset.regime == "head":
            prepared = _head(ctx)
        else:
            sizes = {"vocab_size": feats.vocab_size, "pad_token_id": feats.pad_id, **ctx.choice}
            prepared = Prepared(*self.loaders(ctx), load_classifier(feats.spec.num_labels, seed=seed, **sizes))
        return dataclasses.replace(prepared, model=self.model(prepared.model, feats.spec, feats.side, seed))

    def loaders(self, ctx: Context) -> tuple[Any, Any, Any]:
        """(train, valid, test) loaders of the saved tokens, labels and side inputs."""
        from kitlib.data.loaders import TokenDataset, make_eval_loader, make_predict_loader, make_train_loader

        feats, hw = ctx.feats, ctx.hw
        cfg, tokens, y, side = feats.run.config, feats.train_tokens, feats.labels, feats.side

        def subset(idx: np.ndarray) -> TokenDataset:
            rows = {k: v[idx] for k, v in side.train.items()}
            return TokenDataset([tokens[int(i)] for i in idx], y[idx], pad_id=feats.pad_id, side=rows)

        return (
            make_train_loader(subset(ctx.split[0]), cfg, hw, seed=ctx.seed),
            make_eval_loader(subset(ctx.split[1]), cfg, hw),
            make_predict_loader(TokenDataset(feats.test_tokens, pad_id=feats.pad_id, side=side.test), cfg, hw),
        )

    def model(self, text_model: nn.Module, spec: TargetSpec, side: SideInputs, seed: int) -> nn.Module:
        return text_model

    def loss_fn(self, spec: TargetSpec) -> Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None:
        """fit's ``loss_fn`` (None: the model's own ``.loss``): a regression target's objective from its spec."""
        if spec.kind != "regression":
            return None
        loss = regression_loss(spec)

        def objective(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            return loss(model(**inputs).logits, batch["labels"])

        return objective

    def evaluate(self, spec: TargetSpec, metric: Metric, loader: Any, device: torch.device) -> FullEval:
        """Metric (in target units) and loss over every validation row in one pass; fit then skips its loss pass."""
        import torch

        from kitlib.engine.step import to_device

        move = to_device(device)
        objective = regression_loss(spec) if spec.kind == "regression" else None

        def evaluate(model: nn.Module) -> dict[str, float]:
            outputs, labels, loss_sum = [], [], 0.0
            for batch in loader:
                batch = move(batch)
                output = model(**batch)
                outputs.append(self.outputs(output.logits, spec))
                labels.append(batch["labels"])
                loss = output.loss if objective is None else objective(output.logits, batch["labels"])  # 02's loss
                loss_sum += float(loss) * len(batch["labels"])  # mean over rows -> weighted like fit's
            y_pred = self.submission(torch.cat(outputs).cpu().numpy(), spec)
            y_true = spec.decode(torch.cat(labels).cpu().numpy())
            return {metric.name: metric(y_true, y_pred), "eval_loss": loss_sum / len(y_true)}

        return evaluate

    # ---------------------------------------------------------------------------------------------------- 03 infer
    def outputs(self, logits: torch.Tensor, spec: TargetSpec) -> torch.Tensor:
        """One batch's logits -> what ``combine`` averages: class probabilities, or one value per row."""
        out = logits.float()
        return out.squeeze(-1) if spec.kind == "regression" else out.softmax(-1)

    def predict(
        self, model: nn.Module, loader: Any, *, precision: Any, device: torch.device, spec: TargetSpec,
        interactive: bool = False, desc: str = "predict",
    ) -> np.ndarray:  # fmt: skip
        """Outputs for every row in the dataset's order (the predict loader is length-sorted, then restored), under
        inference mode and the run's autocast, with progress in rows."""
        import torch

        from kitlib.data.loaders import restore_order
        from kitlib.engine.step import to_device

        step, gather, how = self.predictor(model, spec)
        move, results = to_device(device), []
        model.to(device).eval()
        bar = progress_bar(len(loader.dataset), desc=desc + how, interactive=interactive)
        try:
            with torch.inference_mode(), precision.autocast():
                for batch in loader:
                    results.append(step(move(batch)))
                    mask = batch.get("attention_mask")  # real tokens, when the batch has them
                    rows = len(batch["input_ids"]) if "input_ids" in batch else len(next(iter(batch.values())))
                    advance(bar, rows, 0 if mask is None else int(mask.sum()))
        finally:
            bar.close()  # short of its total (red in a notebook) only when predicting raised
        return np.asarray(restore_order(loader, gather(results)))

    def predictor(self, model: nn.Module, spec: TargetSpec) -> Predictor:
        """``predict``'s parts: a batch's class probabilities or values, joined in loader order."""
        import torch

        def step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            return self.outputs(model(**batch).logits, spec)

        return step, lambda outputs: torch.cat(outputs).cpu().numpy(), ""

    def combine(self, predictions: list[np.ndarray]) -> np.ndarray:
        """Several runs' outputs (an ensemble of seeds or machines) -> one: their mean."""
        return np.mean(predictions, axis=0)

    def submission(self, outputs: np.ndarray, spec: TargetSpec) -> np.ndarray:
        """Combined outputs (class probabilities, or one value per row) -> the submission's values."""
        return spec.decode(outputs if spec.kind == "regression" else outputs.argmax(-1))


def _head_inputs(texts: list[str], test_texts: list[str], e: Encoder) -> Extra:
    """The head regime's frozen inputs: the encoder's pooled embeddings and tf-idf n-gram bags of train and test."""
    from kitlib.machine.amp import Precision

    # Decided for 01's machine: run.json's precision is 02's, and 01 may run on a CPU (fp16 emulated)
    plan = decide_stage_precision(e.hw, e.run.preset.precision)
    if plan.dtype != e.run.config.precision:
        print(f"embedding pass: {plan.dtype} on this machine ({plan.reason}); 02 trains in {e.run.config.precision}")
    layers = min(HEAD_LAYERS, int(getattr(e.model.config, "num_hidden_layers", 1)))
    embed = dict(
        tokenizer=e.tokenizer, model=e.model, max_length=e.max_length, precision=Precision(plan), layers=layers,
        cache=e.cache,
    )  # fmt: skip
    vectorizer = NgramVectorizer.fit(texts)  # ~1 s for the demo: cheaper to rebuild than to cache
    train, test = ("embed train", "embed test") if e.progress else (False, False)  # the bars say which
    return Extra(
        embeddings=(embed_texts(texts, progress=train, **embed), embed_texts(test_texts, progress=test, **embed)),
        ngrams=(vectorizer.transform(texts), vectorizer.transform(test_texts)),
    )


def _head(ctx: Context) -> Prepared:
    """The head regime's loaders of 01's embeddings, n-grams and side inputs, and a freshly seeded TextHead."""
    import torch
    from torch.utils.data import DataLoader

    from kitlib.models.heads import RowDataset, TextHead

    feats, (train_idx, valid_idx) = ctx.feats, ctx.split
    if feats.embeddings is None or feats.ngrams is None:
        raise ValueError("head regime without embeddings: rerun 01_features with this run's preset")
    cfg = feats.run.config
    (x, x_test), (bags, bags_test) = (_tensor(e) for e in feats.embeddings), feats.ngrams
    target = _tensor(feats.labels)

    def columns(x: torch.Tensor, bags: NgramBags, side: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        text = {"embeddings": x, "ngram_ids": _tensor(bags.ids), "ngram_weights": _tensor(bags.weights)}
        return text | {name: _tensor(array) for name, array in side.items()}

    def rows(idx: np.ndarray) -> RowDataset:
        return RowDataset(**{k: v[idx] for k, v in columns(x, bags, feats.side.train).items()}, labels=target[idx])

    big = cfg.micro_batch_size * cfg.eval_batch_factor
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        head = TextHead(
            x.shape[1],
            feats.spec.num_labels,
            n_buckets=bags.n_buckets,
            regression=feats.spec.kind == "regression",
            mean=x[train_idx].mean(0),
            std=x[train_idx].std(0),
        )
    return Prepared(
        DataLoader(rows(train_idx), batch_size=cfg.micro_batch_size, shuffle=True),
        DataLoader(rows(valid_idx), batch_size=big),
        DataLoader(RowDataset(**columns(x_test, bags_test, feats.side.test)), batch_size=big),
        head,
    )


def _tensor(array: np.ndarray) -> torch.Tensor:
    """``array`` as a tensor sharing memory; a read-only array is copied (torch warns on those)."""
    import torch

    return torch.from_numpy(array if array.flags.writeable else array.copy())
