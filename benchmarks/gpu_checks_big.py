"""The GPU suite's checks for the big-model routes (issue #30): LoRA, QLoRA, 8-bit and Kahan AdamW, the chunked loss,
out-of-memory back-off and gradient checkpointing, each on a tiny Llama built from a config (no download).

Each claim is what the feature must do, so a broken feature fails its check: the frozen weights stay bit for bit,
the trained ones move and the loss on the memorised batches falls, the optimizer keeps the state it promises, the
chunked loss equals the model's own, a back-off replays the step at half the micro-batch, checkpointing saves memory.
bitsandbytes (and torch-optimi) may be missing on the device: ``need`` installs the wheel carried in
``.gpu_wheels/`` (repository root, ignored) with ``--no-deps --no-index``, else the check skips with the reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from gpu_checks_base import Check, Ctx
from gpu_models import cuda, device, llama, lm_batches, loader, memory, reset_memory

from kitlib import Callback

WHEELS = Path(__file__).resolve().parent.parent / ".gpu_wheels"
VOCAB = 8000  # gpu_models.llama's vocabulary


def need(ctx: Ctx, module: str, dist: str) -> None:
    """``module`` importable: from the carried ``.gpu_wheels/<dist>-*.whl`` when it is not installed, else skip."""
    if importlib.util.find_spec(module) is not None:
        return
    wheels = sorted(WHEELS.glob(f"{dist}-*.whl"))
    if not wheels:
        ctx.skip(f"{module} is not installed and no {WHEELS.name}/{dist}-*.whl was carried to install it from")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels[-1])],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"pip install {wheels[-1].name} failed: {(done.stderr or done.stdout)[-600:]}")
    importlib.invalidate_caches()
    ctx.note(f"{module} installed from the carried {wheels[-1].name}")


def _cfg(**values: Any) -> Any:
    from kitlib import TrainConfig

    base: dict[str, Any] = {"epochs": 1, "lr": 1e-3, "save_best": False, "warmup_ratio": 0.0, "log_every_steps": 1,
                            "schedule": "constant", "grad_clip": 1.0}  # fmt: skip
    return TrainConfig(**{**base, **values})


class _Keep(Callback):
    """The loop, for the check to read its optimizer and back-off after fit."""

    loop: Any = None

    def on_fit_start(self, loop: Any) -> None:
        self.loop = loop


def _loss(model: Any, batches: list[dict[str, Any]]) -> float:
    """The model's mean loss over ``batches`` on its own device, in eval mode (no dropout)."""
    dev = next(p.device for p in model.parameters())
    model.eval()
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        total = sum(float(model(**{k: v.to(dev) for k, v in b.items()}).loss) for b in batches)
    model.train()
    return total / len(batches)


def _patterns(n: int, rows: int, length: int) -> list[dict[str, Any]]:
    """Causal-LM batches with a rule to learn (each token is the last one plus a row's stride), so a few steps of
    adapters on a tiny model lower the loss well below random tokens' ln(vocab)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        start, stride = torch.randint(0, VOCAB, (rows, 1), generator=g), torch.randint(1, 4, (rows, 1), generator=g)
        ids = (start + stride * torch.arange(length)) % VOCAB
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _snapshot(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _moved(before: dict[str, torch.Tensor], model: Any, keys: Any) -> tuple[int, int]:
    """(how many of ``keys`` changed at all, how many there are) between ``before`` and ``model``'s state."""
    after = model.state_dict()
    keys = [k for k in keys if k in before]
    changed = sum(not torch.equal(before[k], after[k].detach().cpu()) for k in keys)
    return changed, len(keys)


