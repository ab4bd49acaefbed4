from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import kitlib.engine.checkpoint as ck
from kitlib.engine.checkpoint import BackgroundWriter, CheckpointError, Snapshot

V, D = 32, 16


class TinyLM(torch.nn.Module):
    """lm_head.weight is embed.weight (GPT-2 style tying) + dropout so the torch RNG matters."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.drop = torch.nn.Dropout(0.2)
        self.norm = torch.nn.LayerNorm(D)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.drop(self.embed(x))))


class FakeCompiled(torch.nn.Module):
    """Stands in for torch.compile's OptimizedModule (creating a real one imports dynamo: ~5 s)."""

    def __init__(self, mod: torch.nn.Module) -> None:
        super().__init__()
        self._orig_mod = mod


def make(seed: int) -> tuple[TinyLM, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler, Any]:
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    return model, opt, sched, scaler


def train_step(model: TinyLM, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler) -> None:
    x = torch.randint(0, V, (4, 8))  # torch RNG; dropout too
    scale = 1.0 + 0.1 * float(np.random.rand()) + 0.1 * random.random()  # numpy + python RNG
    loss = F.cross_entropy(model(x).view(-1, V), x.view(-1)) * scale
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resume_state(opt: Any, sched: Any, scaler: Any, step: int) -> dict[str, Any]:
    return {
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": ck.rng_state(),
        "step": step,
    }


def test_round_trip_tied_weights_and_state(tmp_path: Path) -> None:
    seed_all(0)
    model, opt, sched, scaler = make(0)
    for _ in range(2):
        train_step(model, opt, sched)
    state = resume_state(opt, sched, scaler, 2)
    snap = ck.snapshot(model, state=state, meta={"step": 2, "metrics": {"loss": 1.5}})
    assert snap.weights["lm_head.weight"] is snap.weights["embed.weight"]  # tie kept in the copy, copied once
    d = ck.write(snap, tmp_path / "run" / "last")
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "meta.json", "model.safetensors", "state.pt"]
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:  # stored once, HF-loadable metadata
        assert set(f.keys()) == {"embed.weight", "norm.weight", "norm.bias"}
        assert f.metadata() == {"format": "pt"}

    got = ck.load(d)
    assert got.meta["step"] == 2 and got.meta["metrics"] == {"loss": 1.5} and "kitlib_version" in got.meta
    assert got.weights.keys() == snap.weights.keys()
    for k, v in snap.weights.items():
        assert torch.equal(got.weights[k], v)
    assert got.weights["lm_head.weight"] is got.weights["embed.weight"]
    assert got.state is not None

    model2, opt2, sched2, scaler2 = make(1)
    ck.restore_model(model2, got)
    assert model2.lm_head.weight is model2.embed.weight  # still tied
    for k, v in model.state_dict().items():
        assert torch.equal(model2.state_dict()[k], v)
    opt2.load_state_dict(got.state["optimizer"])
    sched2.load_state_dict(got.state["scheduler"])
    scaler2.load_state_dict(got.state["scaler"])
    for p_id, s in opt.state_dict()["state"].items():
        for name, t in s.items():
            assert torch.equal(opt2.state_dict()["state"][p_id][name], t)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert sched2.state_dict() == sched.state_dict()
    assert scaler2.state_dict() == scaler.state_dict() and scaler2.get_scale() == 128.0

    ck.set_rng_state(got.state["rng"])
    a = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    ck.set_rng_state(got.state["rng"])
    b = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])

    weights_only = ck.load(ck.write(ck.snapshot(model), tmp_path / "run" / "best"))
    assert weights_only.state is None and not (tmp_path / "run" / "best" / "state.pt").exists()


