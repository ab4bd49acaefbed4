from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from kitlib.errors import PrecisionError, UnsupportedGPUError
from kitlib.machine.hardware import (
    ARCH_LIST_WITH_SM60,
    KAGGLE_TORCH,
    build_arch_list,
    check_torch_supports,
    detect,
    detect_platform,
    fake_profile,
    is_interactive,
    torch_supports,
)

PROFILES = ["T4", "2xT4", "P100", "V100", "A100", "L4", "H100", "MPS", "CPU-AMX", "CPU"]
# Kaggle's image is built FROM the Colab runtime, so a Kaggle session carries COLAB_* too.
KAGGLE_ENV = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"}
COLAB_VARS = {"COLAB_RELEASE_TAG": "release-colab_20260901-060000_RC00", "COLAB_GPU": "1"}
KAGGLE_ARCH_LIST = build_arch_list(KAGGLE_TORCH)  # the kernels of Kaggle's torch: sm_70 up, no sm_60


@pytest.fixture(autouse=True)
def _no_colab_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({**KAGGLE_ENV, **COLAB_VARS}, "kaggle"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Batch", **COLAB_VARS}, "kaggle"),
        ({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, "kaggle"),
        (COLAB_VARS, "colab"),
        ({"COLAB_BACKEND_VERSION": "1"}, "colab"),
        ({}, "local"),
        ({"HOME": "/root", "CI": "true"}, "local"),
    ],
)
def test_detect_platform(environ: dict[str, str], expected: str) -> None:
    assert detect_platform(environ) == expected


def test_detect_platform_colab_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.colab", object())
    assert detect_platform({}) == "colab"
    assert detect_platform(KAGGLE_ENV) == "kaggle"  # Kaggle still wins