def _train_adapter(ctx: Ctx, model: Any, adapter: str, batches: list[dict[str, Any]], **cfg: Any) -> None:
    """fit ``model`` (a PeftModel) over ``batches`` for a few epochs; claims: the adapters move, the frozen base does
    not, only the adapters are what a checkpoint holds, and the loss on the memorised batches falls."""
    from kitlib import fit
    from kitlib.models.adapters import adapter_keys

    keys = adapter_keys(model) or ()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    before = _snapshot(model)
    frozen = [k for k in before if k not in trained]
    start = _loss(model.to(device()), batches)
    result = fit(model, loader(batches), config=_cfg(epochs=ctx.size(4, 8), **{"lr": 1e-2, **cfg}))
    end = ctx.figure("loss", {"before": round(start, 4), "after": round(_loss(result.model, batches), 4)})["after"]
    moved, total = _moved(before, result.model, keys)
    still, _ = _moved(before, result.model, frozen)
    ctx.figure("adapter_tensors", {"moved": moved, "of": total, "frozen_tensors": len(frozen), "frozen_moved": still})
    ctx.figure("precision", result.precision.dtype)
    ctx.figure("memory", memory())
    ctx.claim(total > 0 and set(keys) == trained, f"{adapter}: a checkpoint holds exactly the trained tensors")
    ctx.claim(moved == total, f"{adapter}: every adapter tensor moved ({moved} of {total})")
    ctx.claim(still == 0, f"{adapter}: the frozen base stayed bit for bit ({still} of {len(frozen)} moved)")
    # a random-init base is near-uniform (logits ~0) and stays frozen: the adapters move the loss slowly (CPU, lr 1e-2,
    # 16 steps: 9.000 -> 8.935); a broken route leaves it where it was
    ctx.claim(end < start - 0.02, f"{adapter}: the loss on the memorised batches fell ({start:.3f} -> {end:.3f})")


# ------------------------------------------------------------------------------------------------- LoRA, QLoRA
def check_lora(ctx: Ctx) -> None:
    from kitlib.models.lora import add_adapter

    model = add_adapter(llama(ctx.quick, hidden=256, layers=4), "lora", generating=True)
    _train_adapter(ctx, model, "lora", _patterns(4, 8, ctx.size(32, 128)))


def check_qlora(ctx: Ctx) -> None:
    """The notebooks' QLoRA route on a bf16 GPU: a 4-bit NF4 load through kitlib.models.loading, adapters added with
    the bf16 base dtype 02 uses there (issue #30 item 1), trained by fit, and rank 0's trained tensors restored into
    a fresh 4-bit model as the DDP parent does (item 2). On a CPU: bitsandbytes' CPU backend, fp32 (plumbing)."""
    need(ctx, "bitsandbytes", "bitsandbytes")
    from transformers import AutoModelForCausalLM

    from kitlib.engine import checkpoint
    from kitlib.models import adapters, lora
    from kitlib.models.loading import from_pretrained

    folder = ctx.scratch / "llama"
    llama(ctx.quick, hidden=256, layers=4).save_pretrained(folder)
    where = "cuda" if cuda() else "cpu"  # a CPU: bitsandbytes' CPU backend, as a rehearsal runs it (plumbing only)
    kwargs = adapters.quantization("qlora", where)
    compute = kwargs["quantization_config"].bnb_4bit_compute_dtype
    native_bf16 = cuda() and torch.cuda.is_bf16_supported(including_emulation=False)
    ctx.figure("compute_dtype", str(compute))
    ctx.figure("device_map", str(kwargs.get("device_map")))
    want = torch.bfloat16 if native_bf16 else torch.float16 if cuda() else torch.float32
    ctx.claim(compute == want, f"4-bit compute dtype {want}: bf16 exactly where bf16 is native (fp16 on a T4)")

    def load() -> Any:
        return from_pretrained(AutoModelForCausalLM, folder, **adapters.quantization("qlora", where))

    base = load()
    four_bit = [n for n, p in base.named_parameters() if type(p).__name__ == "Params4bit"]
    ctx.figure("four_bit_tensors", len(four_bit))
    linear = 7 * base.config.num_hidden_layers  # q k v o gate up down per block
    ctx.claim(len(four_bit) == linear, f"every linear layer of the blocks is 4-bit ({len(four_bit)} of {linear})")
    half = torch.bfloat16 if native_bf16 else None  # what 02 passes on a bf16 GPU (training.prepare)
    try:
        model = lora.add_adapter(base, "qlora", generating=True, base_dtype=half)
    except Exception as e:  # item 1: transformers refuses .to(dtype) on a bitsandbytes model
        ctx.claim(False, f"add_adapter(4-bit model, 'qlora', base_dtype={half}) works ({type(e).__name__}: {e})")
        return
    ctx.claim(True, f"add_adapter(4-bit model, 'qlora', base_dtype={half}) works")
    batches = _patterns(4, 8, ctx.size(32, 128))
    _train_adapter(ctx, model, "qlora", batches)
    # item 2: a DDP worker sends the adapter's tensors; the parent rebuilds the 4-bit model and restores them
    sent = checkpoint.saved_state(model)
    ctx.figure("sent_tensors", len(sent))
    ctx.claim(not any("absmax" in k or "quant_" in k for k in sent), "no bitsandbytes quant state crosses")
    fresh = lora.add_adapter(load(), "qlora", generating=True, base_dtype=half, seed=1)
    try:
        checkpoint.restore_model(fresh, checkpoint.Snapshot({k: v.cpu() for k, v in sent.items()}, None, {}))
    except Exception as e:
        ctx.claim(False, f"a fresh 4-bit model loads rank 0's trained tensors ({type(e).__name__}: {str(e)[:200]})")
        return
    gap = abs(_loss(fresh, batches) - _loss(model, batches))
    ctx.claim(gap < 1e-3, f"the reloaded model computes the trained one's loss (differs by {gap:.2e})")


