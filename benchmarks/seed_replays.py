"""Seed replays (not a test): the four workloads that motivated kitlib, each run three ways on the same data and seed.

    python benchmarks/seed_replays.py --all              # the four workloads (minutes on an idle 2-core CPU)
    python benchmarks/seed_replays.py --workload sql     # one workload;  --quick: a smoke-sized run of it
    python benchmarks/seed_replays.py --all --repeats 2  # contenders interleaved, each repeat in a fresh process
    python benchmarks/seed_replays.py --all --full --repeats 3 --threads 1   # issue 34's size: a minute or more each
    python benchmarks/seed_replays.py --all --threads 1  # every contender's intra-op threads (OMP_NUM_THREADS)
    python benchmarks/seed_replays.py --all --device cuda  # on the GPU (default auto: cuda when there is one)
    python benchmarks/seed_replays.py --make-data DIR    # the demos, for a machine without their packages:
    python benchmarks/seed_replays.py --all --demo-data DIR   # ... copied from DIR instead of made

Contenders, each in its own process, interleaved (before, after, kitlib, before, ...):
- before: a plain PyTorch loop written as the user wrote theirs: their micro-batch x accumulation, every batch padded
  to their fixed max length, their eval and save cadence, num_workers=0, features recomputed in the session.
- after: the same loop with the changes the user made by hand (their issue text, scaled to this data).
- kitlib: kitlib's defaults through the four notebooks' stage calls (``kitlib.notebook.stages``: setup, features,
  train, infer; what the cells call, in one process without a Jupyter kernel), preset ``balanced``, model ``tiny``,
  with only ``epochs`` set to the user's "after" budget so all three train the same number of epochs.

The model is the one kitlib builds for the task (a tiny T5, the demo's BiLSTM pointer-generator, a tiny GPT-2, a tiny
BERT + TabularNet), standing in for the users' t5-small / own model / 7B LM / DeBERTa; the plain loops build it the
same way (their ``from_pretrained``). The metric is computed by the demo's scorer on the same test rows for all three.
"before" writes a kitlib-format run record (timing.json, config.json) that ``kitlib.diagnose`` reads: the doctor's
findings on it are printed next to the saving the user's fix measured here. With a micro-batch of a few rows and
accumulation, the plain loop also measures ``probe_micro_batch`` on its model after the timed run and keeps it beside
the record (probes.json), as the doctor's micro-batch advice asks a user to.

``--device``: the plain loops put the model and each batch on it (``non_blocking`` where the user pinned) and apply
the TF32 setting the user's knobs name; kitlib's stages pick the device themselves (``--device cpu`` hides the GPUs
from every contender with CUDA_VISIBLE_DEVICES). The table says where each contender ran, at which precision.

Levers that cannot show on a CPU (reasoned, not measured): TF32 and AMP (no tensor cores; fp32 here), pinned memory
and non_blocking copies (no host-to-device copy), DataLoader workers on a shared 2-core machine (they compete with
the training process for the same cores), cudnn.benchmark, and the GPU-memory headroom that lets a bigger micro-batch
run at all.

``--threads``: on a shared machine whose load exceeds its cores, torch's default pool (one thread per core) waits at
every parallel region for a thread that is not running: measured here at load ~10 on 2 cores, the SQL "after" trained
in 88.8 s with 2 threads and 5.4 s with 1 (kitlib: 63.0 s and 4.3 s). Which contender that hits decides the ratio, so
a loaded machine is measured with the same ``--threads 1`` for all (kitlib's cpu_threads() keeps a lower count).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import numpy as np
import pandas as pd

CONTENDERS = ("before", "after", "kitlib")
SEED = 0  # the demos' data; a contender trains (and splits off its validation rows) with train_seed()


def train_seed() -> int:
    """The seed a contender trains with: SEED, or its repeat's with --seeds (the parent sets it per child)."""
    return int(os.environ.get("SEED_REPLAYS_SEED") or SEED)


VAL_SHARE = 0.15  # of train.csv, held out by the plain loops for their eval loss and full eval
PHASE_COLUMNS = ("featurise", "train", "eval_gaps", "saves", "infer")


@dataclass(frozen=True)
class Knobs:
    """One contender's settings for the plain loop (the user's script, before or after their fix)."""

    epochs: int
    micro: int
    accum: int
    src_len: int  # fixed padding length of the source (or the whole sequence for a causal LM): the user's max
    tgt_len: int = 0  # fixed padding length of the target (seq2seq)
    fixed_padding: bool = True  # pad every batch to src_len/tgt_len (their collator); False: to the batch's longest
    workers: int = 0
    pin: bool = False
    full_eval_every_epochs: int = 0  # generation/metric eval on the validation rows; 0: none
    full_eval_every_steps: int = 0  # the summariser's cadence: every N optimizer steps
    save_last: bool = False  # weights + optimizer written every epoch (their resume point)
    save_best: bool = True
    cached_features: bool = False  # features read from an earlier session's cache instead of recomputed
    grad_checkpointing: bool = False
    tf32: bool | None = None  # TF32 matmuls/cuDNN on CUDA; None: torch's defaults (fp32 matmuls exact)
    beams: int = 1
    lr: float = 1e-3


@dataclass(frozen=True)
class Workload:
    name: str
    story: str  # the user's workload and their fix, one line
    demo: str  # kitlib demo task
    rows: tuple[int, int]  # train, test rows kept from the demo
    before: Knobs
    after: Knobs
    quick: tuple[int, int]  # rows for --quick
    full: tuple[int, int]  # rows for --full: every contender a minute or more on one core (issue 34)
    full_epochs: tuple[int, int] | None = None  # before's, after's epochs for --full where the demo has too few rows


