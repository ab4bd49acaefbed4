"""LoRA (kitlib.models.adapters, 00's ``adapter``): only the adapters (and a classifier's head) train, checkpoints
hold them alone, a killed run resumes exactly, 03 predicts from base + adapter, and qlora off CUDA is refused with
the fix."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")

JOBS = Path(__file__).with_name("_jobs.py")


def _tiny(arch: str) -> tuple[torch.nn.Module, bool]:
    """(a tiny model of ``arch`` built from its config, whether it generates)."""
    import transformers as tf

    torch.manual_seed(0)
    if arch == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=64)), True
    if arch == "llama":
        config = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2, vocab_size=64)  # fmt: skip
        return tf.LlamaForCausalLM(config), True
    if arch == "t5":
        config = tf.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, vocab_size=64,
                             decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
        return tf.T5ForConditionalGeneration(config), True
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           vocab_size=64, num_labels=3)  # fmt: skip
    return tf.BertForSequenceClassification(config), False


def _rows(generating: bool, n: int = 32) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (n, 10), generator=g)
    labels = ids if generating else torch.randint(0, 3, (n,), generator=g)
    pairs = zip(ids, labels, strict=True)
    return [{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": y} for i, y in pairs]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5", "bert"])
def test_only_the_adapter_trains_and_best_holds_it_alone(arch: str, tmp_path: Path, cpu_hw: Any) -> None:
    from safetensors.torch import load_file
    from torch.utils.data import DataLoader

    from kitlib import TrainConfig, fit
    from kitlib.engine import checkpoint
    from kitlib.models.adapters import adapter_keys
    from kitlib.models.lora import add_adapter

    base, generating = _tiny(arch)
    model = add_adapter(base, "lora", generating=generating)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trained = set(adapter_keys(model) or ())
    assert trained and all("lora_" in k or "modules_to_save" in k for k in trained)
    assert generating or any("classifier.modules_to_save" in k for k in trained)  # a classifier's new head trains
    rows = _rows(generating)
    cfg = TrainConfig(epochs=2, micro_batch_size=8, lr=1e-2, precision="fp32", adapter="lora", full_eval_at_end=False)
    result = fit(model, DataLoader(rows, batch_size=8), config=cfg, eval_loader=DataLoader(rows, batch_size=8),
                 run_dir=tmp_path, hw=cpu_hw)  # fmt: skip
    after = result.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and changed <= trained, sorted(changed - trained)[:5]  # the pretrained weights never move
    assert all(k in changed for k in trained if "lora_B" in k)  # every adapter learned (B starts at zero)

    best = checkpoint.latest(tmp_path, "best")
    assert best is not None
    saved = load_file(best / checkpoint.MODEL_FILE)
    assert set(saved) == trained  # the adapter (and head) only
    full = sum(t.nbytes for t in after.values())
    assert (best / checkpoint.MODEL_FILE).stat().st_size < full / 2
    # Restored onto a freshly built base + adapter: the trained model again (what 03 does).
    fresh = add_adapter(_tiny(arch)[0], "lora", generating=generating)
    checkpoint.restore_model(fresh, checkpoint.load(best))
    state = fresh.state_dict()
    for name in trained:
        assert torch.equal(state[name], saved[name])
    assert all(torch.equal(state[k], before[k]) for k in before if k not in trained)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_merged_model_computes_what_base_plus_adapter_does(arch: str, tmp_path: Path) -> None:
    """merge_adapter folds the adapters into the weights: the saved folder loads with transformers alone (no peft,
    no lora tensors) and its logits equal base + adapter's to 1e-5 (fp32; (W + BA)x and Wx + B(Ax) round
    differently), where the base alone is far off."""
    import transformers as tf

    from kitlib.errors import SetupError
    from kitlib.models.lora import add_adapter, merge_adapter

    model = add_adapter(_tiny(arch)[0], "lora", generating=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # a trained adapter (B starts at zero: the merge would be the base itself)
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    model.eval()
    ids = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    merged = merge_adapter(model)
    merged.save_pretrained(tmp_path / "merged")  # type: ignore[operator]
    loaded = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not hasattr(loaded, "peft_config") and not any("lora" in k for k in loaded.state_dict())
    with torch.no_grad():
        got = loaded(input_ids=ids).logits
    assert torch.allclose(got, adapted, atol=1e-5, rtol=0), (got - adapted).abs().max()
    assert (base - adapted).abs().max() > 1e-2  # the adapter changes the outputs: the equality above is the merge's
    with pytest.raises(SetupError, match=r"no adapter"):
        merge_adapter(loaded)


def test_a_4bit_model_is_not_merged_off_cuda() -> None:
    """qlora's merge dequantises the 4-bit weights on CUDA; off CUDA it is refused with the fix."""
    bnb = pytest.importorskip("bitsandbytes")
    from kitlib.errors import SetupError
    from kitlib.models.lora import add_adapter, merge_adapter

    model, _ = _tiny("llama")
    for name, linear in list(model.named_modules()):
        if isinstance(linear, torch.nn.Linear) and name != "lm_head":  # 4-bit NF4 on the CPU (bitsandbytes >= 0.50)
            four = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False, quant_type="nf4")
            four.load_state_dict(linear.state_dict())
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, four.to("cpu"))
    adapted = add_adapter(model, "lora", generating=True)
    with pytest.raises(SetupError, match=r"4-bit.*CUDA.*Fix: export on the CUDA machine"):
        merge_adapter(adapted)


