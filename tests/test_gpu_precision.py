"""What breaks on a real GPU, shown on a CPU (issue 18): half-precision checkpoints (fp32 master weights through
every loader, and a guard in fit), compile on GPUs too old for Triton, the torch builds' GPU architectures, and a
Kaggle chain whose 01 runs on another machine than the one 00 planned for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib.config import TrainConfig
from kitlib.engine.loop import fit
from kitlib.errors import CompileError, PrecisionError, UnsupportedGPUError
from kitlib.machine.hardware import (
    ARCH_LIST_WITH_SM60,
    build_arch_list,
    check_compile,
    check_torch_supports,
    fake_profile,
)

HALF = [torch.float16, torch.bfloat16]
TINY_BERT = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 32}  # fmt: skip


# --------------------------------------------------------------------------------------- 3: half-precision checkpoints
def _save(model: nn.Module, folder: Path, dtype: torch.dtype, tokenizer: Any = None) -> Path:
    """``model`` saved in ``dtype`` as a user's model folder would be (config.json says so, weights are half)."""
    model.to(dtype).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _bert_folder(tmp_path: Path, dtype: torch.dtype) -> Path:
    from transformers import BertConfig, BertModel

    from kitlib.models.loading import train_wordpiece_tokenizer

    tokenizer = train_wordpiece_tokenizer(["a great film", "a dull film"] * 8, vocab_size=TINY_BERT["vocab_size"])
    torch.manual_seed(0)
    return _save(BertModel(BertConfig(**TINY_BERT)), tmp_path / f"bert-{dtype}", dtype, tokenizer)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}


def _changed(before: dict[str, torch.Tensor], model: nn.Module) -> float:
    """The fraction of trainable weights whose value changed."""
    after = _weights(model)
    changed = sum(int((after[n] != w).sum()) for n, w in before.items())
    return changed / sum(w.numel() for w in before.values())


def _token_batches(model: nn.Module, *, labels: str, n: int = 32, width: int = 8) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, TINY_BERT["vocab_size"], (n, width), generator=g)
    target = ids.clone() if labels == "tokens" else torch.randint(0, 2, (n,), generator=g)

    class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": ids[i], "attention_mask": torch.ones(width, dtype=torch.long), "labels": target[i]}

    return DataLoader(Rows(), batch_size=8)


def _train_changes(model: nn.Module, loader: DataLoader[Any], hw: Any, precision: str = "fp32") -> float:
    """Train a few AdamW steps at lr 2e-5 (a fine-tuning lr); the fraction of the weights they changed."""
    before = _weights(model)
    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=2e-5, precision=precision, save_best=False)  # type: ignore[arg-type]
    fit(model, loader, config=cfg, hw=hw)
    return _changed(before, model)


