"""Peak bytes of live tensor storage on the CPU, the way ``torch.cuda.max_memory_allocated`` counts on a GPU.

The CPU allocator keeps no statistics (torch 2.13 has no ``torch.cpu.max_memory_allocated``) and the process's RSS
counts the allocator's cache and the interpreter too. So ``LiveBytes`` is a TorchDispatchMode that sees every aten
op's outputs, in forward and backward alike (the dispatch mode travels into the autograd engine), and keeps the sum
of the distinct storages alive: each storage is counted when an op first returns it and uncounted when it is freed
(a weakref finalizer on the storage, which torch keeps alive as long as any tensor holds it). Storages that existed
before (weights, optimizer states) are counted with ``hold``. Kernels' private scratch buffers are not seen.

    with LiveBytes() as live:
        live.hold(model.parameters())
        train_step()
    live.peak  # bytes
"""

from __future__ import annotations

import tempfile
import weakref
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from kitlib.config import TrainConfig
from kitlib.doctor.memory_plan import GENERATING, plan_memory
from kitlib.doctor.meta_count import meta_model
from kitlib.engine.loop import Loop
from kitlib.engine.objective import default_count_fn, hf_loss
from kitlib.engine.optim import build_optimizer, build_scheduler
from kitlib.engine.optim import freeze as freeze_part
from kitlib.engine.step import StepLedger, enable_activation_checkpointing, to_device
from kitlib.engine.timing import PhaseTimer
from kitlib.machine.amp import Precision
from kitlib.machine.distributed import DistEnv
from kitlib.machine.hardware import fake_profile
from kitlib.machine.precision import decide_precision
from kitlib.models.adapters import quantization
from kitlib.models.loading import from_pretrained
from kitlib.models.lora import add_adapter


class LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # storage data pointer -> bytes
        self.current = 0
        self.peak = 0

    def hold(self, tensors: Iterable[Any]) -> None:
        """Count storages that exist already (a model's parameters, an optimizer's states), nested or not."""
        for tensor in pytree.tree_leaves(list(tensors)):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


def step_peak(
    model: torch.nn.Module,
    window: list[Any],
    *,
    gradient_checkpointing: bool = False,
    freeze: str = "none",
    optimizer_name: str = "adamw",
    loss_fn: Any = None,
) -> int:
    """Peak live bytes of kitlib's own optimizer step (``train_window``: fp32, weighted backward over ``window``'s
    micro-batches, clip, fused AdamW, zero_grad) on the CPU, weights and AdamW states included: the second step is
    measured, so the states exist as they do for every step but the first."""
    cfg = TrainConfig(precision="fp32", gradient_checkpointing=gradient_checkpointing, freeze=freeze,  # type: ignore[arg-type]
                      optimizer=optimizer_name)  # type: ignore[arg-type]  # fmt: skip
    freeze_part(model, freeze)
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    optimizer = build_optimizer(model, cfg)
    ledger = StepLedger(build_scheduler(optimizer, cfg, 4), 4, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    precision = Precision(decide_precision(fake_profile("CPU"), "fp32"))
    count_fn, move = default_count_fn(model), to_device(torch.device("cpu"))

    parts = SimpleNamespace(model=model, loss_fn=loss_fn or hf_loss, count_fn=count_fn, precision=precision,
                            optimizer=optimizer, ledger=ledger, params=params, cfg=cfg, env=DistEnv(),
                            timer=PhaseTimer(), to_device=move)  # fmt: skip

    def step() -> None:
        Loop.train_window(parts, window)  # type: ignore[arg-type]  # the step alone, on the parts it reads

    step()  # creates the AdamW states
    with LiveBytes() as live:
        live.hold([*model.parameters(), *model.buffers(), optimizer.state_dict()["state"], window])
        step()
    return live.peak


# the plan's strategies that run on this CPU in fp32 (its step_peak measures them), as the plan names them there
MEASURABLE = ("fp32 full fine-tune", "fp32 full fine-tune + checkpointing", "frozen embeddings + fp32",
              "fp32 + 8-bit AdamW", "LoRA r=16, fp32 base", "QLoRA (LoRA on 4-bit weights)",
              "QLoRA (LoRA on 4-bit weights) + checkpointing")  # fmt: skip


def planned_and_measured(
    config: Any, *, model_kind: str, seq_len: int, micro_batch: int, accum: int, strategy: str, seed: int = 0
) -> tuple[float, int]:
    """(the plan's peak bytes, the measured peak of kitlib's step) for ``strategy`` (a MEASURABLE name) training a
    model built from ``config`` with random weights on random tokens, on this CPU in fp32, with the strategy's own
    settings (``Strategy.settings``)."""
    plan = plan_memory(config, hardware="CPU", seq_len=seq_len, model_kind=model_kind, micro_batch=micro_batch,
                       accum=accum, chunked_loss=False)  # fmt: skip
    fit = next(f for f in plan.fits if f.strategy.name == strategy)
    planned, chosen = fit.peak, fit.strategy
    torch.manual_seed(seed)
    model = meta_model(config, model_kind)  # on the CPU here: real (random) weights
    if chosen.adapter == "qlora":  # 4-bit NF4 through the notebooks' loading path (bitsandbytes' CPU backend)
        model = _reloaded(model, quantization("qlora", "cpu"))
    model = add_adapter(model, chosen.adapter, generating=model_kind in GENERATING, seed=seed)
    vocab = int(config.vocab_size)
    window = []
    for _ in range(accum):
        ids = torch.randint(4, vocab, (micro_batch, seq_len))
        labels = ids if model_kind in GENERATING else torch.randint(0, 2, (micro_batch,))
        window.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    peak = step_peak(model, window, gradient_checkpointing=chosen.checkpointing, freeze=chosen.freeze,
                     optimizer_name=chosen.optimizer_name)  # fmt: skip
    return planned, peak


def _reloaded(model: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    """``model`` saved and loaded back through kitlib.models.loading with ``kwargs`` (a quantization config)."""

    auto = AutoModelForSeq2SeqLM if getattr(model.config, "is_encoder_decoder", False) else AutoModelForCausalLM
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)  # type: ignore[operator]
        loaded: torch.nn.Module = from_pretrained(auto, folder, **kwargs)
    return loaded