def test_exact_resume_matches_uninterrupted(tmp_path: Path) -> None:
    seed_all(0)
    ref, opt, sched, _ = make(0)
    for _ in range(6):
        train_step(ref, opt, sched)

    seed_all(0)
    model, opt, sched, scaler = make(0)
    for _ in range(3):
        train_step(model, opt, sched)
    ck.write(ck.snapshot(model, state=resume_state(opt, sched, scaler, 3)), tmp_path / "last")
    del model, opt, sched

    seed_all(99)  # a fresh process: other seeds, other init
    model, opt, sched, scaler = make(99)
    snap = ck.load(tmp_path / "last")
    assert snap.state is not None
    ck.restore_model(model, snap)
    opt.load_state_dict(snap.state["optimizer"])
    sched.load_state_dict(snap.state["scheduler"])
    scaler.load_state_dict(snap.state["scaler"])
    ck.set_rng_state(snap.state["rng"])
    for _ in range(3):
        train_step(model, opt, sched)
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_snapshot_is_a_copy_and_unwraps(tmp_path: Path) -> None:
    model = TinyLM()
    wrapped = FakeCompiled(torch.nn.DataParallel(model))
    assert all(k.startswith("_orig_mod.module.") for k in wrapped.state_dict())
    snap = ck.snapshot(wrapped)
    assert set(snap.weights) == set(model.state_dict())
    before = model.norm.weight.detach().clone()
    with torch.no_grad():
        model.norm.weight.add_(1.0)
        model.embed.weight.zero_()
    got = ck.load(ck.write(snap, tmp_path / "c"))
    assert torch.equal(got.weights["norm.weight"], before)
    assert got.weights["embed.weight"].abs().sum() > 0

    fresh = TinyLM()
    ck.restore_model(FakeCompiled(torch.nn.DataParallel(fresh)), got)
    assert torch.equal(fresh.norm.weight, before) and fresh.lm_head.weight is fresh.embed.weight
    # checkpoints from other tools: 'module.' prefixes and only one name of a tied pair
    foreign = {"module." + k: v for k, v in got.weights.items() if k != "lm_head.weight"}
    other = TinyLM()
    ck.restore_model(other, Snapshot(weights=foreign, state=None, meta={}))
    assert torch.equal(other.lm_head.weight, got.weights["embed.weight"])
    with pytest.raises(CheckpointError, match="do not fit"):
        ck.restore_model(torch.nn.Linear(2, 2), got)
    with pytest.warns(UserWarning, match="2 model keys not in the checkpoint"):
        ck.restore_model(torch.nn.Linear(2, 2), got, strict=False)


def test_state_and_meta_validation() -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match=r"state\['cfg'\]\['x'\].*weights_only"):
        ck.snapshot(model, state={"cfg": {"x": object()}})
    with pytest.raises(CheckpointError, match="JSON"):
        ck.snapshot(model, meta={"x": object()})
    snap = ck.snapshot(model, state={"loss": np.float64(0.25), "pos": (1, [2, 3])})
    assert snap.state == {"loss": 0.25, "pos": (1, [2, 3])} and type(snap.state["loss"]) is float