def _loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[torch.dtype], nn.Module]]:
    """Every way kitlib loads a model folder, each given a folder saved in the dtype it is called with."""
    from transformers import (
        AutoTokenizer,
        GPT2Config,
        GPT2LMHeadModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    from kitlib.models import loading
    from kitlib.notebook.handoff import SideInputs
    from kitlib.notebook.tasks import causal_lm, seq2seq

    def text_classifier(dtype: torch.dtype) -> nn.Module:  # auto/classify/regress in 01, and a user's folder
        return loading.load_text_classifier(2, model_dir=_bert_folder(tmp_path, dtype))[1]

    def mean_pooled(dtype: torch.dtype) -> nn.Module:  # a sentence-transformers folder: MeanPoolClassifier
        folder = _bert_folder(tmp_path, dtype)
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
        return loading.load_classifier(2, vocab_size=64, pad_token_id=0, model_dir=folder)

    def classifier_02(dtype: torch.dtype) -> nn.Module:  # what 02/03 (and tabular-text's text model) rebuild
        return loading.load_classifier(2, vocab_size=64, pad_token_id=0, model_dir=_bert_folder(tmp_path, dtype))

    def encoder(dtype: torch.dtype) -> nn.Module:  # the head regime's frozen encoder (01's embedding pass)
        return loading.load_text_encoder(model_dir=_bert_folder(tmp_path, dtype))[1]

    def seq2seq_folder(dtype: torch.dtype) -> nn.Module:
        config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                          decoder_start_token_id=0)  # fmt: skip
        folder = _save(T5ForConditionalGeneration(config), tmp_path / f"t5-{dtype}", dtype)
        tokenizer_folder = _bert_folder(tmp_path / "tok", dtype)
        AutoTokenizer.from_pretrained(tokenizer_folder).save_pretrained(folder)
        labels = np.array([[5, 6, 1], [7, 1, -100]])  # two targets' token ids (</s> = 1, -100 = padding)
        model: nn.Module = seq2seq._build_model(SideInputs(state={"model_folder": str(folder)}), 0, labels)
        return model

    def causal_lm_folder(dtype: torch.dtype) -> nn.Module:
        config = GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32)
        folder = _save(GPT2LMHeadModel(config), tmp_path / f"gpt2-{dtype}", dtype)
        AutoTokenizer.from_pretrained(_bert_folder(tmp_path / "tok2", dtype)).save_pretrained(folder)
        model: nn.Module = causal_lm._folder_model(str(folder))[1]
        return model

    def custom_factory(dtype: torch.dtype) -> nn.Module:  # a user's model_factory that loads a half checkpoint
        from kitlib.notebook.tasks import custom
        from kitlib.notebook.tasks.base import Context
        from kitlib.notebook.tasks.custom import CustomTask

        folder = _bert_folder(tmp_path, dtype)
        module = tmp_path / f"factory_{str(dtype)[6:]}.py"
        # in half precision: transformers 5 loads the saved dtype by default, 4.x fp32 unless asked
        (keyword,) = loading.dtype_kwarg(dtype)
        module.write_text(
            "import torch\nfrom transformers import BertForSequenceClassification\n"
            f"def build(vocab_size, num_labels, pad_id):\n"
            f"    return BertForSequenceClassification.from_pretrained({str(folder)!r}, num_labels=num_labels, "
            f"{keyword}={dtype})\n"
        )

        @dataclasses.dataclass
        class Feats:  # what CustomTask.prepare reads of the saved features
            side: SideInputs
            vocab_size: int = 64
            pad_id: int = 0
            spec: Any = dataclasses.field(default_factory=lambda: type("T", (), {"num_labels": 2})())

        feats = Feats(SideInputs(state={"model_factory": f"{module}:build"}))
        # The loaders read the saved tokens, which this test has none of (nor the forward check that runs on them):
        # the model's dtype is what it is about.
        monkeypatch.setattr(CustomTask, "loaders", lambda self, ctx: (None, None, None))
        monkeypatch.setattr(custom, "_check_output", lambda *args: None)
        split = (np.arange(2), np.arange(1))
        model: nn.Module = CustomTask().prepare(Context(feats, None, split, 0)).model  # type: ignore[arg-type]
        return model

    return {
        "text_classifier": text_classifier,
        "mean_pooled": mean_pooled,
        "classifier_02": classifier_02,
        "encoder": encoder,
        "seq2seq": seq2seq_folder,
        "causal_lm": causal_lm_folder,
        "custom": custom_factory,
    }


