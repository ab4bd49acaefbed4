"""Issue #30's route matrix: each big-model route runs 00 -> 03 smoke-sized on the CPU and its run record says what
actually trained (adapter, optimizer, weight dtypes, world size, micro-batch) and 03 writes a scored submission.

Covered (the combinations offered; the refusals in 00 are tests/test_lora.py's, qlora off CUDA and for classifiers):
  through the four notebooks, 2 gloo workers rehearsing 2xT4: qlora x adamw8bit (the Kaggle 7B route)
  in process, 1 process:  qlora x adamw (rehearsing a T4), lora x adamw-kahan (rehearsing an H100: refused without
                          bf16 weights), none x adamw8bit, lora on the classifier,
                          qlora x adamw8bit on seq2seq (a tiny T5 folder, rehearsing a T4)
  elsewhere: none x adamw (every notebook test), lora x adamw through the notebooks (tests/test_lora.py)
Cost: ~2-4 minutes on 2 cores, hence slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")
pytest.importorskip("optimi")
pytestmark = pytest.mark.slow

OPTIMIZERS = {"adamw": "torch.AdamW", "adamw8bit": "bitsandbytes.AdamW8bit", "adamw-kahan": "optimi.AdamW"}


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the SFT demo's data, a tiny GPT-2 model folder with its tokenizer)."""
    from test_lora import sft_demo_and_model_folder

    demo, folder = sft_demo_and_model_folder(tmp_path_factory.mktemp("sft"), n_train=48, n_test=8)
    return demo.root, folder


def _says_what_ran(work: Path, adapter: str, optimizer: str, world: int, rows: int, metric: str) -> None:
    import pandas as pd

    record = json.loads((work / "run" / "timing.json").read_text())["run"]
    planned = json.loads((work / "run.json").read_text())
    frozen = {"none": None, "lora": "float32", "qlora": "float32, nf4"}[adapter]  # qlora: fp32 embeddings, head
    assert (record["adapter"], record["optimizer"], record["world_size"]) == (adapter, OPTIMIZERS[optimizer], world)
    assert (record["trained_dtype"], record["frozen_dtype"]) == ("float32", frozen)
    assert record["oom_backoffs"] == [] and record["micro_batch_size"] == planned["config"]["micro_batch_size"]
    assert planned["config"]["optimizer"] == optimizer  # what 00 planned is what trained
    history = pd.read_csv(work / "run" / "history.csv")
    assert history[metric].notna().all() and history["eval_loss"].notna().all()  # scored, best/ chosen
    assert (work / "run" / "best" / "model.safetensors").is_file()
    submission = pd.read_csv(work / "submission.csv")
    assert len(submission) == rows and submission.notna().all().all()


def test_qlora_with_8bit_adamw_on_2_rehearsed_gloo_workers_through_the_four_notebooks(
    sft: tuple[Path, Path], tmp_path: Path
) -> None:
    """Must-show 1: the Kaggle 2xT4 route rehearsed: 4-bit base (bitsandbytes' CPU backend), rank 0's adapters
    reloaded by the parent (item 2), 8-bit AdamW from --optimizer (item 8), a scored submission."""
    from kitlib.tools.demo_sft import PARAMETERS

    data, folder = sft
    work = tmp_path / "work"
    command = [sys.executable, "-m", "kitlib", "notebooks", "run", "--data", str(data), "--work", str(work),
               "--preset", "smoke", "--model", str(folder), "--adapter", "qlora", "--optimizer", "adamw8bit",
               "--hardware", "2xT4", *[f"--{k}={v}" for k, v in PARAMETERS.items()]]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")} | {"KIT_REHEARSE": "1"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _says_what_ran(work, "qlora", "adamw8bit", 2, 8, "exact_match")


@pytest.mark.parametrize(
    ("adapter", "optimizer", "hardware"),
    [("qlora", "adamw", "T4"), ("lora", "adamw-kahan", "H100"), ("none", "adamw8bit", "")],
)
def test_a_causal_lm_route_in_one_process(
    adapter: str, optimizer: str, hardware: str, sft: tuple[Path, Path], tmp_path: Path, cpu_hw: Any
) -> None:
    """qlora on a CPU only as a rehearsal of a GPU plan (``hardware``, ``rehearse``), adamw-kahan as one of a bf16 plan;
    the rest on the CPU itself."""
    from kitlib.notebook import stages
    from kitlib.tools.demo_sft import PARAMETERS

    data, folder = sft
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model=str(folder), adapter=adapter,
                      optimizer=optimizer, hardware=hardware, rehearse=bool(hardware), **PARAMETERS)  # fmt: skip
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    stages.train(p, hw=cpu_hw)
    stages.infer(p, hw=cpu_hw)
    _says_what_ran(p.work_dir, adapter, optimizer, 1, 8, "exact_match")


def test_lora_on_the_classifier(tmp_path: Path, cpu_hw: Any) -> None:
    from kitlib.notebook import stages
    from kitlib.tools.demo import make_demo

    demo = make_demo(tmp_path / "demo")
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", preset="smoke", model="tiny", adapter="lora")
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    stages.train(p, hw=cpu_hw)
    stages.infer(p, hw=cpu_hw)
    rows = len(__import__("pandas").read_csv(demo.test))
    _says_what_ran(p.work_dir, "lora", "adamw", 1, rows, json.loads((p.work_dir / "run.json").read_text())["metric"])


def test_qlora_on_an_encoder_decoder_through_the_four_notebooks(tmp_path: Path, cpu_hw: Any, cpu_4bit: None) -> None:
    """seq2seq's QLoRA route: a T5 folder (built from a config, its tokenizer trained on the SQL demo) in 4 bits
    (bitsandbytes' CPU backend, rehearsing a T4), 8-bit AdamW; the record says so and 03 writes a scored submission."""
    import pandas as pd

    from kitlib.models.seq2seq import data_tokenizer, tiny_seq2seq
    from kitlib.notebook import stages
    from kitlib.tools.demo_sql import PARAMETERS, make_sql_demo

    demo = make_sql_demo(tmp_path / "data", n_train=48, n_test=8)
    train = pd.read_csv(demo.train)
    tokenizer, _ = data_tokenizer([*train["question"], *train["query"]])
    folder = tmp_path / "t5-folder"
    tiny_seq2seq(tokenizer, seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", preset="smoke", model=str(folder),
                      adapter="qlora", optimizer="adamw8bit", hardware="T4", rehearse=True, **PARAMETERS)  # fmt: skip
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    stages.train(p, hw=cpu_hw)
    stages.infer(p, hw=cpu_hw)
    _says_what_ran(p.work_dir, "qlora", "adamw8bit", 1, 8, "record_f1")