WORKLOADS: dict[str, Workload] = {
    "sql": Workload(
        "sql",
        "text-to-SQL, T5 + beam generation + executing every dev query; fix: full eval every 2 epochs, save best only",
        "seq2seq",
        (128, 16),
        Knobs(epochs=2, micro=16, accum=1, src_len=64, tgt_len=64, full_eval_every_epochs=1, save_last=True, beams=5),
        Knobs(epochs=2, micro=16, accum=1, src_len=64, tgt_len=64, full_eval_every_epochs=2, beams=5),
        (64, 8),
        (1500, 100),
    ),
    "summary": Workload(
        "summary",
        "BiLSTM pointer-generator summariser; fix: micro-batch 1x16 -> 4x4, src 768/tgt 192 -> 512/150, 2 workers, "
        "eval every 500 -> 1000 steps",
        "custom-seq2seq",
        (96, 12),
        # lengths scaled by 1/6 (768/192 -> 128/32, 512/150 -> 85/25); 500/1000 steps scaled to this run's steps
        Knobs(epochs=1, micro=1, accum=16, src_len=128, tgt_len=32, full_eval_every_steps=2, beams=4),
        Knobs(epochs=1, micro=4, accum=4, src_len=85, tgt_len=25, full_eval_every_steps=4, workers=2, beams=4),
        (48, 6),
        (640, 60),
    ),
    "sft": Workload(
        "sft",
        "SFT of a causal LM; fix: batch 4x8 -> 2x4, max_seq_length 2048 -> 1536 (data max 1,481), 4 workers, TF32, "
        "gradient checkpointing",
        "causal-lm",
        (128, 16),
        # 2048/1536 scaled to 256/192 tokens (the demo's longest row is shorter than both, as the user's was)
        Knobs(epochs=1, micro=4, accum=8, src_len=256, full_eval_every_epochs=1, tf32=False),
        Knobs(
            epochs=1,
            micro=2,
            accum=4,
            src_len=192,
            full_eval_every_epochs=1,
            workers=2,
            grad_checkpointing=True,
            tf32=True,
        ),
        (48, 8),
        (1000, 100),
    ),
    "price": Workload(
        "price",
        "price from text + numeric columns (SMAPE); fix: accumulation 4, 2 workers + pin, cached features, "
        "35 -> 20 epochs",
        "tabular-text",
        (64, 16),
        Knobs(epochs=7, micro=8, accum=1, src_len=128, lr=1e-3),  # 35/20 epochs scaled to 7/4
        Knobs(epochs=4, micro=8, accum=4, src_len=128, workers=2, pin=True, cached_features=True, lr=1e-3),
        (48, 8),
        (800, 160),  # the whole demo: 800 films with a box office
        (16, 9),  # the user's 35 -> 20 epochs, scaled so kitlib (after's epochs) trains a minute here
    ),
}


# ----------------------------------------------------------------------------------------------------- data
def make_demo(w: Workload, root: Path) -> Any:
    from kitlib.notebook.tasks import TASKS
    from kitlib.tasks.metrics import import_object

    return import_object(TASKS[w.demo].demo, "demo")(root, seed=SEED, test_fraction=0.2, force=True)


def make_data(w: Workload, root: Path, rows: tuple[int, int], made: Path | None = None) -> Path:
    """The workload's demo in ``root``, cut to ``rows`` (train, test) rows; the same files for all contenders.
    ``made``: a folder written by ``--make-data`` (the same demo and seed), copied when it holds this workload."""
    from demos import DemoPaths
    from kitlib.tasks.scoring import ABOUT_FILE

    if made is not None and (made / w.name / ABOUT_FILE).is_file():
        shutil.copytree(made / w.name, root, dirs_exist_ok=True)
        names = ("train.csv", "test.csv", "sample_submission.csv", "solution.csv")
        paths = DemoPaths(root, *(root / n for n in names))
    else:
        paths = make_demo(w, root)
    train, test = pd.read_csv(paths.train), pd.read_csv(paths.test)
    solution, sample = pd.read_csv(paths.solution), pd.read_csv(paths.sample_submission)
    keep = test["id"].iloc[: rows[1]]
    train.iloc[: rows[0]].to_csv(paths.train, index=False)
    for frame, path in ((test, paths.test), (solution, paths.solution), (sample, paths.sample_submission)):
        frame[frame["id"].isin(keep)].to_csv(path, index=False)
    return paths.root


def about(data: Path) -> dict[str, Any]:
    """The demo's 00 parameters, a file they name (a metric, a model factory: by full path) re-pointed at ``data``:
    a folder made elsewhere (--make-data) names the files where it was made."""
    parameters: dict[str, Any] = json.loads((data / "demo.json").read_text())["parameters"]
    for name in ("metric", "model_factory"):
        where, _, function = str(parameters.get(name, "")).rpartition(":")
        if where.endswith(".py"):
            parameters[name] = f"{data.resolve() / Path(where).name}:{function}"
    return parameters


