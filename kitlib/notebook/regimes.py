"""The two ways a preset trains a text model, each decided once as one object.

``head``: the encoder runs once, without gradients, to cache embeddings; a small head trains on them and on tf-idf
n-grams (seconds per epoch, one forward pass of cost). ``finetune``: the whole model trains on the tokens. Every
place that differs between them (the preset's reasons, the batch size, DDP, the time estimate, what 01 computes,
what 02 and 03 build) asks the run's regime instead of testing its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kitlib.data.featurize import embed_texts
from kitlib.data.ngrams import NgramVectorizer
from kitlib.machine.precision import decide_stage_precision
from kitlib.notebook.presets import RegimeName

# lazy: torch (+1.0 s), transformers (+0.6 s): only building models and loaders needs them (kitlib.models.loading);
# the regime names are read by the CLI, the picker and the Kaggle tooling (python -X importtime).

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from kitlib.data.cache import Cache
    from kitlib.data.ngrams import NgramBags
    from kitlib.data.tables import TargetSpec
    from kitlib.machine.hardware import HardwareInfo
    from kitlib.notebook.handoff import Features
    from kitlib.notebook.presets import ResolvedRun

    Split = tuple[np.ndarray, np.ndarray]  # (train rows, validation rows) of the training set

HEAD_LAYERS = 3  # head: mean-pool MiniLM's last 3 layers (1152 floats per row; see featurize.embed_texts)


@dataclass(frozen=True)
class Prepared:
    train: Any  # DataLoader
    valid: Any
    test: Any
    model: nn.Module  # model(**batch) -> .logits (and .loss given labels), in both regimes
    notes: tuple[str, ...] = ()  # lines for 02's summary (a causal LM's examples cut to the width)
    # Other training loaders by their batching (TrainConfig.batching), which 02 measures against ``train`` on the
    # training device before it trains the faster (training.measured_batching): a causal LM's packed rows
    choices: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Extra:
    """What a regime computes in 01 besides the tokens (the head's frozen inputs)."""

    embeddings: tuple[np.ndarray, np.ndarray] | None = None
    ngrams: tuple[NgramBags, NgramBags] | None = None


@dataclass(frozen=True)
class Encoder:
    """What 01 has at hand when a regime computes its extra features."""

    tokenizer: Any
    model: Any
    max_length: int
    run: ResolvedRun
    hw: HardwareInfo
    cache: Cache
    progress: bool = True  # a bar over long passes (the head's embedding pass: 40-100 s on a 2-core CPU)


class Regime:
    """What a regime builds; what resolving knows of it is data: kitlib.notebook.presets.REGIMES."""

    name: RegimeName

    def load(self, spec: TargetSpec, texts: list[str], seed: int, choice: Mapping[str, Any]) -> tuple[Any, Any, str]:
        """(tokenizer, model, identity) for 01."""
        raise NotImplementedError

    def extra(self, texts: list[str], test_texts: list[str], encoder: Encoder) -> Extra:
        """What 01 computes besides the tokens, with the tokenizer and model ``load`` gave."""
        return Extra()

    def prepare(
        self,
        feats: Features,
        hw: HardwareInfo,
        split: tuple[np.ndarray, np.ndarray],
        seed: int,
        choice: Mapping[str, Any],
    ) -> Prepared:
        """Loaders and the freshly initialised model for 02 and 03, from the saved features only."""
        raise NotImplementedError


class Finetune(Regime):
    name: RegimeName = "finetune"

    def load(self, spec: TargetSpec, texts: list[str], seed: int, choice: Mapping[str, Any]) -> tuple[Any, Any, str]:
        from kitlib.models.loading import load_text_classifier

        return load_text_classifier(spec.num_labels, train_texts=texts, seed=seed, **choice)

    def prepare(
        self,
        feats: Features,
        hw: HardwareInfo,
        split: tuple[np.ndarray, np.ndarray],
        seed: int,
        choice: Mapping[str, Any],
    ) -> Prepared:
        from kitlib.models.loading import load_classifier

        model = load_classifier(
            feats.spec.num_labels, vocab_size=feats.vocab_size, pad_token_id=feats.pad_id, seed=seed, **choice
        )
        return Prepared(*self.loaders(feats, hw, split, seed), model)

    def loaders(
        self, feats: Features, hw: HardwareInfo, split: tuple[np.ndarray, np.ndarray], seed: int
    ) -> tuple[Any, Any, Any]:
        """(train, valid, test) loaders of the saved tokens, labels (one per row, or a row of target tokens) and
        side inputs: what every model that reads tokens trains on (any task's own model too)."""
        from kitlib.data.loaders import TokenDataset, make_eval_loader, make_predict_loader, make_train_loader

        cfg, tokens, y, side = feats.run.config, feats.train_tokens, feats.labels, feats.side

        def subset(idx: np.ndarray) -> TokenDataset:
            rows = {k: v[idx] for k, v in side.train.items()}
            return TokenDataset([tokens[int(i)] for i in idx], y[idx], pad_id=feats.pad_id, side=rows)

        return (
            make_train_loader(subset(split[0]), cfg, hw, seed=seed),
            make_eval_loader(subset(split[1]), cfg, hw),
            make_predict_loader(TokenDataset(feats.test_tokens, pad_id=feats.pad_id, side=side.test), cfg, hw),
        )


class Head(Regime):
    name: RegimeName = "head"

    def load(self, spec: TargetSpec, texts: list[str], seed: int, choice: Mapping[str, Any]) -> tuple[Any, Any, str]:
        from kitlib.models.loading import load_text_encoder

        return load_text_encoder(train_texts=texts, seed=seed, **choice)

    def extra(self, texts: list[str], test_texts: list[str], encoder: Encoder) -> Extra:
        from kitlib.machine.amp import Precision

        e = encoder
        # Decided here, for the machine 01 runs on: run.json's precision is 02's (a Kaggle chain plans it for the T4
        # x2 while 01 may run on a CPU kernel, where fp16 is emulated).
        plan = decide_stage_precision(e.hw, e.run.preset.precision)
        if plan.dtype != e.run.config.precision:
            trains = e.run.config.precision
            print(f"embedding pass: {plan.dtype} on this machine ({plan.reason}); 02 trains in {trains}")
        precision = Precision(plan)
        layers = min(HEAD_LAYERS, int(getattr(e.model.config, "num_hidden_layers", 1)))
        embed = dict(
            tokenizer=e.tokenizer, model=e.model, max_length=e.max_length, precision=precision, layers=layers,
            cache=e.cache,
        )  # fmt: skip
        vectorizer = NgramVectorizer.fit(texts)  # ~1 s for the demo: cheaper to rebuild than to cache
        train, test = ("embed train", "embed test") if e.progress else (False, False)  # the bars say which
        return Extra(
            embeddings=(embed_texts(texts, progress=train, **embed), embed_texts(test_texts, progress=test, **embed)),
            ngrams=(vectorizer.transform(texts), vectorizer.transform(test_texts)),
        )

    def prepare(
        self,
        feats: Features,
        hw: HardwareInfo,
        split: tuple[np.ndarray, np.ndarray],
        seed: int,
        choice: Mapping[str, Any],
    ) -> Prepared:
        import torch
        from torch.utils.data import DataLoader

        from kitlib.models.heads import RowDataset, TextHead

        if feats.embeddings is None or feats.ngrams is None:
            raise ValueError("head regime without embeddings: rerun 01_features with this run's preset")
        cfg, (train_idx, valid_idx) = feats.run.config, split
        (x, x_test), (bags, bags_test) = (_tensor(e) for e in feats.embeddings), feats.ngrams
        target = _tensor(feats.labels)

        def columns(x: torch.Tensor, bags: NgramBags, side: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
            text = {"embeddings": x, "ngram_ids": _tensor(bags.ids), "ngram_weights": _tensor(bags.weights)}
            return text | {name: _tensor(array) for name, array in side.items()}

        def rows(idx: np.ndarray) -> RowDataset:
            return RowDataset(**{k: v[idx] for k, v in columns(x, bags, feats.side.train).items()}, labels=target[idx])

        big = cfg.micro_batch_size * cfg.eval_batch_factor
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
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
    """``array`` as a tensor sharing its memory; a read-only array (np.load(mmap_mode="r"), np.frombuffer of bytes:
    torch warns, as it could write through the tensor) is copied, only then. The hand-off's arrays are writable."""
    import torch

    return torch.from_numpy(array if array.flags.writeable else array.copy())


FINETUNE = Finetune()
REGIMES: Mapping[str, Regime] = MappingProxyType({r.name: r for r in (Head(), FINETUNE)})