LOADERS = ["text_classifier", "mean_pooled", "classifier_02", "encoder", "seq2seq", "causal_lm", "custom"]


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_gives_fp32_master_weights_for_a_half_checkpoint(
    loader: str,
    dtype: torch.dtype,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _loaders(tmp_path, monkeypatch)[loader](dtype)
    dtypes = {p.dtype for p in model.parameters()}
    assert dtypes == {torch.float32}, f"{loader} kept {dtypes}"
    short = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    said = [line for line in capsys.readouterr().out.splitlines() if "fp32 master weights" in line]
    assert len(said) == 1 and f"saved in {short}" in said[0]  # one line says what happened


def test_a_bf16_checkpoint_learns_with_fp32_master_weights(tmp_path: Path, cpu_hw: Any) -> None:
    # On main a bf16 folder trained bf16 weights: 4 AdamW steps at lr 2e-5 changed 27% of this tiny model's weights
    # (the rest: updates below bf16's resolution, lost). fp32 master weights move (nearly) every one. (fp16's finer
    # mantissa keeps these updates; its failure is the GradScaler's, in the next test.)
    from kitlib.models.loading import load_text_classifier

    model = load_text_classifier(2, model_dir=_bert_folder(tmp_path, torch.bfloat16))[1]
    assert _train_changes(model, _token_batches(model, labels="class"), cpu_hw) > 0.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_half_folder_trains_bit_for_bit_as_its_fp32_twin(dtype: torch.dtype, tmp_path: Path, cpu_hw: Any) -> None:
    # The weights of a half folder change as an fp32 run's do: its twin holds the same values in fp32 (every half
    # value is exact in fp32), so with fp32 master weights the two runs are one computation, equal bit for bit.
    from transformers import AutoTokenizer, BertModel

    from kitlib.models.loading import dtype_kwarg, load_text_classifier

    half = _bert_folder(tmp_path, dtype)
    twin = tmp_path / "fp32-twin"
    BertModel.from_pretrained(half, **dtype_kwarg(torch.float32)).save_pretrained(twin)
    AutoTokenizer.from_pretrained(half).save_pretrained(twin)
    models = []
    for folder in (half, twin):
        torch.manual_seed(1)  # the classifier head's initialisation
        models.append(load_text_classifier(2, model_dir=folder)[1])
    before = [_weights(m) for m in models]
    assert before[0].keys() == before[1].keys()
    assert all(torch.equal(before[0][n], before[1][n]) for n in before[0])
    changed = [_train_changes(m, _token_batches(m, labels="class"), cpu_hw) for m in models]
    assert changed[0] > 0.5 and changed[0] == changed[1]
    after = [_weights(m) for m in models]
    assert all(torch.equal(after[0][n], after[1][n]) for n in after[0])


def test_an_fp16_checkpoint_trains_under_the_grad_scaler(tmp_path: Path) -> None:
    # fp16 autocast + GradScaler, the T4 path, runs on a CPU with AVX512-FP16 (torch.amp.GradScaler("cpu")). On main
    # the fp16 folder's fp16 gradients stopped it: "ValueError: Attempting to unscale FP16 gradients."
    from kitlib.machine.precision import decide_precision
    from kitlib.models.loading import load_text_classifier

    hw = fake_profile("CPU-AMX", platform="local", interactive=False)
    assert decide_precision(hw, "fp16").use_grad_scaler
    model = load_text_classifier(2, model_dir=_bert_folder(tmp_path, torch.float16))[1]
    assert _train_changes(model, _token_batches(model, labels="class"), hw, precision="fp16") > 0.5


def _regression(n: int = 32) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=8)


def _mse(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x).float(), y)


@pytest.mark.parametrize(
    ("dtype", "profile", "precision"),
    [(torch.bfloat16, "CPU", "fp32"), (torch.float16, "CPU-AMX", "fp16")],
    ids=["bf16", "fp16"],
)
def test_fit_refuses_half_trainable_weights_naming_the_fix(dtype: torch.dtype, profile: str, precision: str) -> None:
    # What a model fit() did not load gets: on main bf16 weights trained silently without learning, and fp16 ones
    # under the GradScaler failed with torch's "Attempting to unscale FP16 gradients".
    model = nn.Linear(4, 1).to(dtype)
    cfg = TrainConfig(epochs=1, micro_batch_size=8, precision=precision, save_best=False)  # type: ignore[arg-type]
    with pytest.raises(PrecisionError, match=r"model\.float\(\).*optimizer='adamw-kahan'"):
        fit(model, _regression(), config=cfg, loss_fn=_mse, hw=fake_profile(profile, platform="local"))

    class FrozenHalf(nn.Module):  # half weights that are frozen are never updated: nothing to refuse
        def __init__(self) -> None:
            super().__init__()
            self.frozen, self.head = nn.Linear(4, 4).to(dtype).requires_grad_(False), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.frozen(x.to(dtype)).float())

    fit(FrozenHalf(), _regression(), config=dataclasses.replace(cfg, precision="fp32"), loss_fn=_mse,
        hw=fake_profile("CPU", platform="local"))  # fmt: skip