@pytest.mark.parametrize(
    ("environ", "stdin", "expected"),
    [
        ({**KAGGLE_ENV, "KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, True, True),
        ({**KAGGLE_ENV, "KAGGLE_KERNEL_RUN_TYPE": "Batch"}, True, False),  # the env alone decides
        ({**KAGGLE_ENV, "KAGGLE_IS_COMPETITION_RERUN": "1"}, True, False),
        ({**KAGGLE_ENV}, False, False),  # `!jupyter nbconvert --execute` inside an interactive session
        (COLAB_VARS, True, True),
        (COLAB_VARS, False, False),
        ({}, False, False),  # papermill, nbconvert, jupyter execute, nbmake: nbclient sends allow_stdin=False
        ({}, True, True),
        ({"CI": "true"}, True, False),
        ({"GITHUB_ACTIONS": "true"}, True, False),
        ({"KIT_HEADLESS": "1"}, True, False),
        ({"KIT_HEADLESS": "0", "CI": "true"}, False, True),  # explicit override wins both ways
    ],
)
def test_is_interactive(environ: dict[str, str], stdin: bool, expected: bool) -> None:
    assert is_interactive(environ, kernel_stdin=stdin) is expected


def test_a_kernel_reads_headless_from_its_requests_allow_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """#50 (A15): a real IPython kernel, asked as nbclient asks (allow_stdin=False: papermill, nbconvert) and as a
    person's frontend asks (True), tells the two apart without reading its parent's command line; outside a kernel
    (this test process) it is interactive."""
    from jupyter_client.manager import start_new_kernel

    for name in ("KIT_HEADLESS", "CI", "GITHUB_ACTIONS", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_IS_COMPETITION_RERUN"):
        monkeypatch.delenv(name, raising=False)
    assert is_interactive({}) is True
    manager, client = start_new_kernel(startup_timeout=120)
    code = "from kitlib.machine.hardware import is_interactive; print(is_interactive({}))"
    out: list[str] = []

    def printed(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            out.append(message["content"]["text"])

    try:
        said = []
        for stdin in (False, True):  # nbclient's request, then a person's frontend's
            out.clear()
            client.execute_interactive(code, allow_stdin=stdin, timeout=120, output_hook=printed)
            said.append("".join(out).strip())
        assert said == ["False", "True"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _proc_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def test_detect_this_machine() -> None:
    hw = detect({})
    assert hw.platform == "local"
    assert 1 <= hw.cpu_count <= (os.cpu_count() or 1)
    assert hw.ram_bytes > 2**28
    assert hw.torch_version == torch.__version__
    assert hw.cuda_version == torch.version.cuda
    assert hw.torch_cuda_arch_list == tuple(torch.cuda.get_arch_list())
    assert ("numpy", __import__("numpy").__version__) in hw.library_versions
    assert hw.shm_bytes is None or hw.shm_bytes > 0
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert hw.accelerators == () and hw.device_type == "cpu" and hw.primary is None and hw.num_gpus == 0
    assert "platform:" in hw.summary() and "torch:" in hw.summary()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs /proc/cpuinfo")
def test_detect_cpu_isa_agrees_with_proc_cpuinfo() -> None:
    # Not asserting False: the CI machine may have AMX. It must match what the kernel reports.
    hw, flags = detect({}), _proc_flags()
    assert hw.cpu_amx == ("amx_bf16" in flags)
    assert hw.cpu_avx512_bf16 == ("avx512_bf16" in flags)
    assert hw.cpu_avx512_fp16 == ("avx512_fp16" in flags)


@pytest.fixture
def kernel_of(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Makes detect() read ``stdin`` as the running cell's allow_stdin (a person's frontend, or a headless runner)."""
    import kitlib.machine.hardware as hardware

    def request(stdin: bool) -> None:
        monkeypatch.setattr(hardware, "_kernel_stdin", lambda: stdin)

    return request


def test_detect_in_a_colab_like_session(monkeypatch: pytest.MonkeyPatch, kernel_of: Callable[[bool], None]) -> None:
    """No real Colab: its env vars, its google.colab module (the kernel imports it at start) and a frontend's
    request."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    kernel_of(True)
    environ = {"COLAB_RELEASE_TAG": COLAB_VARS["COLAB_RELEASE_TAG"], "COLAB_BACKEND_VERSION": "next", "HOME": "/root"}
    hw = detect(environ)
    assert (hw.platform, hw.interactive) == ("colab", True)
    assert "platform:  colab (interactive)" in hw.summary()
    monkeypatch.delitem(sys.modules, "google.colab")  # `!jupyter nbconvert --execute` in a Colab VM: vars only
    kernel_of(False)
    headless = detect({"COLAB_GPU": "1"})
    assert (headless.platform, headless.interactive) == ("colab", False)


@pytest.mark.parametrize(("run_type", "stdin", "interactive"), [("Interactive", True, True), ("Batch", False, False)])
def test_detect_kaggle_interactive_and_batch(
    kernel_of: Callable[[bool], None], run_type: str, stdin: bool, interactive: bool
) -> None:
    """Kaggle's editor session vs Save & Run All / `kaggle kernels push` (papermill); its image carries COLAB_* too."""
    kernel_of(stdin)
    hw = detect({**KAGGLE_ENV, "KAGGLE_KERNEL_RUN_TYPE": run_type, **COLAB_VARS})
    assert (hw.platform, hw.interactive) == ("kaggle", interactive)
    kernel_of(True)  # Batch is headless by Kaggle's own marker, whatever the request
    assert detect({**KAGGLE_ENV, "KAGGLE_KERNEL_RUN_TYPE": run_type}).interactive is interactive


def test_summary_shows_the_callers_paths_not_the_platforms() -> None:
    hw = fake_profile("2xT4")  # Kaggle: generic /kaggle/input, /kaggle/working
    assert "paths:" not in hw.summary() and "/kaggle/input" not in hw.summary()
    text = hw.summary(data_dir=Path("/kaggle/input/my-competition"), work_dir="/kaggle/working/run1")
    assert "paths:     data /kaggle/input/my-competition, work /kaggle/working/run1" in text
    assert "scratch" not in text and "/kaggle/temp" not in text


def test_detect_kaggle_batch_under_colab_vars() -> None:
    hw = detect({"KAGGLE_KERNEL_RUN_TYPE": "Batch", **COLAB_VARS})
    assert hw.platform == "kaggle" and hw.interactive is False
    assert detect(COLAB_VARS).platform == "colab"


def test_import_does_no_work() -> None:
    code = "import sys, kitlib.machine.hardware; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", PROFILES)
def test_fake_profiles_are_realistic(name: str) -> None:
    hw = fake_profile(name)
    assert hw.platform == "kaggle" and hw.interactive
    assert hw.cpu_count >= 2 and hw.ram_bytes > 8 * 2**30
    if name in ("CPU", "CPU-AMX"):
        assert hw.device_type == "cpu" and hw.accelerators == () and hw.torch_cuda_arch_list == ()
    elif name == "MPS":
        assert hw.device_type == "mps" and hw.primary is not None and hw.primary.capability == (0, 0)
        assert hw.cuda_version is None and hw.num_gpus == 0
    else:
        assert hw.device_type == "cuda" and hw.cuda_version and hw.torch_cuda_arch_list == KAGGLE_ARCH_LIST
        assert hw.primary is not None and hw.primary.capability >= (6, 0) and hw.primary.memory_bytes >= 15 * 2**30
        assert hw.num_gpus == (2 if name == "2xT4" else 1)
    assert hw.cpu_amx is (name == "CPU-AMX")


def test_fake_profile_details() -> None:
    t4 = fake_profile("2XT4", platform="colab", interactive=False)  # case-insensitive
    assert [a.index for a in t4.accelerators] == [0, 1]
    assert t4.primary is not None and (t4.primary.name, t4.primary.capability) == ("Tesla T4", (7, 5))
    assert t4.platform == "colab" and not t4.interactive
    assert "Tesla T4 (sm_75" in t4.summary() and "cuda:1" in t4.summary()
    assert fake_profile("cpu-amx").cpu_amx
    with pytest.raises(ValueError, match="unknown profile"):
        fake_profile("K80")


def test_p100_on_kaggle_image_is_unsupported() -> None:
    p100 = fake_profile("P100")
    assert "sm_60" not in p100.torch_cuda_arch_list
    with pytest.raises(UnsupportedGPUError, match=r"no kernels for sm_60.*T4") as err:
        check_torch_supports(p100)
    assert isinstance(err.value, PrecisionError)
    check_torch_supports(fake_profile("P100", torch_cuda_arch_list=ARCH_LIST_WITH_SM60))
    for name in ("2xT4", "V100", "A100", "L4", "H100", "CPU", "MPS"):
        check_torch_supports(fake_profile(name))


@pytest.mark.parametrize(
    ("capability", "arch", "ok"),
    [
        ((7, 5), ("sm_70",), True),  # same major, newer minor: cubin is binary compatible
        ((8, 6), ("sm_80",), True),
        ((8, 9), ("sm_80", "sm_86"), True),
        ((8, 0), ("sm_86",), False),  # older minor cannot run newer cubins
        ((9, 0), ("sm_90a",), True),
        ((10, 0), ("sm_90a",), False),  # arch-specific cubins do not carry forward
        ((12, 0), ("sm_90", "compute_90"), True),  # PTX JIT
        ((6, 0), KAGGLE_ARCH_LIST, False),
        ((6, 0), ARCH_LIST_WITH_SM60, True),
        ((12, 0), KAGGLE_ARCH_LIST, True),
    ],
)
def test_torch_supports(capability: tuple[int, int], arch: tuple[str, ...], ok: bool) -> None:
    assert torch_supports(capability, arch) is ok


def test_fit_trains_on_this_process_share_of_the_usable_cpus_and_restores_the_threads(
    monkeypatch: pytest.MonkeyPatch, cpu_hw
) -> None:
    """torch sized its pool for 2 cores; the process may use 1 (a CPU quota, a narrowed affinity): fit trains on 1,
    and the kernel gets its 2 back afterwards, also when training raised."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from kitlib import TrainConfig, fit
    from kitlib.engine.events import Callback
    from kitlib.machine import hardware, threads

    seen: list[tuple[int, str | None]] = []

    class Threads(Callback):
        def on_step_end(self, step: object) -> None:
            seen.append((torch.get_num_threads(), os.environ.get("RAYON_NUM_THREADS")))

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    cfg = TrainConfig(epochs=1, micro_batch_size=8, precision="fp32", save_best=False)
    mse = lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1])  # noqa: E731
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = fit(nn.Linear(4, 1), loader, config=cfg, loss_fn=mse, hw=cpu_hw, callbacks=[Threads()])
        assert set(seen) == {(1, "1")} and result.timing["run"]["intra_op_threads"] == 1
        assert torch.get_num_threads() == 2 and "RAYON_NUM_THREADS" not in os.environ
        with pytest.raises(RuntimeError, match="boom"), threads.cpu_threads():
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)  # a lower count set by the user stays
        with threads.cpu_threads() as n:
            assert n == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