# ------------------------------------------------------------------------------------------------- optimizers
def check_adamw8bit(ctx: Ctx) -> None:
    """fit with optimizer='adamw8bit': bitsandbytes' AdamW8bit, 8-bit moments for the big tensors, the model learns."""
    need(ctx, "bitsandbytes", "bitsandbytes")
    from kitlib import fit

    keep, batches = _Keep(), _patterns(4, 8, ctx.size(32, 128))
    model = llama(ctx.quick, hidden=256, layers=4)
    start = _loss(model.to(device()), batches)
    result = fit(model, loader(batches), config=_cfg(epochs=ctx.size(4, 8), optimizer="adamw8bit"), callbacks=[keep])
    end = _loss(result.model, batches)
    opt = keep.loop.optimizer
    kinds = {str(s.get("state1", torch.empty(0)).dtype) for s in opt.state.values()}
    big = [p for p in result.model.parameters() if p.numel() >= 4096]
    eight = sum(opt.state[p]["state1"].dtype == torch.uint8 for p in big if p in opt.state)
    ctx.figure("optimizer", type(opt).__module__ + "." + type(opt).__name__)
    ctx.figure("state1_dtypes", sorted(kinds))
    ctx.figure("loss", {"before": round(start, 4), "after": round(end, 4)})
    ctx.figure("memory", memory())
    ctx.claim(type(opt).__module__.startswith("bitsandbytes"), "the optimizer that ran is bitsandbytes'")
    ctx.claim(eight == len(big) > 0, f"8-bit first moments for every tensor of 4,096+ elements ({eight} of {len(big)})")
    ctx.claim(end < 0.9 * start, f"the loss on the memorised batches fell ({start:.3f} -> {end:.3f})")


def check_adamw_kahan(ctx: Ctx) -> None:
    """optimizer='adamw-kahan' in a bf16 run: pure bf16 weights whose small updates are kept (Kahan summation).

    At lr 3e-5 an AdamW step (~lr) is below a bf16 weight's rounding step (~1e-4 at 0.02): without Kahan summation
    most updates round away. Measured: the share of the blocks' weights whose bf16 value moved after 12 steps, with
    fp32 masters, with Kahan, and the control: the same fit with optimi's kahan_sum off (on CPU, a plain loop:
    0.75, 0.74 and 0.28)."""
    need(ctx, "optimi", "torch_optimi")
    if not cuda():
        ctx.skip("a bf16 run: kitlib refuses bf16 on a CPU without AMX (emulated, ~57x slower); unit tests cover it")
    import optimi

    from kitlib import fit

    batches, shares, real = lm_batches(12, 8, 128), {}, optimi.AdamW
    for name, optimizer in (("fp32 masters", "adamw"), ("kahan", "adamw-kahan"), ("control", "adamw-kahan")):
        keep, model = _Keep(), llama(ctx.quick, hidden=256, layers=4)
        init = {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters()}
        if name == "control":  # the same fit, its updates rounded away: optimi's AdamW without Kahan summation
            optimi.AdamW = lambda *a, **k: real(*a, **{**k, "kahan_sum": False})  # type: ignore[misc]
        try:
            cfg = _cfg(lr=3e-5, optimizer=optimizer, precision="bf16")
            result = fit(model, loader(batches), config=cfg, callbacks=[keep])
        finally:
            optimi.AdamW = real  # type: ignore[misc]
        blocks = [(p, init[n]) for n, p in result.model.named_parameters() if "embed" not in n]
        moved = sum(int((p.detach().to(torch.bfloat16).cpu() != i).sum()) for p, i in blocks)
        shares[name] = round(moved / sum(p.numel() for p, _ in blocks), 4)
        if name == "kahan":
            params, opt = list(result.model.parameters()), keep.loop.optimizer
            dtypes = sorted({str(p.dtype) for p in params if p.requires_grad})
            comp = sum(opt.state.get(p, {}).get("kahan_comp") is not None for p in params)
            ctx.figure("kahan", {"weights": dtypes, "with_compensation": comp, "of": len(params)})
            ctx.claim(dtypes == ["torch.bfloat16"], f"the trained weights are pure bf16 ({dtypes})")
            ctx.claim(comp == len(params), f"every weight keeps a Kahan compensation buffer ({comp} of {len(params)})")
    ctx.figure("moved_share", shares)
    fp32, kahan, control = shares["fp32 masters"], shares["kahan"], shares["control"]
    ctx.claim(kahan >= 0.8 * fp32, f"Kahan bf16 weights move like fp32 masters ({kahan:.2f} vs {fp32:.2f} moved)")
    ctx.claim(control < 0.6 * fp32, f"without Kahan most updates round away ({control:.2f}): the check can fail")