# ------------------------------------------------------------------------------------------ 8: compile on old GPUs
def test_compile_is_refused_on_a_gpu_too_old_for_triton() -> None:
    p100 = fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60)  # a torch that runs on it at all
    with pytest.raises(CompileError, match=r"sm_60.*7\.0.*compile=False"):
        check_compile(p100)
    cfg = TrainConfig(epochs=1, micro_batch_size=8, compile=True, save_best=False)
    with pytest.raises(CompileError):  # in fit, before any work (on main: Triton's BackendCompilerFailed mid-step)
        fit(nn.Linear(4, 1), _regression(), config=cfg, loss_fn=_mse, hw=p100)
    from kitlib.notebook.presets import resolve

    with pytest.raises(CompileError):  # and in 00, when the picker asks for it
        resolve("balanced", p100, overrides={"compile": True})


def test_compile_on_turing_and_volta_says_what_it_gains() -> None:
    for name in ("T4", "2xT4", "V100"):
        note = check_compile(fake_profile(name))
        assert "tensor cores" in note and "reasoned, not measured" in note
    for name in ("A100", "L4", "H100", "CPU", "MPS"):
        assert check_compile(fake_profile(name)) == ""
    from kitlib.notebook.presets import resolve

    run = resolve("balanced", fake_profile("2xT4"), overrides={"compile": True})
    assert any(r.startswith("compile: compile on Tesla T4 (sm_75)") for r in run.reasons)


# ---------------------------------------------------------------------------------------- 13: architecture facts
@pytest.mark.parametrize(
    ("build", "sm60", "sm70", "sm75"),
    [
        ("2.10.0+cu128", False, True, True),  # Kaggle's image: Volta kept, Pascal gone
        ("2.11.0+cu128", False, False, True),  # Volta dropped from cu128 (pytorch/pytorch#172352)
        ("2.13.0+cu129", False, False, True),
        ("2.13.0+cu130", False, False, True),
        ("2.14.0+cu126", True, True, True),  # cu126 keeps Pascal and Volta
    ],
)
def test_build_arch_lists(build: str, sm60: bool, sm70: bool, sm75: bool) -> None:
    from kitlib.machine.hardware import torch_supports

    archs = build_arch_list(build)
    assert [torch_supports(cap, archs) for cap in ((6, 0), (7, 0), (7, 5))] == [sm60, sm70, sm75]
    for name, ok in (("P100", sm60), ("V100", sm70), ("T4", sm75)):
        hw = fake_profile(name, torch_version=build)
        assert hw.torch_cuda_arch_list == archs
        if ok:
            check_torch_supports(hw)
        else:
            with pytest.raises(UnsupportedGPUError, match="cu126"):
                check_torch_supports(hw)


def test_an_unknown_arch_list_falls_back_to_the_build_table() -> None:
    v100 = dataclasses.replace(fake_profile("V100", torch_version="2.11.0+cu128"), torch_cuda_arch_list=())
    with pytest.raises(UnsupportedGPUError, match="sm_70"):
        check_torch_supports(v100)
    check_torch_supports(dataclasses.replace(v100, torch_version="2.11.0", cuda_version="12.4"))  # not in the table


def test_the_unsupported_gpu_message_names_kaggle_only_on_kaggle() -> None:
    with pytest.raises(UnsupportedGPUError) as kaggle:
        check_torch_supports(fake_profile("P100"))
    assert "GPU T4 x2" in str(kaggle.value)
    for platform in ("colab", "local"):
        with pytest.raises(UnsupportedGPUError) as err:
            check_torch_supports(fake_profile("P100", platform=platform))  # type: ignore[arg-type]
        assert "Kaggle" not in str(err.value) and "T4 x2" not in str(err.value)
        assert "sm_60" in str(err.value) and "whl/cu126" in str(err.value)


