"""kitlib against what users would otherwise write: a naive loop, HF Trainer with defaults, HF Trainer tuned.

    python benchmarks/bench_vs_trainer.py --demo /tmp/demo --out /tmp/bench [--rows N] [--epochs 1] [--tiny]
    python benchmarks/bench_vs_trainer.py --rows 300 --test-rows 100 --tiny --epochs 1   # plumbing check

Same data (the demo competition, optionally subsampled), model (all-MiniLM-L6-v2, or the tiny fallback with --tiny;
the contenders put Hugging Face's [CLS] classifier on it, kitlib the checkpoint's own mean pooling), train/validation
split (kitlib.notebook.stages._split), epochs, 128-token cap and scoring (kitlib.tasks.scoring.score on the held-out
test) for every contender. Each contender runs in its own subprocess, one after another, so threads, allocator caches
and imports do not leak between them. Wall time is end to end inside the worker (tokenize, train, eval, save, predict,
write submission.csv), after the heavy imports. Goals (issue 5): kitlib >= 2x faster than Trainer defaults, >= 1.3x
faster than tuned Trainer, accuracy within 0.5 points of both. The last line printed is one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import numpy as np
import pandas as pd

CONTENDERS = ("kitlib", "naive", "trainer_defaults", "trainer_tuned")
SEED = 42  # kitlib's Params default and Trainer's default seed: every contender gets the same split and head init
MAX_LENGTH = 128
LR = 5e-5
NAIVE_BATCH = 16
TUNED_BATCH = 16


# ------------------------------------------------------------------------------------------------- orchestrator
def prepare_data(demo: Path, dest: Path, rows: int | None, test_rows: int | None) -> Path:
    """One copy of the (subsampled) competition that every contender reads: identical inputs by construction."""
    from demos.reviews import make_demo

    if not (demo / "train.csv").is_file():
        make_demo(demo)
    dest.mkdir(parents=True, exist_ok=True)
    train, test = pd.read_csv(demo / "train.csv"), pd.read_csv(demo / "test.csv")
    if rows is not None and rows < len(train):
        train = train.sample(rows, random_state=SEED).sort_index()
    if test_rows is not None and test_rows < len(test):
        test = test.sample(test_rows, random_state=SEED).sort_index()
    keep = set(test["id"])
    train.to_csv(dest / "train.csv", index=False)
    test.to_csv(dest / "test.csv", index=False)
    for name in ("sample_submission.csv", "solution.csv"):
        df = pd.read_csv(demo / name)
        df[df["id"].isin(keep)].to_csv(dest / name, index=False)
    return dest


def run_contender(name: str, args: argparse.Namespace, data: Path, out: Path) -> dict[str, Any]:
    work = out / name
    shutil.rmtree(work, ignore_errors=True)  # cold start: no kitlib cache, no Trainer checkpoints from earlier runs
    work.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--contender", name, "--data", str(data), "--out", str(out)]
    cmd += ["--epochs", str(args.epochs)] + (["--tiny"] if args.tiny else [])
    cmd += [f"--kitlib-set={s}" for s in args.kitlib_set] if name == "kitlib" else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}  # KIT_DATA_DIR etc. would redirect kitlib
    start = time.perf_counter()
    with open(work / "log.txt", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (work / "log.txt").read_text().splitlines()[-25:]
        raise SystemExit(f"{name} failed (exit {proc.returncode}); end of {work / 'log.txt'}:\n" + "\n".join(tail))
    result = json.loads((work / "result.json").read_text())
    return result | {"process_s": round(process_s, 2)}


def with_ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    base = results.get("kitlib")
    for r in results.values():
        r["ratios_to_kitlib"] = {
            k: (round(r[k] / base[k], 3) if base and base[k] else None)
            for k in ("wall_s", "accuracy", "samples_per_s", "padding_efficiency")
        }
        r["accuracy_delta_pts"] = round(100 * (r["accuracy"] - base["accuracy"]), 2) if base else None
    return results


def goals(results: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    def check(name: str, speedup: float) -> bool | None:
        r = results.get(name)
        if r is None or "kitlib" not in results:
            return None
        k = results["kitlib"]
        return r["wall_s"] >= speedup * k["wall_s"] and k["accuracy"] >= r["accuracy"] - 0.005

    return {
        "vs_trainer_defaults_2x": check("trainer_defaults", 2.0),
        "vs_trainer_tuned_1.3x": check("trainer_tuned", 1.3),
        "vs_trainer_tuned_1.5x (issue 34)": check("trainer_tuned", 1.5),
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, [results[n]["wall_s"] for n in names], color="tab:blue")
    ax1.set_ylabel("wall time, s (lower is better)")
    ax2.bar(names, [100 * results[n]["accuracy"] for n in names], color="tab:green")
    ax2.set_ylabel("test accuracy, % (higher is better)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=20)
        for bar in ax.patches:
            ax.annotate(
                f"{bar.get_height():.1f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
            )
    fig.suptitle("kitlib vs naive loop vs HF Trainer (same data, model, epochs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def machine(hw: Any) -> str:
    """One line for the README: CPU model, cores, GPU, torch."""
    import platform

    import torch

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
    gpu = hw.primary.name if hw.primary is not None else "no GPU"
    return f"{cpu or 'CPU'}, {hw.cpu_count} CPUs, {gpu}, torch {torch.__version__}"


def orchestrate(args: argparse.Namespace) -> int:
    from kitlib.machine.hardware import detect
    from kitlib.models.folders import tiny_requested

    args.tiny = args.tiny or tiny_requested() or os.environ.get("KIT_MODEL") == "tiny"
    out = args.out.resolve()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CONTENDERS)
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}")
    data = prepare_data(args.demo, out / "data", args.rows, args.test_rows)
    hw = detect()
    print(hw.summary())
    print(f"data: {data} ({len(pd.read_csv(data / 'train.csv'))} train rows, {args.epochs} epoch(s), tiny={args.tiny})")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"--- {name} ...", flush=True)
        results[name] = run_contender(name, args, data, out)
        print("    " + results[name].pop("note", ""), flush=True)
    results = with_ratios(results)
    head = f"{'contender':18} {'precision':>9} {'wall s':>8} {'x kitlib':>8} {'acc %':>7} {'d pts':>6}"
    print(f"\n{head} {'samples/s':>9} {'pad eff':>7}")
    for name, r in results.items():
        ratio, delta = r["ratios_to_kitlib"]["wall_s"], r["accuracy_delta_pts"]
        print(
            f"{name:18} {r['precision']:>9} {r['wall_s']:8.1f} {ratio if ratio is not None else '-':>8} "
            f"{100 * r['accuracy']:7.2f} {delta if delta is not None else '-':>6} {r['samples_per_s']:9.1f} "
            f"{r['padding_efficiency']:7.3f}"
        )
    summary = {
        "benchmark": "bench_vs_trainer",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(hw),
        "settings": {k: v for k, v in vars(args).items() if k in ("rows", "test_rows", "epochs", "tiny", "kitlib_set")},
        "results": results,
        "goals": goals(results),
    }
    plot(results, out / "bench_vs_trainer.png")
    (out / "bench_vs_trainer.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"goals: {summary['goals']}; wrote {out / 'bench_vs_trainer.png'} and .json")
    print(json.dumps(summary))
    return 0


# ------------------------------------------------------------------------------------------------------ workers
def split_frame(data: Path) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, np.ndarray]:
    from kitlib.notebook.stages import _split

    train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
    train_idx, valid_idx = _split(len(train), SEED)  # kitlib's own split: the same validation rows for everyone
    return train, test, train_idx, valid_idx


def load_model(train: pd.DataFrame, tiny: bool) -> tuple[Any, Any]:
    """What users write: AutoModelForSequenceClassification ([CLS] through the pooler). kitlib's own run follows the
    checkpoint's pooling instead (mean, for all-MiniLM-L6-v2: kitlib.models.heads.MeanPoolClassifier)."""
    from kitlib.models.loading import load_text_classifier

    texts = train["text"].tolist()
    tokenizer, model, _ = load_text_classifier(2, train_texts=texts, tiny=tiny, seed=SEED, pooling="cls")
    return tokenizer, model