def metric_gap(data: Path, kitlib: Path, after: Path) -> Any:
    """kitlib's test score minus the after's (> 0: kitlib better, whatever the metric's mode), with its 90% paired
    bootstrap interval over the test rows (kitlib.tasks.baseline.compare): "equal" is an interval that holds 0."""
    from kitlib.tasks.baseline import compare
    from kitlib.tasks.metrics import get_metric
    from kitlib.tasks.scoring import read_matched

    p = about(data)
    texts = p["metric"] != "smape"  # smape scores numbers; the others, texts as written
    metric = get_metric(p["metric"], "sequence" if texts else "regression", data_dir=data)
    ours, theirs = (read_matched(data / "solution.csv", s, p["target"], text=texts) for s in (kitlib, after))
    true, pred = f"{p['target']}_true", f"{p['target']}_pred"
    return compare(metric, ours[true].to_numpy(), ours[pred].to_numpy(), theirs[pred].to_numpy())


def score(data: Path, submission: Path) -> float:
    from kitlib.tasks.scoring import score as demo_score

    p = about(data)
    return float(demo_score(data / "solution.csv", submission, target=p["target"], metric=p["metric"]))


# ----------------------------------------------------------------------------------------------- the plain loop
class Phases:
    """Seconds and counts per phase, in the shape of kitlib's timing.json (what the doctor reads)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.count[name] += 1


class Adapter:
    """What differs between the workloads: tokenizer, model, one batch's tensors, loss, predictions."""

    target: str
    device: Any = "cpu"  # where the model runs: plain() sets it (a cached adapter comes back with the old one)

    def __init__(self, data: Path) -> None:
        self.data, self.p = data, about(data)
        self.target = self.p["target"]

    def to_device(self, batch: Mapping[str, Any], non_blocking: bool = False) -> dict[str, Any]:
        """The batch's tensors on the run's device; ``non_blocking`` from pinned memory overlaps the copy."""
        return {n: v.to(self.device, non_blocking=non_blocking) if hasattr(v, "to") else v for n, v in batch.items()}

    def tokenizer(self, train: pd.DataFrame) -> Any:
        from kitlib.models.bpe import train_bpe_tokenizer

        return train_bpe_tokenizer([*train[self.p["text"]].astype(str), *train[self.target].astype(str)])

    def encode(self, tok: Any, df: pd.DataFrame, k: Knobs) -> list[dict[str, Any]]:
        src = tok(df[self.p["text"]].astype(str).tolist(), truncation=True, max_length=k.src_len)["input_ids"]
        golds = df[self.target].astype(str).tolist() if self.target in df else [""] * len(df)  # test.csv: none
        tgt = tok(golds, truncation=True, max_length=k.tgt_len)["input_ids"]
        return [{"src": s, "tgt": t} for s, t in zip(src, tgt, strict=True)]

    def collate(self, rows: list[dict[str, Any]], k: Knobs, pad: int) -> dict[str, Any]:
        import torch

        s = k.src_len if k.fixed_padding else max(len(r["src"]) for r in rows)
        t = k.tgt_len if k.fixed_padding else max(len(r["tgt"]) for r in rows)
        ids = torch.full((len(rows), s), pad)
        labels = torch.full((len(rows), t), -100)
        for i, r in enumerate(rows):
            ids[i, : len(r["src"])] = torch.tensor(r["src"])
            labels[i, : len(r["tgt"])] = torch.tensor(r["tgt"])
        mask = (ids != pad).long()
        real = int(mask.sum()) + int((labels >= 0).sum())
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "_real": real, "_computed": s * len(rows)
                + t * len(rows)}  # fmt: skip

    def loss(self, model: Any, batch: Mapping[str, Any]) -> Any:
        return model(**{k: v for k, v in batch.items() if not k.startswith("_")}).loss

    def predict(self, model: Any, tok: Any, rows: list[dict[str, Any]], k: Knobs) -> list[Any]:
        out: list[Any] = []
        for i in range(0, len(rows), 8):
            b = self.to_device(self.collate(rows[i : i + 8], dataclasses.replace(k, fixed_padding=False),
                                            tok.pad_token_id))  # fmt: skip
            gen = model.generate(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                max_new_tokens=k.tgt_len,
                num_beams=k.beams,
            )
            out += [t.strip() for t in tok.batch_decode(gen, skip_special_tokens=True)]
        return out

    def build(self, tok: Any, train: pd.DataFrame) -> Any:
        raise NotImplementedError

    def metric(self, preds: list[Any], golds: pd.DataFrame) -> float:
        from kitlib.tasks.metrics import get_metric

        kind = "regression" if self.p["metric"] == "smape" else "sequence"
        found = get_metric(self.p["metric"], kind, data_dir=self.data)
        return float(found(golds[self.target].to_numpy(), np.asarray(preds, dtype=object if kind != "regression"
                                                                         else float)))  # fmt: skip


class Sql(Adapter):
    def tokenizer(self, train: pd.DataFrame) -> Any:
        from kitlib.models.seq2seq import data_tokenizer

        return data_tokenizer([*train[self.p["text"]].astype(str), *train[self.target].astype(str)])[0]

    def build(self, tok: Any, train: pd.DataFrame) -> Any:
        from kitlib.models.seq2seq import tiny_seq2seq

        return tiny_seq2seq(tok, seed=train_seed())


class Summary(Adapter):
    def build(self, tok: Any, train: pd.DataFrame) -> Any:
        from demos.summary import parameters
        from kitlib.notebook.tasks.custom import factory

        build = factory(parameters(self.data)["model_factory"])  # the demo folder's pointer_generator.py:build
        return build(len(tok), tok.pad_token_id, tok.eos_token_id)


