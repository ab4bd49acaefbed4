"""Generation (kitlib.notebook.tasks.generation): limits read from the training targets, no loops, and never a blank
cell in a generated submission, even from a model that emits only end-of-sequence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from kitlib.notebook import stages, training
from kitlib.notebook.tasks.generation import (
    IGNORE,
    Limits,
    NoLoops,
    Tally,
    copies_in_a_row,
    longest_repeat,
    looped,
    read_outputs,
    repeats,
    target_limits,
)


class _Tokenizer:
    """Ids 0 <pad>, 1 </s>, then one word per id."""

    eos_token_id, pad_token_id = 1, 0
    words = ("<pad>", "</s>", "a", "b", "c", "d")

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(self.words[i] for i in ids if not (skip_special_tokens and i < 2))


def test_limits_come_from_the_training_targets() -> None:
    """Lengths: the shortest target's tokens (</s> aside) and the longest's with </s>; the no-repeat run: the
    shortest that 99% of targets never repeat; the copies in a row: what 99% stay within; the fallback: the most
    common target."""
    rows = [[2, 3, 1], [2, 3, 1], [4, 5, 4, 5, 2, 1], [3, 1]]  # the third repeats the run 4 5
    labels = np.full((len(rows), 8), IGNORE)
    for i, row in enumerate(rows):
        labels[i, 8 - len(row) :] = row  # where causal-lm puts them: after the prompt's -100s
    limits = target_limits(labels, _Tokenizer())
    assert (limits.min_new_tokens, limits.max_new_tokens) == (1, 6)
    assert limits.no_repeat_ngram_size == 3 and limits.max_copies == 2 and limits.fallback == "a b"
    assert copies_in_a_row([[4, 5, 4, 5, 2], [2, 2, 2, 3], [2, 3, 4], []]).tolist() == [2, 3, 1, 1]
    assert limits.cut == 0 and target_limits(labels[:, :-1], _Tokenizer()).cut == 4  # no </s>: cut at the cap


def test_the_verdict_says_how_many_training_targets_are_cut() -> None:
    record = {"what": "the most common training target 'a b'", "metric": "exact_match", "mode": "max", "score": 0.1,
              "value": "a b", "model_score": 0.4, "kind": "sequence", "cut_targets": 3}  # fmt: skip
    line = stages.verdict_of(record)
    assert line.startswith("the model (exact_match 0.4) beats")
    assert line.endswith("; 3 training targets are cut at the length cap (the score gives them away)")
    assert "cut" not in stages.verdict_of(record | {"cut_targets": 0})
    assert longest_repeat([4, 5, 4, 5, 2]) == 2 and longest_repeat([2, 3, 4]) == 0
    assert repeats([2, 2], 1) and not repeats([2, 3, 2], 2)


def _limits(n: int, copies: int = 9) -> Limits:
    return Limits(min_new_tokens=1, max_new_tokens=20, no_repeat_ngram_size=n, max_copies=copies, fallback="a")


def test_no_repeat_ngram_blocks_a_loop_in_the_generated_part_only() -> None:
    """A run already generated cannot be completed again; the same run in the prompt (before ``start``) does not
    count, so a response may copy a span of its prompt."""
    ids = torch.tensor([[4, 5, 9, 4, 5, 4]])  # prompt 4 5 9, generated 4 5 4: "4 5" is generated once already
    scores = torch.zeros(1, 10)
    NoLoops(_limits(2), start=3)(ids, scores)
    assert scores[0, 5] == -float("inf") and torch.isfinite(scores[0, [0, 1, 2, 3, 4, 6, 7, 8, 9]]).all()
    scores = torch.zeros(1, 10)
    NoLoops(_limits(3), start=3)(torch.tensor([[4, 5, 9, 4, 5]]), scores)  # "4 5 9" only in the prompt: allowed
    assert torch.isfinite(scores).all()
    scores = torch.zeros(1, 10)
    NoLoops(_limits(12, copies=2), start=0)(torch.tensor([[3, 4, 5, 6, 4, 5, 6, 4, 5]]), scores)  # 2 copies + "4 5"
    assert scores[0, 6] == -float("inf") and int(torch.isinf(scores).sum()) == 1


def test_the_guard_lets_through_nothing_the_count_calls_a_loop() -> None:
    """One measure: greedy decoding of random scores under NoLoops never yields a row ``looped`` flags."""
    generator = torch.Generator().manual_seed(0)
    for n, copies in [(2, 2), (4, 2), (12, 2), (12, 3)]:
        limits, guard = _limits(n, copies), NoLoops(_limits(n, copies), start=0)
        ids = torch.zeros(8, 0, dtype=torch.long)
        for _ in range(24):  # 16 tokens, steered to tokens 0 and 1: loops come first
            scores = guard(ids, torch.rand(8, 16, generator=generator) + torch.tensor([2.0, 1] + [0] * 14))
            ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], dim=1)
        assert not looped(ids.tolist(), limits).any()


def _loops_on(model: torch.nn.Module, token: int) -> None:
    """Plant a loop: ``model`` puts all its weight on ``token`` at every position, the rest tied below it."""

    def hook(module: Any, args: Any, output: Any) -> Any:
        logits = torch.zeros_like(output.logits)
        logits[..., token] = 30.0
        output.logits = logits
        return output

    model.register_forward_hook(hook)


@pytest.mark.parametrize("task", ["seq2seq", "causal-lm"])
def test_a_planted_looping_model_is_counted_and_stopped(task: str) -> None:
    """A model that says one word forever, with targets whose long runs set the no-repeat run at 12 tokens (as long
    answers do): 03's count calls its raw output looped, and generation's guard stops it repeating that word more
    than max_copies times in a row. Old kitlib counted "0 looped" for 121 such answers and let them through."""
    from kitlib.models.seq2seq import data_tokenizer
    from kitlib.notebook.tasks.causal_lm import generate
    from kitlib.notebook.tasks.seq2seq import Seq2SeqTask

    tokenizer, _ = data_tokenizer(["the cat sat on the mat", "a dog"])
    limits = _limits(12, copies=2)
    word = tokenizer.eos_token_id + 7
    tally = Tally()
    read_outputs([[word] * 8 + [tokenizer.eos_token_id]], tokenizer, limits, tally)
    assert tally.looped == 1  # eight copies in a row of one token: a loop, though no 12-token run repeats
    if task == "causal-lm":
        from kitlib.models.causal_lm import tiny_causal_lm

        model = tiny_causal_lm(tokenizer, seed=0, n_positions=64)
    else:
        from kitlib.models.seq2seq import tiny_seq2seq

        model = tiny_seq2seq(tokenizer, seed=0)
    model.kitlib_tokenizer, model.kitlib_limits = tokenizer, limits
    _loops_on(model.eval(), word)
    prompt = np.asarray(tokenizer("the cat")["input_ids"], dtype=np.int64)
    with torch.inference_mode():
        if task == "causal-lm":
            out = generate(model, [prompt, prompt[:2]])
        else:
            ids = torch.as_tensor(np.stack([prompt, prompt]))
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            out = Seq2SeqTask().generate_batch(model, batch, num_beams=1)
    rows = [row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row for row in out.tolist()]
    assert all(row.count(word) >= 2 for row in rows)  # it still says its word ...
    assert copies_in_a_row(rows).max() <= 2 and not looped(rows, limits).any()  # ... but never loops on it


def test_02s_baseline_and_03s_fallback_name_the_same_most_common_target() -> None:
    """Two targets tie as the most common (the later-sorted one seen first): both name the first in sorted order."""
    from kitlib.tasks.baseline import trivial_baseline
    from kitlib.tasks.metrics import get_metric

    texts = ["b", "a b", "a b", "b", "c"]
    ids = {"a": 2, "b": 3, "c": 4}
    labels = np.full((len(texts), 4), IGNORE)
    for i, text in enumerate(texts):
        row = [ids[w] for w in text.split()] + [1]
        labels[i, : len(row)] = row
    metric = get_metric("exact_match", "sequence")
    base = trivial_baseline(metric, kind="sequence", train=np.array(texts, dtype=object), valid=np.array(["x"]))
    assert target_limits(labels, _Tokenizer()).fallback == "a b" and "'a b'" in base.what


def _only_eos(model: torch.nn.Module) -> None:
    """Make ``model`` put all its weight on </s> at every position: left alone, it generates nothing."""
    _loops_on(model, int(getattr(model, "kitlib_tokenizer").eos_token_id))  # noqa: B009


@pytest.mark.parametrize("task", ["seq2seq", "causal-lm"])
def test_a_generated_submission_never_holds_an_empty_cell(
    tmp_path: Path, cpu_hw: Any, task: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from demos import sft as demo_sft
    from demos import sql as demo_sql

    paths: Any = (
        demo_sql.make_sql_demo(tmp_path / "data", n_train=160, n_test=20)
        if task == "seq2seq"
        else demo_sft.make_sft_demo(tmp_path / "data", n_train=160, n_test=20)
    )
    values: dict[str, Any] = demo_sql.parameters(paths.root) if task == "seq2seq" else demo_sft.PARAMETERS
    p = stages.params(data_dir=paths.root, work_dir=tmp_path / "work", preset="smoke", model="tiny", **values)
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    training.train(p, hw=cpu_hw)
    prepare = training.prepare

    def eos_only_prepare(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        _only_eos(prepared.model)
        return prepared

    monkeypatch.setattr(training, "prepare", eos_only_prepare)
    training.infer(p, hw=cpu_hw)
    written = pd.read_csv(p.work_dir / "submission.csv", keep_default_na=False, dtype=str)
    target = values["target"]
    assert len(written) == 20 and (written[target].str.strip() != "").all()
    assert "generated 20 texts" in capsys.readouterr().out
    record = json.loads((p.run_dir / "baseline.json").read_text())
    assert record["cut_targets"] == 0 and record["gap"]["rows"] > 0  # whole targets; the verdict has its interval


def test_blank_outputs_are_replaced_and_blank_looped_and_cut_ones_counted() -> None:
    from kitlib.notebook.tasks.generation import Tally, report

    limits = Limits(min_new_tokens=1, max_new_tokens=4, no_repeat_ngram_size=2, max_copies=2, fallback="a b")
    tally = Tally()
    rows = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [3, 1, 4, 4], [2, 2, 2, 2]])  # </s>; <pad> </s>; b; a a a a
    assert read_outputs(rows, _Tokenizer(), limits, tally) == ["a b", "a b", "b", "a a a a"]
    assert (tally.rows, tally.blank, tally.looped, tally.cut) == (4, 2, 1, 1)
    assert report(tally, limits, "greedy").startswith("generated 4 texts (greedy): 2 blank")