def write_submission(test: pd.DataFrame, labels: np.ndarray, work: Path) -> Path:
    path = work / "submission.csv"
    pd.DataFrame({"id": test["id"], "label": labels}).to_csv(path, index=False)
    return path


def worker_kitlib(data: Path, work: Path, epochs: int, tiny: bool, sets: list[str]) -> dict[str, Any]:
    from kitlib.machine.hardware import detect
    from kitlib.notebook import presets, training
    from kitlib.notebook import stages as workflow

    p = workflow.params(data_dir=data, work_dir=work / "work", preset="balanced", model="tiny" if tiny else "auto")
    hw = detect()
    overrides: dict[str, Any] = {"max_length_cap": MAX_LENGTH}  # the shared 128-token cap (balanced caps at 256)
    overrides |= dict(parse_set(s) for s in sets)  # --kitlib-set: a lever measured against kitlib's defaults
    if epochs != presets.get_preset("balanced").epochs:
        overrides["epochs"] = epochs
    feats = workflow.features(p, workflow.setup(p, hw, preset="balanced", overrides=overrides))
    run = feats.run  # re-fitted to the data: max_length by coverage, smaller steps for a short run
    result = training.train(p, feats, hw=hw)
    training.infer(p, feats, hw=hw)
    facts = result.timing["run"]
    cfg = run.config
    return {
        "precision": cfg.precision,
        "submission": str(p.work_dir / "submission.csv"),
        "train_s": sum(facts["epoch_train_s"]),
        "samples": facts["samples"],
        "real_tokens": facts["real_tokens"],
        "computed_tokens": facts["computed_tokens"],
        "note": f"balanced: {cfg.precision}, batch {cfg.micro_batch_size}x{cfg.grad_accum_steps}, lr {cfg.lr:g}, "
        f"max_length {cfg.max_length}, freeze {cfg.freeze}, full eval every {cfg.full_eval_every} epoch(s)",
    }