# ----------------------------------------------------------------------------- 4: a Kaggle chain plans per stage
def _competition(folder: Path, n_train: int = 200, n_test: int = 40) -> Path:
    import pandas as pd

    folder.mkdir(parents=True)
    words = ("great", "lovely", "superb", "awful", "dull", "boring")
    n = n_train + n_test
    frame = pd.DataFrame(
        {
            "id": [f"r{i}" for i in range(n)],
            "text": [f"a {words[i % 6]} film " + "long " * (i % 5) for i in range(n)],
            "label": [("pos", "neg")[i % 6 // 3] for i in range(n)],
        }
    )
    frame.iloc[:n_train].to_csv(folder / "train.csv", index=False)
    frame.iloc[n_train:][["id", "text"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[n_train:][["id"]].assign(label="pos").to_csv(folder / "sample_submission.csv", index=False)
    return folder


@pytest.mark.parametrize("preset", ["smoke", "fast", "balanced"])
def test_a_cpu_01_featurises_a_run_planned_for_2xt4(preset: str, tmp_path: Path) -> None:
    # The chain `kaggle build` writes: 00 and 01 on CPU kernels plan for 02's T4 x2 (fp16). On main `fast` failed in
    # 01 with "PrecisionError: fp16 on this CPU ... is emulated": its embedding pass used 02's precision.
    from kitlib.notebook import stages

    p = stages.params(data_dir=_competition(tmp_path / "data"), work_dir=tmp_path / "work", preset=preset,
                      model="tiny", hardware="2xT4")  # fmt: skip
    cpu = fake_profile("CPU", interactive=False)
    run = stages.resolve_run(p, cpu, choice=stages.setup(p, cpu))
    assert run.config.precision == "fp16" and "Tesla T4" in run.hardware  # the plan is 02's
    feats = stages.features(p, hw=cpu, quiet=True)
    assert feats.run.config.precision == "fp16"
    assert (feats.embeddings is not None) is (preset == "fast")


def test_the_stage_precision_is_the_request_where_it_can_run() -> None:
    from kitlib.machine.precision import decide_stage_precision

    cpu, t4 = fake_profile("CPU"), fake_profile("T4")
    assert decide_stage_precision(t4, "fp16").dtype == "fp16"
    assert decide_stage_precision(t4, "fp32").dtype == "fp32"  # a request this machine can run is kept
    plan = decide_stage_precision(cpu, "fp16")
    assert plan.dtype == "fp32" and "fp16 is for the machine 00 planned for" in plan.reason
    with pytest.raises(UnsupportedGPUError):  # no precision helps a GPU torch has no kernels for
        decide_stage_precision(fake_profile("P100"), "fp16")


@pytest.mark.parametrize(("preset", "gpu"), [("fast", [0, 1, 1, 1]), ("balanced", [0, 0, 1, 1]), (None, [0, 0, 1, 1])])
def test_kaggle_build_asks_for_the_gpu_where_a_stage_computes(
    preset: str | None, gpu: list[int], tmp_path: Path
) -> None:
    # fast's 01 runs MiniLM over every row, its one heavy computation; on main it ran on the CPU kernel.
    from kitlib.cli import main

    args = ["kaggle", "build", "--username", "me", "--competition", "comp", "--out", str(tmp_path / "k")]
    assert main([*args, *(["--preset", preset] if preset else [])]) == 0
    import json

    metas = [json.loads((tmp_path / "k" / n / "kernel-metadata.json").read_text()) for n in sorted(
        p.name for p in (tmp_path / "k").iterdir())]  # fmt: skip
    assert [int(m["enable_gpu"]) for m in metas] == gpu
    assert all(m.get("machine_shape") == ("NvidiaTeslaT4" if m["enable_gpu"] else None) for m in metas)
