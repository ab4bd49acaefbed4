"""Every memory plan of a grid, written to one file, to compare two trees byte for byte (not a test).

PYTHONPATH=TREE python benchmarks/dump_plans.py OUT.txt   # then: cmp main.txt branch.txt
"""

from __future__ import annotations

import sys
import types
from typing import Any

from kitlib.doctor import memory_plan as mp
from kitlib.machine.hardware import PROFILE_NAMES, fake_profile

_configs: dict[Any, Any] = {}
_shapes: dict[Any, Any] = {}
_model_config, _model_shape = mp.model_config, mp.model_shape


def model_config(model: Any) -> Any:
    """One config per model name: the meta-model count is what takes the time, not what is compared."""
    if model not in _configs:
        _configs[model] = _model_config(model)
    return _configs[model]


def model_shape(config: Any, kind: str) -> Any:
    key = (id(config), kind)
    if key not in _shapes:
        _shapes[key] = _model_shape(config, kind)
    return _shapes[key]


def plans(out: list[str], model: str, kind: str, hw: str) -> int:
    n = 0
    for seq in (128, 1536):
        for micro, accum in ((None, None), (2, 8)):
            for chunk in (None, False):
                head = f"{model} {kind} {hw} {seq} {(micro, accum)} {chunk}"
                try:
                    p = mp.plan_memory(model, hardware=hw, seq_len=seq, model_kind=kind, effective_batch=32,
                                       micro_batch=micro, accum=accum, chunked_loss=chunk)  # fmt: skip
                except Exception as e:
                    out.append(f"ERR {head}: {e!r}")
                    continue
                n += 1
                out += [f"== {head}", repr(p), p.table(), repr([f.strategy.settings for f in p.fits])]
                out.append(repr((p.choice, p.parallel, p.why_parallel())))
    return n


def helpers(out: list[str], model: str, kind: str, hw: str) -> None:
    h = fake_profile(hw, interactive=False)
    for precision in ("auto", "fp32"):
        for optimizer, adapter in (("adamw", "none"), ("adamw8bit", "none"), ("adamw", "lora")):
            for micro in (1, 8):
                cfg = types.SimpleNamespace(
                    micro_batch_size=micro,
                    grad_accum_steps=4,
                    max_length=1024,
                    precision=precision,
                    optimizer=optimizer,
                    adapter=adapter,
                    freeze="none",
                )
                for regime in ("full", "head"):
                    preset = types.SimpleNamespace(max_length_cap=512, regime=regime)
                    run = types.SimpleNamespace(config=cfg, preset=preset, effective_batch_size=32)
                    out.append(f"-- {model} {kind} {hw} {precision} {optimizer} {adapter} {micro} {regime}")
                    try:
                        out.append(mp.run_line(model, kind, h, run))
                        out.append(repr(mp.checkpointing_needed(model, kind, h, run)))
                        out.append(repr(mp.planned_parallel(model, kind, h, run)))
                    except Exception as e:
                        out.append(f"ERR {e!r}")


def main() -> None:
    mp.model_config, mp.model_shape = model_config, model_shape  # type: ignore[assignment]
    out: list[str] = []
    n = 0
    for model, kinds in (("llama-7b", ("encoder", "decoder")), ("gpt2", ("encoder", "decoder")),
                         ("t5-small", ("encoder-decoder",)), ("minilm", ("encoder", "decoder"))):  # fmt: skip
        for kind in kinds:
            for hw in PROFILE_NAMES:
                n += plans(out, model, kind, hw)
                helpers(out, model, kind, hw)
    print(n, "plans", file=sys.stderr)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
