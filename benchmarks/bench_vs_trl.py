"""kitlib vs TRL's SFTTrainer on the same chat SFT run (issue #31), side by side, interleaved repeats.

    python benchmarks/bench_vs_trl.py                  # full: 2,000 chats of tens to ~1,500 tokens, 4-layer Llama
    python benchmarks/bench_vs_trl.py --small          # a busy CPU's size: 160 chats of 10 to ~300 words
    PYTHONPATH=/path/to/trl_and_datasets python benchmarks/bench_vs_trl.py ...   # TRL installed aside

Both train the same Llama-shaped model built from a config (saved as a folder with a ChatML tokenizer trained on the
data), on the same training rows (kitlib's own split: TRL gets kitlib's training rows), for the same epochs, batch
and lr, loss on the assistant's tokens only. Each contender runs as its user would: kitlib through the notebooks'
stages (00 setup, 01 features, 02 train: its length, batching and precision choices, its end-of-run generating eval
included in the wall time); TRL's SFTTrainer (prompt-completion chats: completion-only loss) three ways: "tuned"
(fp32 and no gradient checkpointing: what a CPU without bf16 instructions runs fastest), its defaults (bf16 autocast
and gradient checkpointing), and tuned with packing=True (TRL's "bfd" packing, padding-free). On a CPU the last two
run --cap and --cap/3 steps (tokens/s only: a whole epoch of the defaults took ~67 min here, and padding-free rows
attend over the whole flattened batch without flash-attn). Reported per contender: wall seconds,
trained tokens/s (real tokens of the training rows per wall second of training), and the eval loss of every
contender's final weights on kitlib's validation rows, computed by one function here (token-weighted mean cross-entropy
on the assistant's tokens). Ratios are within one repeat; the table gives the median over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [f"w{i}" for i in range(300)]


def chats(n: int, low: int, high: int, seed: int = 0) -> list[dict[str, Any]]:
    """Chats whose total words spread lognormally between low and high (a long tail, like chain-of-thought SFT):
    ~40% prompt, the rest the reply, which repeats a pattern of the prompt's words (learnable)."""
    rng = np.random.default_rng(seed)
    totals = np.clip(np.exp(rng.normal(0, 0.6, n)) * (low + high) / 4, low, high).astype(int)
    rows = []
    for i, total in enumerate(totals):
        prompt = list(rng.choice(WORDS, max(2, int(0.4 * total))))
        reply = (prompt[::-1] * (1 + total // max(1, len(prompt))))[: max(1, total - len(prompt))]
        rows.append({"id": i, "messages": [{"role": "system", "content": "Reverse the words."},
                                           {"role": "user", "content": " ".join(prompt)},
                                           {"role": "assistant", "content": " ".join(reply)}]})  # fmt: skip
    return rows


def model_folder(folder: Path, texts: list[str], small: bool) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from kitlib.models.bpe import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(texts, vocab_size=1000, add_eos=False)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    hidden, layers = (128, 2) if small else (512, 4)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=max(1,
                         hidden // 128), max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def eval_loss(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> float:
    """Token-weighted mean cross-entropy on the assistant's reply and <|im_end|>, prompts rendered by the template."""
    model.eval()
    total = count = 0.0
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        for row in rows:
            prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=False)
            p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            r_ids = [*tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"], end]
            ids = torch.tensor([p_ids + r_ids])
            labels = torch.tensor([[-100] * len(p_ids) + r_ids])
            loss = model(input_ids=ids.to(model.device), labels=labels.to(model.device)).loss
            total += float(loss) * len(r_ids)
            count += len(r_ids)
    return total / count


def run_kitlib(work: Path, data: Path, folder: Path, hp: dict[str, Any]) -> dict[str, Any]:
    from kitlib.notebook import stages, training

    p = stages.params(data_dir=data, work_dir=work, preset="balanced", model=str(folder), task="causal-lm",
                      text="prompt", target="response", metric="exact_match", train_file="train.jsonl",
                      test_file="test.jsonl", epochs=hp["epochs"], micro_batch_size=hp["batch"], grad_accum_steps=1,
                      lr=hp["lr"])  # fmt: skip
    stages.setup(p)
    feats = stages.features(p, quiet=True)
    started = time.perf_counter()
    result = training.train(p)
    wall = time.perf_counter() - started
    timing = json.loads((p.run_dir / "timing.json").read_text())["run"]
    config = json.loads((p.run_dir / "config.json").read_text())["config"]
    train_s = sum(timing.get("epoch_train_s") or []) or wall  # the epochs' training seconds (evals aside)
    return {"model": result.model, "wall_s": wall, "tokens": timing.get("real_tokens"), "train_s": train_s,
            "batching": config["batching"], "precision": config["precision"], "split": feats.n_train}  # fmt: skip


def _hash_or_random() -> None:
    """datasets fingerprints each map() by pickling its arguments with dill; on this machine (datasets 5.2, dill 0.4.1,
    pyarrow 24-26, Python 3.11) that raises PicklingError on pyarrow's MonthDayNano. A random fingerprint instead
    (datasets' own fallback for unhashable arguments) only loses its cache, which a one-off run does not use."""
    import uuid

    import datasets.fingerprint as fingerprint

    hash_ = fingerprint.Hasher.hash.__func__  # type: ignore[attr-defined]

    def safe(cls: Any, value: Any) -> str:
        try:
            return str(hash_(cls, value))
        except Exception:
            return uuid.uuid4().hex

    fingerprint.Hasher.hash = classmethod(safe)  # type: ignore[assignment]


def run_trl(
    work: Path,
    folder: Path,
    rows: list[dict[str, Any]],
    hp: dict[str, Any],
    packing: bool,
    tuned: bool,
    max_steps: int = 0,
) -> dict[str, Any]:
    """tuned: what this machine runs fastest, not SFTConfig's defaults (bf16 autocast and gradient checkpointing, which
    a CPU without bf16 instructions emulates and recomputes). max_steps > 0 stops after that many optimizer steps:
    tokens/s from those steps, no comparable eval loss."""
    _hash_or_random()
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
    args = SFTConfig(output_dir=str(work), num_train_epochs=hp["epochs"], per_device_train_batch_size=hp["batch"],
                     gradient_accumulation_steps=1, learning_rate=hp["lr"], max_length=hp["max_length"],
                     packing=packing, report_to=[], save_strategy="no", logging_steps=50,
                     use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                     max_steps=max_steps or -1, **({"bf16": False, "gradient_checkpointing": False} if tuned
                     else {}))  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    started = time.perf_counter()
    out = trainer.train()
    wall = time.perf_counter() - started
    # capped: the tokens those steps trained (TRL's own count: attention-mask sum, or the flattened row)
    tokens = (int(trainer._total_train_tokens) if max_steps
              else sum(map(len, trainer.train_dataset["input_ids"])) * hp["epochs"])  # fmt: skip
    return {
        "capped": max_steps,
        "model": trainer.model,
        "wall_s": wall,
        "tokens": tokens,
        "train_s": out.metrics["train_runtime"],
        "batching": ("packed (bfd)" if packing else "padded")
        + (", gradient checkpointing" if args.gradient_checkpointing else ""),
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "split": len(rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="160 chats of 10-300 words, a 2-layer hidden-128 Llama")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--cap",
        type=int,
        default=None,
        help="stop TRL's default and packing runs after this many steps: their tokens/s only (default on a CPU: 10 "
        "steps, where the defaults' emulated bf16 ran an epoch in ~67 min; 0: whole epochs)",
    )
    ap.add_argument("--minutes", type=float, default=0, help="begin no repeat that would end past this (0: no limit)")
    args = ap.parse_args()
    n, low, high = (160, 10, 300) if args.small else (2000, 10, 740)  # ~2 tokens a word here: tens to ~1,500 tokens
    hp = {"epochs": 1, "batch": 8, "lr": 1e-3 if args.small else 2e-4, "max_length": 2048}
    from kitlib.notebook import stages

    root = Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    rows = chats(n, low, high)
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    test = [{"id": 10_000 + i, "messages": r["messages"][:-1]} for i, r in enumerate(rows[:8])]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    (data / "sample_submission.csv").write_text("id,response\n" + "".join(f"{t['id']},x\n" for t in test))
    folder = model_folder(root / "llama", [" ".join(m["content"] for m in r["messages"]) for r in rows], args.small)
    train_idx, valid_idx = stages._split(len(rows), 42)  # kitlib's split for seed 42: TRL trains on the same rows
    train_rows, valid_rows = [rows[i] for i in train_idx], [rows[i] for i in valid_idx]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    cap = args.cap if args.cap is not None else (0 if torch.cuda.is_available() else 10)
    contenders = {  # packing padding-free flattens a batch into one row: on a CPU (no flash-attn) fewer steps
        "kitlib": lambda k: run_kitlib(root / f"kit{k}", data, folder, hp),
        "trl tuned": lambda k: run_trl(root / f"trlt{k}", folder, train_rows, hp, packing=False, tuned=True),
        "trl defaults": lambda k: run_trl(
            root / f"trl{k}", folder, train_rows, hp, packing=False, tuned=False, max_steps=cap
        ),
        "trl packing": lambda k: run_trl(
            root / f"trlp{k}", folder, train_rows, hp, packing=True, tuned=True, max_steps=cap // 3
        ),
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    began = time.perf_counter()
    for k in range(args.repeats):  # interleaved: the machine's load shifts every contender alike
        spent = time.perf_counter() - began
        if args.minutes and k and spent / k + spent > args.minutes * 60:
            print(f"repeat {k + 1} not begun: {k} took {spent / 60:.0f} min of --minutes {args.minutes:.0f}")
            break
        for name, run in contenders.items():
            try:
                r = run(k)
                model = r.pop("model")  # a capped run's loss is not at equal epochs: not compared
                r["eval_loss"] = float("nan") if r.get("capped") else eval_loss(model, tokenizer, valid_rows)
                r["tokens_per_s"] = (r["tokens"] or 0) / r["train_s"]
            except Exception as e:  # a contender this machine cannot run: said, not hidden
                r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            results[name].append(r)
            print(name, k, {key: v for key, v in r.items() if key != "model"}, flush=True)
    print(f"\n{n} chats ({low}-{high} words), {len(train_rows)} trained, {len(valid_rows)} held out; "
          f"epochs {hp['epochs']}, batch {hp['batch']}, lr {hp['lr']}; {len(results['kitlib'])} interleaved repeats; "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")  # fmt: skip
    print(f"{'contender':<14} {'wall s':>8} {'tokens/s':>9} {'eval loss':>9}  batching")
    best_trl = None
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"{name:<14} did not run: {runs[0]['error']}")
            continue
        med = {key: statistics.median(r[key] for r in ok) for key in ("wall_s", "tokens_per_s", "eval_loss")}
        capped = f", stopped after {ok[0]['capped']} steps: tokens/s only" if ok[0].get("capped") else ""
        print(f"{name:<14} {med['wall_s']:8.1f} {med['tokens_per_s']:9.0f} {med['eval_loss']:9.3f}  "
              f"{ok[0]['batching']}{capped}")  # fmt: skip
        if name.startswith("trl") and (best_trl is None or med["tokens_per_s"] > best_trl[1]["tokens_per_s"]):
            best_trl = (name, med)
    kit = [r for r in results["kitlib"] if "error" not in r]
    for name in (n for n in results if n != "kitlib"):  # every TRL contender; the best by tokens/s is marked
        both = zip(results["kitlib"], results[name], strict=True)
        pairs = [(k, t) for k, t in both if "error" not in k and "error" not in t]
        if not pairs:
            continue
        ratios = [k["tokens_per_s"] / t["tokens_per_s"] for k, t in pairs]
        line = (f"kitlib / {name}{' (TRL best)' if best_trl and name == best_trl[0] else ''}: tokens/s "
                f"x{statistics.median(ratios):.2f} (per repeat {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
        if not pairs[0][1].get("capped"):  # a capped run's wall and loss are not at equal epochs
            walls = [t["wall_s"] / k["wall_s"] for k, t in pairs]
            line += (f", wall x{statistics.median(walls):.2f} faster; eval loss "
                     f"{statistics.median(k['eval_loss'] for k in kit):.3f} vs "
                     f"{statistics.median(t['eval_loss'] for _, t in pairs):.3f}")  # fmt: skip
        print(line)


if __name__ == "__main__":
    main()