def worker_naive(data: Path, work: Path, epochs: int, tiny: bool) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    train, test, train_idx, valid_idx = split_frame(data)
    tokenizer, model = load_model(train, tiny)
    # What the tutorials show: pad every row to a fixed max_length, up front.
    enc = tokenizer(
        train["text"].tolist(), padding="max_length", max_length=MAX_LENGTH, truncation=True, return_tensors="pt"
    )
    y = torch.tensor(train["label"].to_numpy())
    ids, mask = enc["input_ids"], enc["attention_mask"]
    torch.manual_seed(SEED)
    loader = DataLoader(
        TensorDataset(ids[train_idx], mask[train_idx], y[train_idx]), batch_size=NAIVE_BATCH, shuffle=True
    )
    valid = DataLoader(TensorDataset(ids[valid_idx], mask[valid_idx], y[valid_idx]), batch_size=NAIVE_BATCH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    train_s, samples, real, computed = 0.0, 0, 0, 0
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        model.train()
        for b_ids, b_mask, b_y in loader:
            loss = model(input_ids=b_ids, attention_mask=b_mask, labels=b_y).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            samples, real, computed = samples + len(b_y), real + int(b_mask.sum()), computed + b_ids.numel()
        train_s += time.perf_counter() - t0
        model.eval()
        hits = 0
        with torch.no_grad():  # full eval over every validation row, every epoch
            for b_ids, b_mask, b_y in valid:
                hits += int((model(input_ids=b_ids, attention_mask=b_mask).logits.argmax(-1) == b_y).sum())
        print(f"epoch {epoch}: val accuracy {hits / len(valid_idx):.4f}", flush=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        for name in ("last.pt", f"epoch_{epoch}.pt"):  # two full saves every epoch, as users do
            torch.save(state, work / name)
    test_enc = tokenizer(
        test["text"].tolist(), padding="max_length", max_length=MAX_LENGTH, truncation=True, return_tensors="pt"
    )
    preds = []
    with torch.no_grad():
        for b_ids, b_mask in DataLoader(
            TensorDataset(test_enc["input_ids"], test_enc["attention_mask"]), batch_size=NAIVE_BATCH
        ):
            preds.append(model(input_ids=b_ids, attention_mask=b_mask).logits.argmax(-1))
    sub = write_submission(test, torch.cat(preds).numpy(), work)
    note = f"fp32, batch {NAIVE_BATCH}, lr {LR:g}, padding max_length={MAX_LENGTH}, eval + 2 saves per epoch"
    return {
        "precision": "fp32",  # what the tutorials' loop runs
        "submission": str(sub),
        "train_s": train_s,
        "samples": samples,
        "real_tokens": real,
        "computed_tokens": computed,
        "note": note,
    }


def user_precision(data: Path, work: Path, tiny: bool) -> Any:
    """The precision a user tuning by hand would pick on this machine: kitlib's plan for it (a GPU's by its
    capability, a CPU's fp32)."""
    from kitlib.machine.hardware import detect
    from kitlib.machine.precision import decide_precision
    from kitlib.notebook import stages

    p = stages.params(data_dir=data, work_dir=work / "plan", model="tiny" if tiny else "auto")
    return decide_precision(stages.planning_hw(p, detect()))


def tuned_settings(dtype: str, *, cuda: bool) -> dict[str, Any]:
    """Trainer's arguments as a user tunes them: half precision where the machine runs it fast, batches grouped by
    length, eval and one checkpoint per epoch. On a CPU Trainer runs bf16 autocast only with use_cpu=True
    (without it TrainingArguments refuses bf16=True: "Your setup doesn't support bf16/gpu")."""
    return dict(
        learning_rate=LR,
        per_device_train_batch_size=TUNED_BATCH,
        per_device_eval_batch_size=4 * TUNED_BATCH,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        use_cpu=not cuda,
        train_sampling_strategy="group_by_length",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,
        dataloader_num_workers=0,  # 2 cores: a worker would steal a core from the matmuls (kitlib decides 0 too)
        dataloader_pin_memory=cuda,
    )


def worker_trainer(data: Path, work: Path, epochs: int, tiny: bool, tuned: bool) -> dict[str, Any]:
    import torch
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    class CountingTrainer(Trainer):
        """Counts padding where batches meet the model (works with dataloader workers too) and times the
        evaluations and checkpoints that run inside train(), so train samples/s means training only."""

        real = computed = 0
        eval_s = save_s = 0.0

        def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
            self.real += int(inputs["attention_mask"].sum())
            self.computed += inputs["input_ids"].numel()
            return super().training_step(model, inputs, num_items_in_batch)

        def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
            t0 = time.perf_counter()
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                self.eval_s += time.perf_counter() - t0

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            t0 = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.save_s += time.perf_counter() - t0

    def accuracy(pred: Any) -> dict[str, float]:
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    train, test, train_idx, valid_idx = split_frame(data)
    tokenizer, model = load_model(train, tiny)
    # Dynamic padding (the collator pads each batch to its longest row); truncation at the shared cap.
    enc = tokenizer(train["text"].tolist(), truncation=True, max_length=MAX_LENGTH)
    rows = [
        {"input_ids": i, "attention_mask": m, "labels": int(y)}
        for i, m, y in zip(enc["input_ids"], enc["attention_mask"], train["label"], strict=True)
    ]
    train_ds, valid_ds = [rows[i] for i in train_idx], [rows[i] for i in valid_idx]
    if tuned:
        plan = user_precision(data, work, tiny)
        print(f"tuned Trainer precision: {plan.dtype} ({plan.reason})", flush=True)
        for r in train_ds:
            r["length"] = len(r["input_ids"])  # precomputed; without `datasets` Trainer re-derives it from input_ids
        settings = tuned_settings(plan.dtype, cuda=torch.cuda.is_available())
        note = f"{plan.dtype}, batch {TUNED_BATCH} (eval x4), lr {LR:g}, group_by_length, eval+save per epoch"
    else:
        settings, note = {}, "defaults: fp32, batch 8, lr 5e-5, save every 500 steps, eval at the end"
        plan = None
    args = TrainingArguments(output_dir=str(work / "trainer"), num_train_epochs=epochs, report_to="none", **settings)
    trainer = CountingTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=valid_ds,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0 - trainer.eval_s - trainer.save_s
    if not tuned:
        print(f"final eval: {trainer.evaluate()}", flush=True)  # defaults never evaluate during training
    # group_by_length also reorders evaluation/prediction batches: predict in row order or the labels get shuffled.
    trainer.args.train_sampling_strategy = "random"
    t_enc = tokenizer(test["text"].tolist(), truncation=True, max_length=MAX_LENGTH)
    test_rows = [
        {"input_ids": i, "attention_mask": m} for i, m in zip(t_enc["input_ids"], t_enc["attention_mask"], strict=True)
    ]
    logits = trainer.predict(test_rows).predictions
    sub = write_submission(test, logits.argmax(-1), work)
    return {
        "precision": plan.dtype if plan is not None else "fp32",
        "submission": str(sub),
        "train_s": train_s,
        "samples": len(train_ds) * epochs,
        "real_tokens": trainer.real,
        "computed_tokens": trainer.computed,
        "note": note,
    }


def parse_set(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` -> (NAME, VALUE as JSON where it parses: true, 3, 1e-4; else the string)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--kitlib-set {text!r}: expected NAME=VALUE, e.g. --kitlib-set compile=true")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def worker(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  -- heavy imports before the clock starts: not what is being compared
    import transformers  # noqa: F401

    import kitlib.engine.loop  # noqa: F401
    from kitlib.tasks.scoring import score

    if args.contender.startswith("trainer"):
        from transformers import Trainer  # noqa: F401  -- pulls in accelerate

    work = args.out.resolve() / args.contender
    start = time.perf_counter()
    if args.contender == "kitlib":
        r = worker_kitlib(args.data, work, args.epochs, args.tiny, args.kitlib_set)
    elif args.contender == "naive":
        r = worker_naive(args.data, work, args.epochs, args.tiny)
    else:
        r = worker_trainer(args.data, work, args.epochs, args.tiny, tuned=args.contender == "trainer_tuned")
    wall = time.perf_counter() - start
    result = {
        "wall_s": round(wall, 2),
        "accuracy": round(score(args.data / "solution.csv", r["submission"]), 4),
        "samples_per_s": round(r["samples"] / r["train_s"], 2),
        "padding_efficiency": round(r["real_tokens"] / max(r["computed_tokens"], 1), 4),
        "train_s": round(r["train_s"], 2),
        "precision": r["precision"],  # what this contender ran, as it would for a user on this machine
        "samples": r["samples"],
        "note": r["note"],
    }
    (work / "result.json").write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", type=Path, default=Path("/tmp/kitlib-demo"), help="made with make_demo if missing")
    parser.add_argument("--rows", type=int, default=None, help="subsample train rows (seeded); default all")
    parser.add_argument("--test-rows", type=int, default=None, help="subsample test rows (seeded); default all")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="the tiny 2-layer fallback model instead of MiniLM")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CONTENDERS)}")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_vs_trainer"))
    lever = "a TrainConfig/preset override for kitlib only, to measure a lever (compile=true)"
    parser.add_argument("--kitlib-set", action="append", default=[], metavar="NAME=VALUE", help=lever)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # worker mode
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return worker(args) if args.contender else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
