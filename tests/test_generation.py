"""Generation (kitlib.notebook.tasks.generation): limits read from the training targets, no loops, and never a blank
cell in a generated submission, even from a model that emits only end-of-sequence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from kitlib.notebook import stages
from kitlib.notebook.tasks.generation import IGNORE, NoRepeatNGram, longest_repeat, repeats, target_limits


class _Tokenizer:
    """Ids 0 <pad>, 1 </s>, then one word per id."""

    eos_token_id, pad_token_id = 1, 0
    words = ("<pad>", "</s>", "a", "b", "c", "d")

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(self.words[i] for i in ids if not (skip_special_tokens and i < 2))


def test_limits_come_from_the_training_targets() -> None:
    """Lengths: the shortest target's tokens (</s> aside) and the longest's with </s>; the no-repeat run: the
    shortest that 99% of targets never repeat; the fallback: the most common target."""
    rows = [[2, 3, 1], [2, 3, 1], [4, 5, 4, 5, 2, 1], [3, 1]]  # the third repeats the run 4 5
    labels = np.full((len(rows), 8), IGNORE)
    for i, row in enumerate(rows):
        labels[i, 8 - len(row) :] = row  # where causal-lm puts them: after the prompt's -100s
    limits = target_limits(labels, _Tokenizer())
    assert (limits.min_new_tokens, limits.max_new_tokens) == (1, 6)
    assert limits.no_repeat_ngram_size == 3 and limits.fallback == "a b"
    assert longest_repeat([4, 5, 4, 5, 2]) == 2 and longest_repeat([2, 3, 4]) == 0
    assert repeats([2, 2], 1) and not repeats([2, 3, 2], 2)


def test_no_repeat_ngram_blocks_a_loop_in_the_generated_part_only() -> None:
    """A run already generated cannot be completed again; the same run in the prompt (before ``start``) does not
    count, so a response may copy a span of its prompt."""
    ids = torch.tensor([[4, 5, 9, 4, 5, 4]])  # prompt 4 5 9, generated 4 5 4: "4 5" is generated once already
    scores = torch.zeros(1, 10)
    NoRepeatNGram(2, start=3)(ids, scores)
    assert scores[0, 5] == -float("inf") and torch.isfinite(scores[0, [0, 1, 2, 3, 4, 6, 7, 8, 9]]).all()
    scores = torch.zeros(1, 10)
    NoRepeatNGram(3, start=3)(torch.tensor([[4, 5, 9, 4, 5]]), scores)  # "4 5 9" only in the prompt: allowed
    assert torch.isfinite(scores).all()


def _only_eos(model: torch.nn.Module) -> None:
    """Make ``model`` put all its weight on </s> at every position: left alone, it generates nothing."""
    eos = int(getattr(model, "kitlib_tokenizer").eos_token_id)  # noqa: B009

    def hook(module: Any, args: Any, output: Any) -> Any:
        logits = torch.zeros_like(output.logits)
        logits[..., eos] = 30.0
        output.logits = logits
        return output

    model.register_forward_hook(hook)


@pytest.mark.parametrize("task", ["seq2seq", "causal-lm"])
def test_a_generated_submission_never_holds_an_empty_cell(
    tmp_path: Path, cpu_hw: Any, task: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kitlib.tools import demo_sft, demo_sql

    paths: Any = (
        demo_sql.make_sql_demo(tmp_path / "data", n_train=160, n_test=20)
        if task == "seq2seq"
        else demo_sft.make_sft_demo(tmp_path / "data", n_train=160, n_test=20)
    )
    values: dict[str, Any] = demo_sql.PARAMETERS if task == "seq2seq" else demo_sft.PARAMETERS
    p = stages.params(data_dir=paths.root, work_dir=tmp_path / "work", preset="smoke", model="tiny", **values)
    stages.setup(p, cpu_hw)
    stages.features(p, hw=cpu_hw, quiet=True)
    stages.train(p, hw=cpu_hw)
    prepare = stages.prepare

    def eos_only_prepare(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        _only_eos(prepared.model)
        return prepared

    monkeypatch.setattr(stages, "prepare", eos_only_prepare)
    stages.infer(p, hw=cpu_hw)
    written = pd.read_csv(p.work_dir / "submission.csv", keep_default_na=False, dtype=str)
    target = values["target"]
    assert len(written) == 20 and (written[target].str.strip() != "").all()
    assert "generated 20 texts" in capsys.readouterr().out


def test_blank_outputs_are_replaced_and_blank_looped_and_cut_ones_counted() -> None:
    from kitlib.notebook.tasks.generation import Limits, Tally, read_outputs, report

    limits = Limits(min_new_tokens=1, max_new_tokens=4, no_repeat_ngram_size=2, fallback="a b")
    tally = Tally()
    rows = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [3, 1, 4, 4], [2, 2, 2, 2]])  # </s>; <pad> </s>; b; a a a a
    assert read_outputs(rows, _Tokenizer(), limits, tally) == ["a b", "a b", "b", "a a a a"]
    assert (tally.rows, tally.blank, tally.looped, tally.cut) == (4, 2, 1, 1)
    assert report(tally, limits, "greedy").startswith("generated 4 texts (greedy): 2 blank")
