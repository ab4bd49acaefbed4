from __future__ import annotations

import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kitlib.machine.backends import flags_for, speed_flags
from kitlib.machine.hardware import fake_profile
from kitlib.machine.precision import decide_precision

NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch < 2.9 has no fp32_precision API")


def _state() -> dict[str, Any]:
    """Every flag speed_flags may touch, read independently of kitlib (new-API names only: never mix the APIs)."""
    b: Any = torch.backends
    state: dict[str, Any] = {
        "matmul_precision": torch.get_float32_matmul_precision(),
        "benchmark": b.cudnn.benchmark,
    }
    # The legacy getters raise when the two APIs disagree, so reading them also checks consistency.
    state |= {"legacy_matmul": b.cuda.matmul.allow_tf32, "legacy_cudnn": b.cudnn.allow_tf32}
    if NEW_API:
        state |= {
            "matmul": b.cuda.matmul.fp32_precision,
            "mkldnn_matmul": b.mkldnn.matmul.fp32_precision,
            "conv": b.cudnn.conv.fp32_precision,
            "rnn": b.cudnn.rnn.fp32_precision,
            "cuda_all": b.cudnn.fp32_precision,
            "generic": b.fp32_precision,
        }
    return state


@pytest.fixture(autouse=True)
def _flags_untouched() -> Iterator[None]:
    """Every test must leave the process exactly as it found it (other test files share it)."""
    before = _state()
    yield
    assert _state() == before


def test_restores_every_flag() -> None:
    before = _state()
    with speed_flags(tf32=True, cudnn_benchmark=not before["benchmark"]) as effective:
        inside = _state()
        assert effective["tf32_matmul"] is True and effective["tf32_cudnn"] is True
        assert effective["cudnn_benchmark"] is (not before["benchmark"])
    assert inside != before
    assert _state() == before


def test_restores_after_exception() -> None:
    before = _state()
    with pytest.raises(KeyError), speed_flags(tf32=False, cudnn_benchmark=True, matmul_precision="highest"):
        assert torch.backends.cudnn.benchmark
        raise KeyError("boom")
    assert _state() == before


def test_none_leaves_flags_alone() -> None:
    before = _state()
    with speed_flags() as effective:
        assert _state() == before
    assert effective["matmul_precision"] == before["matmul_precision"]


def test_nested() -> None:
    before = _state()
    with speed_flags(tf32=True, cudnn_benchmark=True):
        outer = _state()
        with speed_flags(tf32=False, cudnn_benchmark=False) as inner:
            assert inner["tf32_matmul"] is False and inner["cudnn_benchmark"] is False
            assert torch.get_float32_matmul_precision() == "highest"
        assert _state() == outer
        with speed_flags(matmul_precision="medium"):
            assert torch.get_float32_matmul_precision() == "medium"
        assert _state() == outer
    assert _state() == before


@needs_new_api
def test_new_api_no_warning_and_consistent_for_legacy_readers() -> None:
    b: Any = torch.backends
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # setting the old allow_tf32 on torch >= 2.9 warns: we must not
        with speed_flags(tf32=True) as effective:
            assert effective["api"] == "fp32_precision"
            assert effective["tf32_matmul"] is True and effective["matmul_precision"] == "high"
            assert b.cuda.matmul.fp32_precision == b.cudnn.conv.fp32_precision == b.cudnn.rnn.fp32_precision == "tf32"
        with speed_flags(tf32=False) as effective:
            assert effective["tf32_matmul"] is False and effective["matmul_precision"] == "highest"
            assert b.cuda.matmul.fp32_precision == b.cudnn.conv.fp32_precision == b.cudnn.rnn.fp32_precision == "ieee"
    # torch raises "mix of the legacy and new APIs" when legacy readers (torch.compile reads allow_tf32) see the
    # two disagree; inside our context they must agree.
    with speed_flags(tf32=True):
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cudnn.allow_tf32 is True
    with speed_flags(tf32=False):
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False


def test_legacy_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.9: only allow_tf32 exists. Simulated with stand-ins that lack fp32_precision."""
    matmul = types.SimpleNamespace(allow_tf32=False)
    cudnn = types.SimpleNamespace(allow_tf32=True, benchmark=False)
    precision = ["highest"]
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision[0])
    monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda v: precision.__setitem__(0, v))
    with speed_flags(matmul_precision="medium"):
        assert precision == ["medium"]
    assert precision == ["highest"]
    with speed_flags(tf32=True, cudnn_benchmark=True) as effective:
        assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == (True, True, True)
        assert effective["api"] == "allow_tf32" and effective["tf32_matmul"] is True
    assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == (False, True, False)
    with pytest.raises(RuntimeError), speed_flags(tf32=False):
        assert cudnn.allow_tf32 is False
        raise RuntimeError
    assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, True)


@needs_new_api
def test_backend_missing_from_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build without a backend (here: no mkldnn.matmul) must not break setting or restoring the others."""
    monkeypatch.setattr(torch.backends, "mkldnn", types.SimpleNamespace())
    before = _state_without_mkldnn()
    # tf32=False keeps float32_matmul_precision at its default 'highest', whose setter would also write the (really
    # present) mkldnn flag this test pretends is missing.
    with speed_flags(tf32=False, cudnn_benchmark=True) as effective:
        assert effective["tf32_matmul"] is False and effective["tf32_cudnn"] is False
    assert _state_without_mkldnn() == before


def _state_without_mkldnn() -> dict[str, Any]:
    b: Any = torch.backends
    return {
        "matmul": b.cuda.matmul.fp32_precision,
        "conv": b.cudnn.conv.fp32_precision,
        "benchmark": b.cudnn.benchmark,
        "matmul_precision": torch.get_float32_matmul_precision(),
    }


@pytest.mark.parametrize(("tf32", "matmul_precision"), [(True, "highest"), (False, "high"), (False, "medium")])
def test_contradictions_raise(tf32: bool, matmul_precision: Any) -> None:
    with pytest.raises(ValueError, match="Fix"), speed_flags(tf32=tf32, matmul_precision=matmul_precision):
        pass


@pytest.mark.parametrize(
    ("name", "tf32"),
    [("T4", False), ("2xT4", False), ("V100", False), ("A100", True), ("L4", True), ("H100", True)],
)
def test_flags_for_cuda(name: str, tf32: bool) -> None:
    plan = decide_precision(fake_profile(name))
    assert flags_for(plan, shapes_vary=True) == {"tf32": tf32, "cudnn_benchmark": False, "matmul_precision": None}
    fixed = flags_for(plan, shapes_vary=False)
    assert fixed["cudnn_benchmark"] is True
    with speed_flags(**fixed) as effective:  # the flags are settable on a CPU build too
        assert effective["tf32_matmul"] is tf32


@pytest.mark.parametrize("name", ["MPS", "CPU-AMX", "CPU"])
def test_flags_for_non_cuda_leaves_everything(name: str) -> None:
    plan = decide_precision(fake_profile(name))
    for shapes_vary in (True, False):
        assert flags_for(plan, shapes_vary=shapes_vary) == {
            "tf32": None,
            "cudnn_benchmark": None,
            "matmul_precision": None,
        }