# ------------------------------------------------------------------------------------------------- memory savers
def check_chunked_loss(ctx: Ctx) -> None:
    """The chunked loss equals the model's own loss and gradients, and (on a GPU) holds less memory at a 32k vocab."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kitlib.engine.chunked_loss import chunked_lm_loss, hf_loss

    vocab, rows, length = ctx.size((4096, 2, 64), (32000, 8, 1024))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=640, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(config).to(device())
    ids = torch.randint(5, vocab, (rows, length), device=device())
    labels = ids.clone()
    labels[:, : length // 4] = -100  # a prompt the loss skips
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    out = {}
    for name, fn in (("model's own", hf_loss), ("chunked", chunked_lm_loss)):
        model.zero_grad(set_to_none=True)
        reset_memory()
        with torch.autocast(device().type, dtype=torch.bfloat16, enabled=cuda()):
            loss = fn(model, batch)
        loss.backward()
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        out[name] = {"loss": float(loss), "grads": grads, **memory()}
    own, chunked = out["model's own"], out["chunked"]
    gap = abs(own["loss"] - chunked["loss"])
    a, b = own["grads"].double(), chunked["grads"].double()
    cos = float(a @ b / (a.norm() * b.norm()))
    ctx.figure("losses", {"own": round(own["loss"], 5), "chunked": round(chunked["loss"], 5)})
    ctx.figure("grad_cosine", round(cos, 6))
    ctx.claim(gap < 2e-2 * own["loss"], f"the chunked loss equals the model's own (gap {gap:.2e})")
    ctx.claim(cos > 0.999, f"the chunked loss's gradients are the model's own (cosine {cos:.5f})")
    if cuda():
        peaks = {k: v["peak_allocated_mib"] for k, v in out.items()}
        ctx.figure("peak_allocated_mib", peaks)
        ctx.claim(peaks["chunked"] < 0.7 * peaks["model's own"], f"the chunked loss holds less memory ({peaks})")


class _OomAt(torch.nn.Module):
    """Wraps a causal LM: its ``at``-th forward (1-based) raises torch.OutOfMemoryError (injected, as the allocator
    would), the others run; records the rows of every forward."""

    def __init__(self, model: torch.nn.Module, at: int) -> None:
        super().__init__()
        self.model, self.at, self.rows = model, at, []

    def forward(self, **batch: Any) -> Any:
        self.rows.append(len(batch["input_ids"]))
        if len(self.rows) == self.at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the suite)")
        return self.model(**batch)


def check_oom_backoff(ctx: Ctx) -> None:
    """An out-of-memory error in step 2 (injected): fit halves the micro-batch, replays the step, finishes, and ends
    where the same run without the error ends (the replay weights each half by its rows: the same update)."""
    from kitlib import fit

    batches = _patterns(4, 8, ctx.size(32, 128))
    cfg = _cfg(lr=1e-4, micro_batch_size=8, precision="fp32", tf32=False)  # fp32: the two runs comparable to 1e-6
    runs = {}
    for at in (2, 0):  # the forward that fails: step 2's; 0: none
        keep, wrapped = _Keep(), _OomAt(llama(ctx.quick, hidden=256, layers=4), at)
        init = [p.detach().cpu().clone() for p in wrapped.parameters()]
        result = fit(wrapped, loader(batches), config=cfg, callbacks=[keep])
        runs[at] = (result, keep.loop.backoff, wrapped.rows)
    (result, backoff, rows), (clean, _, _) = runs[2], runs[0]
    ctx.figure("backoffs", backoff.changes)
    ctx.figure("forward_rows", rows)
    ctx.claim(result.steps == len(batches), f"all {len(batches)} steps applied ({result.steps})")
    ctx.claim(
        len(backoff.changes) == 1 and backoff.micro_batch == 4, f"one back-off to micro-batch 4 ({backoff.changes})"
    )
    ctx.claim(rows == [8, 8, 4, 4, 4, 4, 4, 4], f"step 2 replayed, and every later step, at 4 rows ({rows})")
    params = [(a.detach().cpu(), b.detach().cpu(), i)
              for a, b, i in zip(result.model.parameters(), clean.model.parameters(), init, strict=True)]  # fmt: skip
    gap = max(float((a - b).abs().max()) for a, b, _ in params)
    moved = max(float((b - i).abs().max()) for _, b, i in params)
    ctx.figure("weights", {"max_gap_vs_clean_run": gap, "max_moved": moved})
    ctx.claim(gap < 0.05 * moved, f"the run ends where the clean run ends (gap {gap:.1e}, weights moved {moved:.1e})")


def check_grad_checkpointing(ctx: Ctx) -> None:
    """gradient_checkpointing=True: the same update, less activation memory (GPU), at some extra time."""
    import time

    from kitlib import fit

    batches = lm_batches(ctx.size(2, 6), ctx.size(2, 8), ctx.size(64, 1024))
    out: dict[str, Any] = {}
    for on in (False, True):
        model = llama(ctx.quick, hidden=512, layers=ctx.size(2, 8))
        reset_memory()
        started = time.perf_counter()
        result = fit(model, loader(batches), config=_cfg(lr=1e-4, gradient_checkpointing=on, tf32=False))
        ctx.claim(result.model.is_gradient_checkpointing == on, f"gradient_checkpointing={on} reached the model")
        out[on] = {"seconds": round(time.perf_counter() - started, 2), **memory(),
                   "params": [p.detach().float().cpu() for p in result.model.parameters()]}  # fmt: skip
    gap = max(float((a - b).abs().max()) for a, b in zip(out[False]["params"], out[True]["params"], strict=True))
    ctx.figure("runs", {("on" if k else "off"): {n: v for n, v in r.items() if n != "params"} for k, r in out.items()})
    ctx.figure("max_weight_gap", gap)
    ctx.claim(gap < 5e-3, f"checkpointing computes the same update (max weight gap {gap:.1e})")
    if cuda():
        off, on = out[False]["peak_allocated_mib"], out[True]["peak_allocated_mib"]
        ctx.claim(on < 0.8 * off, f"checkpointing lowers peak memory ({off:.0f} -> {on:.0f} MiB)")


BIG_CHECKS: list[Check] = [
    Check("lora", "LoRA on a tiny Llama: adapters train, the base stays, the loss falls", check_lora, "30",
          gpu_s=20, cpu_s=30),
    Check("qlora", "QLoRA: 4-bit NF4 load, bf16 base dtype, fit, rank 0's weights reloaded into a fresh model",
          check_qlora, "30: 1-4", gpu_s=30, cpu_s=60),
    Check("adamw8bit", "optimizer='adamw8bit': bitsandbytes' 8-bit moments, the model learns", check_adamw8bit, "30",
          gpu_s=20, cpu_s=40),
    Check("adamw_kahan", "optimizer='adamw-kahan' in bf16: pure bf16 weights move as far as fp32 masters",
          check_adamw_kahan, "30", gpu_s=25, cpu_s=20),
    Check("chunked_loss", "the chunked LM loss: equal loss and gradients, less memory at a 32k vocab",
          check_chunked_loss, "30", gpu_s=15, cpu_s=8),
    Check("oom_backoff", "an injected OOM: fit halves the micro-batch, replays the step, ends where a clean run ends",
          check_oom_backoff, "30", gpu_s=20, cpu_s=15),
    Check("grad_checkpointing", "gradient_checkpointing: same update, lower peak memory", check_grad_checkpointing,
          "30", gpu_s=25, cpu_s=15),
]  # fmt: skip