class Sft(Adapter):
    """One sequence per row: prompt then response then </s>, the loss on the response only."""

    def tokenizer(self, train: pd.DataFrame) -> Any:
        from kitlib.models.bpe import train_bpe_tokenizer

        return train_bpe_tokenizer([*train[self.p["text"]].astype(str), *train[self.target].astype(str)], add_eos=False)

    def build(self, tok: Any, train: pd.DataFrame) -> Any:
        from kitlib.models.causal_lm import tiny_causal_lm

        return tiny_causal_lm(tok, seed=train_seed(), n_positions=512)

    def encode(self, tok: Any, df: pd.DataFrame, k: Knobs) -> list[dict[str, Any]]:
        prompts = tok(df[self.p["text"]].astype(str).tolist())["input_ids"]
        answers = tok(df[self.target].astype(str).tolist())["input_ids"] if self.target in df else [[]] * len(df)
        rows = []
        for p, a in zip(prompts, answers, strict=True):
            seq = (p + a + [tok.eos_token_id])[-k.src_len :]
            n_label = min(len(a) + 1, len(seq))
            rows.append({"src": seq, "n_label": n_label, "prompt": p[-k.src_len :]})
        return rows

    def collate(self, rows: list[dict[str, Any]], k: Knobs, pad: int) -> dict[str, Any]:
        import torch

        s = k.src_len if k.fixed_padding else max(len(r["src"]) for r in rows)
        ids, labels = torch.full((len(rows), s), pad), torch.full((len(rows), s), -100)
        mask = torch.zeros((len(rows), s), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["src"])
            ids[i, :n], mask[i, :n] = torch.tensor(r["src"]), 1
            labels[i, n - r["n_label"] : n] = torch.tensor(r["src"][n - r["n_label"] :])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "_real": int(mask.sum()),
                "_computed": s * len(rows)}  # fmt: skip

    def predict(self, model: Any, tok: Any, rows: list[dict[str, Any]], k: Knobs) -> list[Any]:
        import torch

        out = []
        for r in rows:  # one prompt at a time: no left padding needed
            ids = torch.tensor([r["prompt"]], device=self.device)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
            out.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True).strip())
        return out


class Price(Adapter):
    """Tiny BERT on the text plus a TabularNet on the numeric and categorical columns; log target, standardised."""

    def __init__(self, data: Path) -> None:
        super().__init__(data)
        self.stats: dict[str, Any] = {}

    def tokenizer(self, train: pd.DataFrame) -> Any:
        from kitlib.models.loading import train_wordpiece_tokenizer

        return train_wordpiece_tokenizer(train["text"].astype(str).tolist())

    def build(self, tok: Any, train: pd.DataFrame) -> Any:
        from kitlib.models.loading import load_text_classifier
        from kitlib.models.tabular import TabularNet, WithTabular

        _, text_model, _ = load_text_classifier(1, train_texts=train["text"].astype(str), tiny=True, seed=train_seed())
        cards = [len(self.stats["cats"][c]) for c in self.p["categorical"]]
        return WithTabular(text_model, TabularNet(2 * len(self.p["numeric"]), cards, 1), regression=True)

    def encode(self, tok: Any, df: pd.DataFrame, k: Knobs) -> list[dict[str, Any]]:
        if not self.stats:  # fitted on the first frame encoded: the training rows
            num = df[self.p["numeric"]].astype(float)
            y = np.log1p(df[self.target].astype(float))
            self.stats = {"mean": num.mean(), "std": num.std().replace(0, 1), "y": (y.mean(), y.std()),
                          "cats": {c: {v: i + 1 for i, v in enumerate(sorted(df[c].astype(str).unique()))}
                                   for c in self.p["categorical"]}}  # fmt: skip
        num = (df[self.p["numeric"]].astype(float) - self.stats["mean"]) / self.stats["std"]
        numeric = np.concatenate([num.fillna(0).to_numpy(), num.isna().to_numpy(float)], axis=1)
        cats = np.stack([df[c].astype(str).map(self.stats["cats"][c]).fillna(0).to_numpy(int)
                         for c in self.p["categorical"]], axis=1)  # fmt: skip
        ids = tok(df["text"].astype(str).tolist(), truncation=True, max_length=k.src_len)["input_ids"]
        mu, sd = self.stats["y"]
        y = (np.log1p(df[self.target].astype(float)) - mu) / sd if self.target in df else np.zeros(len(df))
        return [{"src": s, "num": n, "cat": c, "y": float(v)} for s, n, c, v in zip(ids, numeric, cats, y, strict=True)]

    def collate(self, rows: list[dict[str, Any]], k: Knobs, pad: int) -> dict[str, Any]:
        import torch

        s = k.src_len if k.fixed_padding else max(len(r["src"]) for r in rows)
        ids = torch.full((len(rows), s), pad)
        for i, r in enumerate(rows):
            ids[i, : len(r["src"])] = torch.tensor(r["src"])
        mask = (ids != pad).long()
        numeric = torch.tensor(np.stack([r["num"] for r in rows]), dtype=torch.float32)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "numeric": numeric,
            "categorical": torch.tensor(np.stack([r["cat"] for r in rows])),
            "labels": torch.tensor([[r["y"]] for r in rows]),
            "_real": int(mask.sum()),
            "_computed": s * len(rows),
        }

    def predict(self, model: Any, tok: Any, rows: list[dict[str, Any]], k: Knobs) -> list[Any]:
        import torch

        mu, sd = self.stats["y"]
        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(rows), 32):
                b = self.collate(rows[i : i + 32], k, tok.pad_token_id)
                b = self.to_device({n: v for n, v in b.items() if not n.startswith("_") and n != "labels"})
                out += np.expm1(model(**b).logits[:, 0].cpu().numpy() * sd + mu).tolist()
        return out