def test_the_merged_export_carries_the_folders_whole_tokenizer(
    tmp_path: Path, cpu_hw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """export_merged's folder is what a user ships: its tokenizer is the model folder's as AutoTokenizer loads it,
    the chat template included (transformers 5 saves it beside tokenizer_config.json, as chat_template.jinja)."""
    from types import SimpleNamespace

    import transformers as tf

    from kitlib.engine import checkpoint
    from kitlib.models.bpe import train_bpe_tokenizer
    from kitlib.models.lora import add_adapter
    from kitlib.notebook import training

    model, _ = _tiny("gpt2")
    folder, run_dir = tmp_path / "gpt2-folder", tmp_path / "work" / "run"
    model.save_pretrained(folder)  # type: ignore[operator]
    tokenizer = train_bpe_tokenizer(["a tiny folder", "with a chat template"], vocab_size=64, add_eos=False)
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    tokenizer.save_pretrained(folder)
    # the file the export has to carry (before transformers 4.5x the template sat inside tokenizer_config.json)
    config = (folder / "tokenizer_config.json").read_text()
    assert (folder / "chat_template.jinja").is_file() or "chat_template" in config
    adapted = add_adapter(tf.GPT2LMHeadModel.from_pretrained(folder), "lora", generating=True)
    checkpoint.write(checkpoint.snapshot(adapted), run_dir / "best")
    p = SimpleNamespace(model=str(folder), run_dir=run_dir, folds=1)  # what 00-02 leave: the params, features and model
    monkeypatch.setattr(training, "load_params", lambda work_dir: p)
    monkeypatch.setattr(training, "load_features", lambda p: SimpleNamespace(run=SimpleNamespace(
        config=SimpleNamespace(adapter="lora"))))  # fmt: skip
    monkeypatch.setattr(training, "prepare", lambda p, feats, hw: SimpleNamespace(model=adapted))

    out = training.export_merged(tmp_path / "work", tmp_path / "merged", cpu_hw)
    shipped, original = tf.AutoTokenizer.from_pretrained(out), tf.AutoTokenizer.from_pretrained(folder)
    assert shipped.get_vocab() == original.get_vocab()
    messages = [{"role": "user", "content": "hi"}]
    assert shipped.chat_template == original.chat_template
    assert shipped.apply_chat_template(messages, tokenize=False) == "<user>hi"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOBS), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
def test_a_killed_lora_run_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    full = _run("lora_resume", str(tmp_path / "full"), "0", "0")
    assert full.returncode == 0, full.stderr[-3000:]
    kill_at = random.Random().randint(5, 14)  # 16 steps, last/ every 2
    killed = _run("lora_resume", str(tmp_path / "cut"), str(kill_at), "0")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    meta = json.loads((tmp_path / "cut" / "last" / "meta.json").read_text())
    assert 0 < meta["step"] <= kill_at, (meta, kill_at)
    from safetensors.torch import load_file

    assert all("lora_" in k for k in load_file(tmp_path / "cut" / "last" / "model.safetensors"))  # adapter only
    resumed = _run("lora_resume", str(tmp_path / "cut"), "0", "1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = torch.load(tmp_path / "full" / "final.pt"), torch.load(tmp_path / "cut" / "final.pt")
    assert any("lora_" in name for name in expected)
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), f"{name} differs after kill at step {kill_at} and resume"


def test_qlora_off_cuda_is_refused_in_00_naming_lora(tmp_path: Path, cpu_hw: Any) -> None:
    from demos.reviews import make_demo
    from kitlib.errors import SetupError
    from kitlib.notebook import presets, stages

    with pytest.raises(SetupError, match=r"CUDA.*Fix: adapter = 'lora'"):
        presets.resolve("smoke", cpu_hw, overrides={"adapter": "qlora"})
    demo = make_demo(tmp_path / "demo")
    with pytest.raises(SetupError, match=r"Fix: adapter = 'lora'"):  # a classifier: 4-bit weights not offered
        stages.params(data_dir=demo.root, work_dir=tmp_path / "work", model="tiny", adapter="qlora")
    with pytest.raises(SetupError, match=r"adapter = 'bogus' is not one of \['none', 'lora', 'qlora'\]"):
        stages.params(data_dir=demo.root, work_dir=tmp_path / "work", adapter="bogus")
    assert not (tmp_path / "work" / "run.json").exists()
    run = presets.resolve("balanced", cpu_hw, overrides={"adapter": "lora"})  # LoRA runs anywhere
    assert (run.config.adapter, run.config.freeze) == ("lora", "none")