def test_rng_state_is_a_few_tensors_and_older_lists_still_load() -> None:
    """The generators' states are a handful of objects for the snapshot to copy (main: ~1,250 Python ints, walked one
    by one at every save: most of a small model's save on the training thread), and a checkpoint written before
    (lists of ints) restores the same streams."""

    def leaves(obj: Any) -> int:
        return sum(leaves(v) for v in obj) if isinstance(obj, (list, tuple)) else 1

    seed_all(5)
    state = ck.rng_state()
    assert sum(leaves(v) for v in state.values()) < 16
    expected = (random.random(), np.random.rand(), torch.rand(1))
    as_lists = {k: [v.tolist() if isinstance(v, torch.Tensor) else v for v in state[k]] for k in ("python", "numpy")}
    for saved in (state, {**state, **as_lists}):
        ck.set_rng_state(saved)
        assert (random.random(), np.random.rand(), torch.rand(1)) == expected


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    import kitlib.engine.checkpoint as ck

    target, mode = Path(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    ck.write(ck.snapshot(torch.nn.Linear(8, 8), state={"step": 1}, meta={"step": 1}), target)
    real_fsync, real_rename = ck.fsync_file, ck._rename

    def pause():
        print("PAUSED", flush=True)  # the parent SIGKILLs us now
        time.sleep(60)

    def fsync(path):
        real_fsync(path)
        if path.name == "model.safetensors":  # weights on disk; state/meta/manifest not yet written
            pause()

    def rename(src, dst):
        real_rename(src, dst)
        if ".old-" in dst.name:  # old version moved away, new one not yet moved in
            pause()

    if mode == "mid-write":
        ck.fsync_file = fsync
    else:
        ck._rename = rename
    ck.write(ck.snapshot(torch.nn.Linear(512, 512), state={"step": 2}, meta={"step": 2}), target)
    print("FINISHED", flush=True)
    """
)


def _kill_child_at_pause(target: Path, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(target), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "PAUSED"  # blocks until the child is inside write() of B
        tmps = [p for p in target.parent.iterdir() if ".tmp-" in p.name]
        assert len(tmps) == 1
        if mode == "mid-write":  # a genuinely partial directory exists at the moment of the kill
            assert sorted(p.name for p in tmps[0].iterdir()) == ["model.safetensors"]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("mode", ["mid-write", "mid-swap"])
def test_kill_during_write_keeps_a_loadable_checkpoint(tmp_path: Path, mode: str) -> None:
    target = tmp_path / "last"
    _kill_child_at_pause(target, mode)
    assert any(".tmp-" in p.name for p in tmp_path.iterdir())  # leftover of the killed write
    found = ck.latest(tmp_path)
    assert found is not None
    snap = ck.load(target, verify=True)
    # mid-write: B never completed -> A. mid-swap: both complete, the newer (B) wins.
    expected = 1 if mode == "mid-write" else 2
    assert snap.meta["step"] == expected and snap.state == {"step": expected}
    assert snap.weights["weight"].shape == ((8, 8) if expected == 1 else (512, 512))

    ck.write(ck.snapshot(torch.nn.Linear(4, 4), meta={"step": 3}), target)
    assert [p.name for p in tmp_path.iterdir()] == ["last"]  # leftovers cleaned up
    assert ck.load(target).meta["step"] == 3


def test_corrupt_checkpoints_raise_clear_errors(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 64)
    d = ck.write(ck.snapshot(model, state={"x": torch.ones(100)}), tmp_path / "last")

    data = (d / "state.pt").read_bytes()
    (d / "state.pt").write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))  # same size, flipped bytes
    with pytest.raises(CheckpointError, match=r"last is unusable: state\.pt fails its sha256 check.*Fix:"):
        ck.load(d)
    (d / "state.pt").write_bytes(data)
    ck.load(d)

    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match=r"model\.safetensors is 100 bytes.*truncated"):
        ck.load(d, verify=False)
    assert ck.latest(tmp_path) is None

    d = ck.write(ck.snapshot(model), tmp_path / "last")  # a damaged checkpoint of ours may be replaced
    (d / "meta.json").unlink()
    with pytest.raises(CheckpointError, match=r"meta\.json is missing"):
        ck.load(d)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest\.json is unreadable"):
        ck.load(d)
    (d / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing"):
        ck.load(d)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        ck.load(tmp_path / "nope")
    assert ck.latest(tmp_path, "nope") is None


def test_write_refuses_foreign_dir_and_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.csv").write_text("a,b\n")
    snap = ck.snapshot(torch.nn.Linear(256, 256))
    with pytest.raises(CheckpointError, match="refusing to replace"):
        ck.write(snap, data_dir)
    assert (data_dir / "train.csv").read_text() == "a,b\n"

    real = ck.shutil.disk_usage
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(CheckpointError, match=r"needs ~0\.02 GB, 0\.00 GB free.*Fix:") as err:
        ck.write(snap, tmp_path / "last")
    assert str(tmp_path / "last") in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing half-written


def _snap(step: int, n: int = 8) -> Snapshot:
    return ck.snapshot(torch.nn.Linear(n, n), meta={"step": step})


def test_background_submit_returns_before_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """submit hands the snapshot over and returns while the write is still held back (no timing: a gate)."""
    real, gate = ck.write, threading.Event()

    def held(snap: Snapshot, d: Path) -> Path:
        assert gate.wait(30), "submit never returned"  # a slow disk, released once submit has returned
        return real(snap, d)

    monkeypatch.setattr(ck, "write", held)
    with BackgroundWriter() as w:
        w.submit(_snap(1, 256), tmp_path / "last")
        assert w.writes == 0 and not (tmp_path / "last").exists()  # returned before the write happened
        gate.set()
        w.wait()
    assert w.writes == 1
    with pytest.raises(CheckpointError, match="after close"):
        w.submit(_snap(2), tmp_path / "last")


def test_background_coalesces_queued_snapshots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ck.write
    started, gate, calls = threading.Event(), threading.Event(), []

    def gated(snap: Snapshot, d: Path) -> Path:
        calls.append((d.name, snap.meta["step"]))
        started.set()
        assert gate.wait(10)
        return real(snap, d)

    monkeypatch.setattr(ck, "write", gated)
    w = BackgroundWriter()
    w.submit(_snap(1), tmp_path / "last")
    assert started.wait(10)  # step 1 is being written
    for step in (2, 3, 4):  # queued behind it: only the newest survives
        w.submit(_snap(step), tmp_path / "last")
    w.submit(_snap(10), tmp_path / "best")
    gate.set()
    w.close()
    assert calls == [("last", 1), ("last", 4), ("best", 10)]
    assert w.writes == 3
    assert ck.load(tmp_path / "last").meta["step"] == 4


def test_background_errors_are_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ck.write

    def flaky(snap: Snapshot, d: Path) -> Path:
        if snap.meta["step"] < 0:
            raise OSError(28, "No space left on device")
        return real(snap, d)

    monkeypatch.setattr(ck, "write", flaky)
    w = BackgroundWriter()
    w.submit(_snap(-1), tmp_path / "last")
    with pytest.raises(CheckpointError, match="No space left") as err:
        w.wait()
    assert isinstance(err.value.__cause__, OSError)
    w.wait()  # reported once
    busy_before = w.busy_seconds  # the first failed write already counted
    w.submit(_snap(-2), tmp_path / "last")
    deadline = time.monotonic() + 10
    while w.busy_seconds == busy_before and time.monotonic() < deadline:  # the failing write ends, no wait()
        time.sleep(0.01)
    with pytest.raises(CheckpointError, match="No space left"):
        w.submit(_snap(1), tmp_path / "last")
    w.submit(_snap(2), tmp_path / "last")
    w.close()
    assert w.writes == 1 and json.loads((tmp_path / "last" / "meta.json").read_text())["step"] == 2

    w = BackgroundWriter()
    w.submit(_snap(-3), tmp_path / "x")
    with pytest.raises(CheckpointError, match="No space left"):
        w.close()
    # while unwinding from a training error, a writer error is a warning and does not mask the original
    with pytest.warns(UserWarning, match="No space left"), pytest.raises(KeyError), BackgroundWriter() as w2:
        w2.submit(_snap(-4), tmp_path / "y")
        raise KeyError("training failed")


def test_a_full_disk_names_the_checkpoint_and_the_free_space_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from kitlib.errors import DiskFullError

    model = torch.nn.Linear(4, 2)
    good = ck.write(ck.snapshot(model), tmp_path / "last")
    before = {p.name: p.read_bytes() for p in good.iterdir()}

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", full)  # the writer's safetensors call
    with pytest.raises(DiskFullError, match=r"no space left writing checkpoint .*last \(\d+\.\d+ GB free on .*Fix"):
        ck.write(ck.snapshot(torch.nn.Linear(4, 2)), tmp_path / "last")
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # no temp folder left behind


def test_a_full_disk_in_an_atomic_write_keeps_the_file(tmp_path: Path) -> None:
    import errno

    from kitlib._files import write_atomic
    from kitlib.errors import DiskFullError

    target = write_atomic(tmp_path / "submission.csv", "id,label\n1,a\n")

    def full(fh: object) -> None:
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    with pytest.raises(DiskFullError, match=r"submission.csv .*GB free"):
        write_atomic(target, full)
    assert target.read_text() == "id,label\n1,a\n" and [p.name for p in tmp_path.iterdir()] == ["submission.csv"]