ADAPTERS: dict[str, Callable[[Path], Adapter]] = {"sql": Sql, "summary": Summary, "sft": Sft, "price": Price}


def tf32_flags(k: Knobs, device: Any) -> contextlib.AbstractContextManager[Mapping[str, object]]:
    """The user's TF32 choice for the run, restored after it. On a CPU no flag is touched: TF32 is a CUDA
    tensor-core mode (and the matmul-precision flag it sets would also change CPU oneDNN matmuls)."""
    from kitlib.machine.backends import speed_flags

    if device.type != "cuda":
        return contextlib.nullcontext({"tf32_matmul": False})
    return speed_flags(tf32=k.tf32)  # None: flags left alone, the effective ones still reported


def plain(w: Workload, k: Knobs, data: Path, out: Path, device: str = "cpu") -> dict[str, Any]:
    """The user's script on ``device``, with the TF32 setting their knobs name (restored after the run)."""
    import torch

    dev = torch.device(device)
    with tf32_flags(k, dev) as flags:
        return plain_run(w, k, data, out, dev, tf32=bool(flags["tf32_matmul"]))


def plain_run(w: Workload, k: Knobs, data: Path, out: Path, dev: Any, *, tf32: bool) -> dict[str, Any]:
    """The user's script: featurise, train with their knobs, eval and save on their cadence, predict the test rows."""
    import torch
    from torch.utils.data import DataLoader

    # Kernels run asynchronously on a GPU: the epoch's clock waits for them (once an epoch, as a loss print would).
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    torch.manual_seed(train_seed())
    adapter, ph = ADAPTERS[w.name](data), Phases()
    train_df = pd.read_csv(data / "train.csv")
    test_df = pd.read_csv(data / "test.csv")
    order = np.random.default_rng(train_seed()).permutation(len(train_df))
    n_val = max(4, int(VAL_SHARE * len(train_df)))
    val_df, fit_df = train_df.iloc[order[:n_val]], train_df.iloc[order[n_val:]]
    cache = data / f"features-{w.name}-{k.src_len}-{k.tgt_len}.pkl"  # an earlier session's, for cached_features
    with ph("featurise"):
        if k.cached_features and cache.is_file():
            tok, adapter, rows, val_rows, test_rows = pickle.loads(cache.read_bytes())
        else:
            tok = adapter.tokenizer(fit_df)
            rows, val_rows = adapter.encode(tok, fit_df, k), adapter.encode(tok, val_df, k)
            test_rows = adapter.encode(tok, test_df, k)
            if k.cached_features:
                cache.write_bytes(pickle.dumps((tok, adapter, rows, val_rows, test_rows)))
    if os.environ.get("SEED_REPLAYS_WARM"):  # the earlier session that filled the cache: not timed
        return {}
    adapter.device = dev
    model = adapter.build(tok, fit_df).to(dev)
    if k.grad_checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=k.lr)
    pad = tok.pad_token_id

    def collate(b: list[dict[str, Any]]) -> dict[str, Any]:
        return adapter.collate(b, k, pad)

    loader = DataLoader(rows, batch_size=k.micro, shuffle=True, collate_fn=collate, num_workers=k.workers,
                        pin_memory=k.pin, generator=torch.Generator().manual_seed(train_seed()))  # fmt: skip
    val_loader = DataLoader(val_rows, batch_size=k.micro * 4, collate_fn=collate)
    step, best, real, computed, samples, train_s, gaps = 0, math.inf, 0, 0, 0, [], []
    scores: list[float] = []

    def full_eval() -> None:
        model.eval()
        with ph("full_eval"), torch.no_grad():
            scores.append(adapter.metric(adapter.predict(model, tok, val_rows, k), val_df))
        model.train()

    def save(name: str, state: Mapping[str, Any]) -> None:
        with ph("checkpoint"):
            torch.save(state, out / name)

    for epoch in range(1, k.epochs + 1):
        model.train()
        epoch_start = time.perf_counter()
        it = iter(loader)
        for i in range(len(loader)):
            with ph("data_wait"):
                batch = adapter.to_device(next(it), non_blocking=k.pin)
            real, computed, samples = real + batch["_real"], computed + batch["_computed"], samples + k.micro
            with ph("forward"):
                loss = adapter.loss(model, batch) / k.accum
            with ph("backward"):
                loss.backward()
            if (i + 1) % k.accum == 0 or i + 1 == len(loader):
                with ph("optimizer"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                step += 1
                if k.full_eval_every_steps and step % k.full_eval_every_steps == 0:
                    full_eval()
        sync()
        train_s.append(time.perf_counter() - epoch_start)
        gap_start = time.perf_counter()
        model.eval()
        with ph("eval"), torch.no_grad():
            val = float(np.mean([float(adapter.loss(model, adapter.to_device(b))) for b in val_loader]))
        if k.full_eval_every_epochs and epoch % k.full_eval_every_epochs == 0:
            full_eval()
        if k.save_best and val < best:
            best = val
            save("best.pt", model.state_dict())
        if k.save_last:
            save("last.pt", {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch})
        if epoch < k.epochs:
            gaps.append(time.perf_counter() - gap_start)
    model.eval()
    with ph("infer"), torch.no_grad():
        preds = adapter.predict(model, tok, test_rows, k)
    wall = time.perf_counter() - start
    probe_small_micro_batch(adapter, model, rows, k, pad, out)
    sub = out / "submission.csv"
    pd.DataFrame({"id": test_df["id"], adapter.target: preds}).to_csv(sub, index=False)
    record = {
        "wall_seconds": wall,
        "phases": {n: {"seconds": s, "count": ph.count[n]} for n, s in ph.seconds.items()},
        "run": {
            "steps": step, "epochs_planned": k.epochs, "epochs_done": k.epochs, "micro_batch_size": k.micro,
            "grad_accum_steps": k.accum, "num_workers": k.workers, "persistent_workers": False, "pin_memory": k.pin,
            "precision": "fp32", "tf32": tf32, "device_type": dev.type, "device_name": device_name(dev),
            "full_eval_every": k.full_eval_every_epochs, "save_best": k.save_best, "save_last": k.save_last,
            "batching": "fixed" if k.fixed_padding else "dynamic", "samples": samples, "real_tokens": real,
            "computed_tokens": computed, "epoch_gaps_s": gaps, "epoch_train_s": train_s,
            "max_length": k.src_len, "longest_row_tokens": max(len(r["src"]) for r in rows),
            "featurise_s": ph.seconds["featurise"], "features_cached": k.cached_features,
            "full_eval_count": ph.count["full_eval"],
        },
    }  # fmt: skip
    (out / "timing.json").write_text(json.dumps(record))
    (out / "config.json").write_text(json.dumps({"config": dataclasses.asdict(k)}))
    return {
        "wall": wall,
        "featurise": ph.seconds["featurise"],
        "train": sum(train_s),
        "eval_gaps": ph.seconds["eval"] + ph.seconds["full_eval"],
        "saves": ph.seconds["checkpoint"],
        "infer": ph.seconds["infer"],
        "samples_per_s": samples / sum(train_s),
        "tokens_per_s": real / sum(train_s),
        "padding": real / computed,
        "metric": score(data, sub),
        "device": dev.type,
        "about_device": f"{device_name(dev)}, fp32, TF32 {'on' if tf32 else 'off'}",
    }


def device_name(dev: Any) -> str:
    import torch

    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def probe_small_micro_batch(adapter: Adapter, model: Any, rows: list[dict[str, Any]], k: Knobs, pad: int,
                            out: Path) -> None:  # fmt: skip
    """What the doctor's micro-batch advice asks for, after the timed run (not in its wall): forward+backward of the
    same training rows as the user's micro-batches and as one bigger one, kept beside the record (probes.json)."""
    from kitlib.doctor.probe import probe_micro_batch, save_probe
    from kitlib.doctor.rules import SMALL_MICRO_BATCH, split_accumulation

    factor = split_accumulation(k.accum)
    if k.micro > SMALL_MICRO_BATCH or k.accum < 2 or len(rows) < k.micro * factor:
        return
    batch = adapter.to_device(adapter.collate(rows[: k.micro * factor], k, pad))
    probe = probe_micro_batch(model, batch, micro_batch_size=k.micro, factor=factor, loss_fn=adapter.loss, repeats=2)
    save_probe(out, probe)


# ------------------------------------------------------------------------------------------------------ kitlib
def with_kitlib(w: Workload, data: Path, out: Path) -> dict[str, Any]:
    """kitlib's defaults through the notebooks' stage calls (00 setup, 01 features, 02 train, 03 infer)."""
    from kitlib.engine.record import RunFacts
    from kitlib.machine.hardware import detect
    from kitlib.notebook import stages, training

    params = about(data)
    if w.demo == "custom-seq2seq":
        from demos.summary import parameters

        params = parameters(data)
    epochs = int(os.environ.get("SEED_REPLAYS_KITLIB_EPOCHS") or w.after.epochs)  # --kitlib-epochs: a lever
    p = stages.params(data_dir=data, work_dir=out, preset="balanced", model="tiny", epochs=epochs, seed=train_seed(),
                      **params)  # fmt: skip
    hw = detect()
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the stages' reports: keep stdout for the result line
        stages.setup(p, hw)
        t = time.perf_counter()
        stages.features(p, hw=hw, quiet=True)
        featurise = time.perf_counter() - t
        if os.environ.get("SEED_REPLAYS_WARM"):
            return {}
        t = time.perf_counter()
        result = training.train(p, hw=hw)
        train_stage = time.perf_counter() - t
        t = time.perf_counter()
        training.infer(p, hw=hw)
        infer = time.perf_counter() - t
    wall = time.perf_counter() - start
    facts, phases = RunFacts.from_dict(result.timing.get("run")), result.timing.get("phases") or {}
    train_s = sum(facts.epoch_train_s or []) or train_stage

    def sec(name: str) -> float:
        return float(phases.get(name, {}).get("seconds") or 0.0)

    return {
        "wall": wall,
        "featurise": featurise,
        "train": train_s,
        "eval_gaps": sec("eval") + sec("full_eval"),
        "saves": sec("checkpoint"),
        "infer": infer,
        "samples_per_s": (facts.samples or 0) / train_s,
        "tokens_per_s": (facts.real_tokens or 0) / train_s,
        "padding": (facts.real_tokens or 0) / (facts.computed_tokens or 1),
        "metric": score(data, out / "submission.csv"),
        "device": facts.device_type,
        "about_device": f"{facts.device_name}, {facts.precision}, TF32 {'on' if facts.tf32 else 'off'}",
    }


def contender(name: str, workload: str, data: Path, out: Path, device: str = "cpu") -> dict[str, Any]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    w = WORKLOADS[workload]
    result = with_kitlib(w, data, out) if name == "kitlib" else plain(w, getattr(w, name), data, out, device)
    result |= {"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB
    # kitlib's fit resets the CUDA peak at its start; the plain loops' peak is the whole process's (featurising is
    # host-side in both, so the two cover the same GPU work).
    result["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else 0.0
    (out / "result.json").write_text(json.dumps(result))  # kept beside the run: a later failure loses nothing
    return result


# ------------------------------------------------------------------------------------------------------ driver
def run_one(
    name: str, workload: str, data: Path, out: Path, device: str, *, warm: bool = False, seed: int = SEED
) -> dict[str, Any]:
    """One contender in a fresh process (its own imports, caches and peak memory): the last stdout line is JSON.
    ``warm``: only the featurising of an earlier session, which fills the caches of those that keep one. ``seed``:
    the one it trains with."""
    cmd = [sys.executable, __file__, "--contender", name, "--workload", workload, "--data", str(data), "--out",
           str(out), "--device", device]  # fmt: skip
    env = (
        os.environ
        | {"KIT_HEADLESS": "1", "SEED_REPLAYS_SEED": str(seed)}
        | ({"SEED_REPLAYS_WARM": "1"} if warm else {})
    )
    if device == "cpu":  # kitlib's stages pick the device themselves: a CPU replay hides the GPUs from all three
        env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{workload}/{name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def doctor_lines(record_dir: Path, before: Mapping[str, float], after: Mapping[str, float]) -> list[str]:
    """The doctor's findings on "before"'s record, beside what the user's fix saved here (before - after wall)."""
    from kitlib.doctor.report import diagnose

    report = diagnose(record_dir)
    lines = [f"  doctor on before's record (the user's fix measured {before['wall'] - after['wall']:+.1f} s wall):"]
    for f in report.findings:
        lines.append(f"    {f.rule:<16} saves ~{f.estimated_saving_s:6.2f} s  {f.title}: {json.dumps(f.changes)}")
    if not report.findings:
        lines.append("    (no finding)")
    return lines


def table(w: Workload, results: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    def mean(c: str, key: str) -> float:
        return float(np.median([r[key] for r in results[c]]))

    better = "lower" if about_metric(w) == "smape" else "higher"
    metric = f"{about_metric(w)} ({better})"
    phases = " ".join(f"{c:>9}" for c in PHASE_COLUMNS)
    rates = f"{'samples/s':>9} {'tokens/s':>9} {'pad eff':>7} {'peak MB':>8} {'gpu MB':>7}"
    head = f"{'contender':<9} {'device':>6} {'wall s':>7} {phases} {rates} {metric:>18}"
    lines = [f"== {w.name}: {w.story}", head]
    for c in CONTENDERS:
        lines.append(
            f"{c:<9} {results[c][0]['device']:>6} {mean(c, 'wall'):7.1f} "
            + " ".join(f"{mean(c, p):9.2f}" for p in PHASE_COLUMNS)
            + f" {mean(c, 'samples_per_s'):9.1f} {mean(c, 'tokens_per_s'):9.0f} {mean(c, 'padding'):7.2f}"
            f" {mean(c, 'peak_mb'):8.0f} {mean(c, 'gpu_peak_mb'):7.0f} {mean(c, 'metric'):18.4f}"
        )  # fmt: skip
    before, after = ratios(results)
    lines.append(f"  ratios (wall): before/kitlib {before:.2f}x, after/kitlib {after:.2f}x")
    lines.append("  ran on: " + "; ".join(f"{c} {results[c][0]['about_device']}" for c in CONTENDERS))
    return lines


def ratios(results: Mapping[str, list[dict[str, Any]]]) -> tuple[float, float]:
    """before/kitlib and after/kitlib of the median wall seconds."""
    wall = {c: float(np.median([r["wall"] for r in results[c]])) for c in CONTENDERS}
    return wall["before"] / wall["kitlib"], wall["after"] / wall["kitlib"]


def about_metric(w: Workload) -> str:
    return {"sql": "record_f1", "summary": "rouge_l", "sft": "exact_match", "price": "smape"}[w.name]


def replay(names: list[str], repeats: int, size: str, root: Path, device: str, made: Path | None = None,
           seeds: bool = False) -> list[str]:  # fmt: skip
    """Each workload's table; also ``root/seed_replays.json``: per workload, every run's result and the ratios.
    ``seeds``: repeat r trains every contender with seed r, and the metric's spread over them is printed."""
    lines: list[str] = []
    summary: dict[str, Any] = {}
    for name in names:
        w = WORKLOADS[name]
        data = make_data(w, root / name / "data", getattr(w, size), made)
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
        for r in range(repeats):
            for c in ("after", "kitlib"):  # the users' "after" and kitlib keep features from an earlier session
                if c == "kitlib" or w.after.cached_features:
                    run_one(c, name, data, root / name / f"{c}-{r}", device, warm=True, seed=r if seeds else SEED)
            for c in CONTENDERS:  # interleaved: a machine slowing down hits every contender alike
                print(f"[{name}] repeat {r + 1}/{repeats}: {c} ...", file=sys.stderr, flush=True)
                results[c].append(run_one(c, name, data, root / name / f"{c}-{r}", device, seed=r if seeds else SEED))
        lines += table(w, results)
        if seeds:  # a tiny model from scratch: one seed's metric can sit anywhere in a wide spread
            spread = {c: [r["metric"] for r in results[c]] for c in CONTENDERS}
            about = [f"{c} mean {np.mean(v):.4f} [{', '.join(f'{x:.4f}' for x in v)}]" for c, v in spread.items()]
            lines.append(f"  metric by training seed 0..{repeats - 1}: " + "; ".join(about))
        gap = metric_gap(data, root / name / "kitlib-0" / "submission.csv", root / name / "after-0" / "submission.csv")
        word = "better" if gap.low > 0 else "worse" if gap.high < 0 else "equal within the interval"
        lines.append(f"  metric, kitlib - after (> 0: kitlib better): {gap.gain:+.4f} (90% interval {gap.low:+.4f} to "
                     f"{gap.high:+.4f} over {gap.rows} test rows, repeat 1): {word}")  # fmt: skip
        rows = [len(pd.read_csv(data / f, usecols=["id"])) for f in ("train.csv", "test.csv")]
        lines.append(f"  rows: {rows[0]} train (validation split from them), {rows[1]} test")
        before, after = ratios(results)
        summary[name] = {"before/kitlib": before, "after/kitlib": after, "results": results}
        (root / "seed_replays.json").write_text(json.dumps(summary, indent=1))
        lines.append(f"  load average (1, 5, 15 min) as it ended: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        lines += doctor_lines(root / name / "before-0", results["before"][0], results["after"][0])
        print("\n".join(lines), file=sys.stderr, flush=True)  # so far, as each workload ends
    return lines


def sized(w: Workload, size: str) -> Workload:
    """The workload's knobs at ``size`` (``rows``: as written). --quick: one epoch, evals and saves still on their
    cadence (every step for a step cadence). --full: a step cadence grows with the rows, so the user's few evals an
    epoch stay a few (the summariser's 500 -> 1000 steps are a share of their epoch, not a count of steps)."""

    def knobs(k: Knobs) -> Knobs:
        if size == "quick":
            return dataclasses.replace(k, epochs=1, full_eval_every_steps=min(k.full_eval_every_steps, 1))
        if size == "full":
            return dataclasses.replace(k, full_eval_every_steps=k.full_eval_every_steps * w.full[0] // w.rows[0])
        return k

    before, after = knobs(w.before), knobs(w.after)
    if size == "full" and w.full_epochs:
        before, after = (dataclasses.replace(k, epochs=e) for k, e in zip((before, after), w.full_epochs, strict=True))
    return dataclasses.replace(w, before=before, after=after)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="the four workloads")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), action="append", help="one workload (repeatable)")
    ap.add_argument("--quick", action="store_true", help="smoke size: a few rows, one epoch")
    ap.add_argument("--full", action="store_true", help="every contender a minute or more on one core")
    ap.add_argument("--kitlib-epochs", type=int, help="kitlib trains this many epochs, not the after's (a lever)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seeds", action="store_true", help="repeat r trains with seed r: the metric's spread over seeds")
    ap.add_argument("--root", type=Path, help="where data and runs go (default: a temporary folder)")
    ap.add_argument("--threads", type=int, help="intra-op threads of every contender (default: as torch picks)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available")
    ap.add_argument("--make-data", type=Path, metavar="DIR", help="write the four demos into DIR and stop")
    ap.add_argument("--demo-data", type=Path, metavar="DIR", help="copy the demos from DIR (--make-data) if there")
    ap.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # the child process
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make_data:
        for w in WORKLOADS.values():
            print(make_demo(w, args.make_data / w.name).root)
        return 0
    device = pick_device(args.device)
    if device is None:
        ap.error("--device cuda: torch sees no CUDA device here. Fix: --device auto (or cpu), or run on a GPU machine")
    if args.contender:
        name = args.workload[0]
        WORKLOADS[name] = sized(WORKLOADS[name], os.environ.get("SEED_REPLAYS_SIZE", "rows"))
        print(json.dumps(contender(args.contender, args.workload[0], args.data, args.out, device)))
        return 0
    names = sorted(WORKLOADS) if args.all else (args.workload or [])
    if not names:
        ap.error("name a --workload or pass --all")
    if args.quick and args.full:
        ap.error("--quick or --full, not both")
    size = "quick" if args.quick else "full" if args.full else "rows"
    os.environ["SEED_REPLAYS_SIZE"] = size  # the children read it
    if args.kitlib_epochs:
        os.environ["SEED_REPLAYS_KITLIB_EPOCHS"] = str(args.kitlib_epochs)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # torch sizes its pool from it at import, in each child
    threads = f"{args.threads} intra-op threads per process" if args.threads else "torch threads as torch picks"
    with tempfile.TemporaryDirectory(prefix="seed-replays-") as tmp:
        root = args.root or Path(tmp)
        print(f"seed replays: {', '.join(names)}; size {size}; device {device}; {os.cpu_count()} CPUs (this process "
              f"may use {len(os.sched_getaffinity(0))}), load average {os.getloadavg()[0]:.1f}; {threads}")  # fmt: skip
        print("\n".join(replay(names, args.repeats, size, root, device, args.demo_data, args.seeds)))
    return 0


def pick_device(asked: str) -> str | None:
    """cpu, cuda, or None where cuda was asked for and there is none (an availability query: no CUDA context)."""
    import torch

    if asked == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return None if asked == "cuda" else "cpu"


if __name__ == "__main__":
    sys.exit(main())