def test_lora_trains_at_the_adapters_lr_once_and_a_users_lr_wins(tmp_path: Path, cpu_hw: Any) -> None:
    """The presets' lrs are full fine-tuning's (1e-4 at balanced); adapters take at least LORA_LR (2e-4, the peers'
    usual), said in one line; an lr the user sets is kept; 00's setup (the task's preset, then resolve again) applies
    it once."""
    from demos.reviews import make_demo
    from kitlib.models.adapters import LORA_LR
    from kitlib.notebook import presets, stages

    for name in presets.PRESETS:
        if presets.PRESETS[name].regime != "finetune":
            continue
        full, lora = presets.resolve(name, cpu_hw), presets.resolve(name, cpu_hw, overrides={"adapter": "lora"})
        assert lora.config.lr == max(full.config.lr, LORA_LR), name
        said = [r for r in lora.reasons if "for the adapters" in r]
        assert len(said) == (full.config.lr < LORA_LR) and lora.preset.lr == full.preset.lr, (name, said)
    balanced = presets.resolve("balanced", cpu_hw, overrides={"adapter": "lora"})
    assert balanced.config.lr == 2e-4 and "lr 0.0002 for the adapters (the preset's 0.0001" in balanced.summary()
    own = presets.resolve("balanced", cpu_hw, overrides={"adapter": "lora", "lr": 5e-5})
    assert own.config.lr == 5e-5 and not any("for the adapters" in r for r in own.reasons)

    demo = make_demo(tmp_path / "demo")
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "work", model="tiny", adapter="lora")
    stages.setup(p, cpu_hw)
    saved = stages.features(p, hw=cpu_hw, quiet=True).run  # 01's one resolution of 00's choice
    assert saved.config.lr == 2e-4 and sum("for the adapters" in r for r in saved.reasons) == 1
    p = stages.params(data_dir=demo.root, work_dir=tmp_path / "own", model="tiny", adapter="lora", lr=3e-5)
    choice = stages.setup(p, cpu_hw)
    assert stages.resolve_run(p, cpu_hw, preset=choice.preset, overrides=choice.overrides).config.lr == 3e-5


def sft_demo_and_model_folder(root: Path, *, n_train: int, n_test: int) -> tuple[Any, Path]:
    """The SFT demo under ``root/data`` and a tiny GPT-2 folder (``root/gpt2-folder``) with a BPE tokenizer trained
    on its prompts and responses; skips when the demo's data is not installed."""
    import pandas as pd

    from demos import DemoDataMissing
    from demos.sft import make_sft_demo
    from kitlib.models.bpe import train_bpe_tokenizer
    from kitlib.models.causal_lm import tiny_causal_lm

    try:
        demo = make_sft_demo(root / "data", n_train=n_train, n_test=n_test)
    except DemoDataMissing as err:
        pytest.skip(str(err))
    train = pd.read_csv(demo.train, keep_default_na=False, dtype={"response": str})
    tokenizer = train_bpe_tokenizer([*train["prompt"], *train["response"]], vocab_size=400, add_eos=False)
    folder = root / "gpt2-folder"
    tiny_causal_lm(tokenizer, seed=1, n_positions=256).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return demo, folder


# LoRA's must-show 3 (best/ holds the adapter only, 03's model is the folder plus it, the merged export computes what
# 03's does) runs on test_causal_lm's SFT route: one four-notebook run of a causal-LM folder with LoRA, not two.


def test_an_old_transformers_refusing_cpu_4bit_gets_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 4.46-4.50 (Kaggle/Colab 2025) crash in their bitsandbytes check on a CPU-only machine
    ("'frozenset' object has no attribute 'discard'"): the CPU 4-bit load says so with the fix instead."""
    pytest.importorskip("bitsandbytes")
    import transformers.integrations.bitsandbytes as bnb_integration

    from kitlib.errors import SetupError
    from kitlib.models.adapters import quantization

    def crash(raise_exception: bool = False) -> bool:
        frozenset({"cpu"}).discard("cpu")  # type: ignore[attr-defined]
        return True

    monkeypatch.setattr(bnb_integration, "validate_bnb_backend_availability", crash, raising=False)
    with pytest.raises(SetupError, match=r"pip install -U transformers.*adapter = 'lora'"):
        quantization("qlora", "cpu")
