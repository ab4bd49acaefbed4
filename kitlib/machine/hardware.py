"""Platform and hardware detection: ``detect()`` probes the machine (nothing runs at import) into a frozen value;
``fake_profile("T4")`` builds the same value for a hosted machine, so decisions are testable on a CPU."""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from kitlib.errors import CompileError, UnsupportedGPUError

# lazy: torch (+1.0 s), importlib.metadata (+0.016 s): detect_platform, fake_profile and the NVML/child-process probes
# need neither, and every light kitlib module imports this one: `import kitlib.machine.hardware` stays at 0.01 s
# (tests/test_hardware.py::test_import_does_no_work; python -X importtime).

Platform = Literal["kaggle", "colab", "local"]
DeviceType = Literal["cuda", "mps", "cpu"]

_GIB = 2**30
_MIB = 2**20

# Reported with the hardware so a log or bug report says which stack ran; missing ones are omitted.
_LIBRARIES = ("transformers", "tokenizers", "accelerate", "datasets", "safetensors", "numpy", "pandas", "scikit-learn")

_TRUTHY = ("1", "true", "yes", "on")
_FALSY = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Accelerator:
    index: int
    name: str  # "Tesla T4"
    capability: tuple[int, int]  # (7, 5); (0, 0) for MPS
    memory_bytes: int
    device_type: DeviceType  # "cuda" or "mps"

    @property
    def sm(self) -> str:
        """'sm_75' style name of the compute capability (the spelling torch's arch list uses)."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class HardwareInfo:
    platform: Platform
    interactive: bool  # False for Kaggle batch runs, nbconvert/papermill/headless runs, CI
    cpu_count: int  # usable CPUs: affinity mask, capped by a cgroup CPU quota
    ram_bytes: int  # physical RAM, capped by a cgroup memory limit
    accelerators: tuple[Accelerator, ...]
    cpu_amx: bool  # AMX-BF16 tiles: the only CPUs where bf16 autocast beats fp32
    cpu_avx512_bf16: bool
    torch_version: str
    cuda_version: str | None  # torch.version.cuda
    torch_cuda_arch_list: tuple[str, ...]  # torch.cuda.get_arch_list(); () on CPU builds
    library_versions: tuple[tuple[str, str], ...]
    shm_bytes: int | None  # size of /dev/shm; DataLoader workers pass batches through it
    cpu_avx512_fp16: bool = False  # native fp16 arithmetic on CPU (Sapphire Rapids+)
    cpu_amx_fp16: bool = False  # AMX-FP16 tiles (Granite Rapids+)

    @property
    def device_type(self) -> DeviceType:
        types = {a.device_type for a in self.accelerators}
        return "cuda" if "cuda" in types else "mps" if "mps" in types else "cpu"

    @property
    def primary(self) -> Accelerator | None:
        return next((a for a in self.accelerators if a.device_type == self.device_type), None)

    @property
    def device_name(self) -> str:
        """The training device's name ("Tesla T4"), or "CPU": what peak tables and run records key on."""
        return self.primary.name if self.primary is not None else "CPU"

    @property
    def num_gpus(self) -> int:
        return sum(a.device_type == "cuda" for a in self.accelerators)

    def summary(self, *, data_dir: str | Path | None = None, work_dir: str | Path | None = None) -> str:
        """Multi-line description printed by 00_setup; ``data_dir``/``work_dir`` shown on a ``paths:`` line."""
        mode = "interactive" if self.interactive else "headless"
        lines = [f"platform:  {self.platform} ({mode})"]
        if not self.accelerators:
            lines.append("device:    cpu (no GPU)")
        for a in self.accelerators:
            cap = f"{a.sm}, " if a.device_type == "cuda" else ""
            lines.append(f"device:    {a.device_type}:{a.index} {a.name} ({cap}{a.memory_bytes / _GIB:.1f} GiB)")
        shm = "unknown" if self.shm_bytes is None else f"{self.shm_bytes / _GIB:.1f} GiB"
        lines.append(f"cpu:       {self.cpu_count} usable CPUs, RAM {self.ram_bytes / _GIB:.1f} GiB, /dev/shm {shm}")
        isa = {"AMX-BF16": self.cpu_amx, "AVX512-BF16": self.cpu_avx512_bf16, "AVX512-FP16": self.cpu_avx512_fp16}
        lines.append("cpu isa:   " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in isa.items()))
        cuda = f"CUDA {self.cuda_version}" if self.cuda_version else "no CUDA"
        arch = ", kernels " + " ".join(self.torch_cuda_arch_list) if self.torch_cuda_arch_list else ""
        lines.append(f"torch:     {self.torch_version} ({cuda}{arch})")
        paths = {"data": data_dir, "work": work_dir}
        if any(path is not None for path in paths.values()):
            lines.append("paths:     " + ", ".join(f"{k} {v}" for k, v in paths.items() if v is not None))
        if self.library_versions:
            lines.append("libraries: " + ", ".join(f"{n} {v}" for n, v in self.library_versions))
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------- platform


def detect_platform(environ: Mapping[str, str]) -> Platform:
    """Which hosted notebook we are in. Kaggle first: its image is built FROM the Colab runtime and inherits COLAB_*."""
    # KAGGLE_KERNEL_RUN_TYPE is Kaggle's own marker (kagglehub/kagglesdk); KAGGLE_URL_BASE is set in every session.
    if "KAGGLE_KERNEL_RUN_TYPE" in environ or "KAGGLE_URL_BASE" in environ:
        return "kaggle"
    # The Colab kernel imports google.colab at startup; a headless nbconvert kernel inside a Colab VM does not, but
    # still inherits COLAB_RELEASE_TAG/COLAB_GPU (and is still on Colab's disk layout).
    colab_vars = ("COLAB_RELEASE_TAG", "COLAB_GPU", "COLAB_BACKEND_VERSION", "COLAB_TPU_ADDR")
    if "google.colab" in sys.modules or any(v in environ for v in colab_vars):
        return "colab"
    return "local"


def is_interactive(environ: Mapping[str, str], *, kernel_stdin: bool | None = None) -> bool:
    """False when nobody is watching (Kaggle batch, nbconvert/papermill, CI); ``KIT_HEADLESS`` overrides all.
    ``kernel_stdin``: whether the running notebook cell may ask for input (None: ``_kernel_stdin()``)."""
    forced = switch(environ.get("KIT_HEADLESS", ""))
    if forced is not None:
        return not forced
    # "Batch" = Save & Run All and `kaggle kernels push` runs (executed by papermill); "Interactive" = editor session.
    if environ.get("KAGGLE_KERNEL_RUN_TYPE") == "Batch" or environ.get("KAGGLE_IS_COMPETITION_RERUN"):
        return False
    if environ.get("CI", "").strip().lower() in _TRUTHY or environ.get("GITHUB_ACTIONS") == "true":
        return False
    return _kernel_stdin() if kernel_stdin is None else kernel_stdin


def _kernel_stdin() -> bool:
    """The Jupyter protocol's ``allow_stdin`` of the cell IPython's kernel runs now: False from nbclient (nbconvert,
    papermill, nbmake, jupyter execute), True from a person's frontend; True outside a kernel (a script, a console)."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    get_parent = getattr(getattr(shell, "kernel", None), "get_parent", None)  # ipykernel >= 6
    request = get_parent("shell") if get_parent is not None else {}
    return bool(request.get("content", {}).get("allow_stdin", True))


def switch(value: str) -> bool | None:
    """An on/off environment variable's value: True for 1/true/yes/on, False for 0/false/no/off (any case, spaces
    ignored), None for anything else (unset or empty included)."""
    text = value.strip().lower()
    return True if text in _TRUTHY else False if text in _FALSY else None


# --------------------------------------------------------------------------------------------------------- probing


def detect(environ: Mapping[str, str] | None = None) -> HardwareInfo:
    """Probe this machine (~1 s: imports torch). Reads ``os.environ`` when ``environ`` is None."""
    import torch  # deferred: importing this module stays cheap (fake_profile/detect_platform need no torch)

    env: Mapping[str, str] = os.environ if environ is None else environ
    platform = detect_platform(env)
    ram = _ram_bytes()
    return HardwareInfo(
        platform=platform,
        interactive=is_interactive(env),
        cpu_count=usable_cpus(),
        ram_bytes=ram,
        accelerators=_accelerators(ram),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        # [] on CPU builds, and on CUDA builds when no driver/GPU is visible.
        torch_cuda_arch_list=tuple(torch.cuda.get_arch_list()),
        library_versions=_library_versions(),
        shm_bytes=_shm_bytes(),
        **_isa(_cpu_flags()),  # AMX is listed only where the kernel enabled its state; no /proc: unknown, fp32
    )


def _accelerators(ram_bytes: int) -> tuple[Accelerator, ...]:
    import torch

    if cuda := cuda_devices():
        return cuda
    if torch.backends.mps.is_available():
        # Unified memory: the GPU share is what Metal recommends, else all RAM.
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        memory = int(recommended()) if recommended is not None else ram_bytes
        return (Accelerator(0, "Apple MPS", (0, 0), memory, "mps"),)
    return ()


def cuda_devices() -> tuple[Accelerator, ...]:
    """This machine's visible CUDA GPUs, read without initialising CUDA here (a process that ran cuInit cannot fork
    GPU workers: 02's DDP launch): torch once CUDA is up, else NVML (~5 ms), else a child process (~2 s)."""
    import torch

    if not torch.backends.cuda.is_built():
        return ()
    found: list[_DeviceFacts] | None
    if torch.cuda.is_initialized():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        found = [(p.name, (p.major, p.minor), p.total_memory) for p in props]
    else:
        found = _nvml_devices()
    if found is None:
        found = _devices_in_child() if _driver_installed() else []
    return tuple(Accelerator(i, name, cap, memory, "cuda") for i, (name, cap, memory) in enumerate(found))


_DeviceFacts = tuple[str, tuple[int, int], int]  # name, compute capability, memory bytes


def _nvml_devices() -> list[_DeviceFacts] | None:
    """The GPUs CUDA_VISIBLE_DEVICES leaves visible, from NVML; None where NVML cannot say (no library, MIG, UUIDs)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")  # installed with the driver; loading it initialises nothing
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        indices = _visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), count.value)
        if indices is None:
            return None
        found = []
        for index in indices:
            handle, name = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            major, minor = ctypes.c_int(), ctypes.c_int()
            memory = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
            calls = (
                nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)),
                nvml.nvmlDeviceGetName(handle, name, len(name)),
                nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)),
                nvml.nvmlDeviceGetMemoryInfo(handle, memory),
            )
            if any(calls):
                return None
            found.append((name.value.decode(errors="replace"), (major.value, minor.value), int(memory[0])))
        return found
    finally:
        nvml.nvmlShutdown()


def _visible_indices(visible: str | None, count: int) -> list[int] | None:
    """The NVML indices CUDA_VISIBLE_DEVICES names, read as CUDA does (the list ends at the first invalid entry);
    None for UUIDs and MIG names, which only CUDA itself maps."""
    if visible is None:
        return list(range(count))
    indices: list[int] = []
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry.lstrip("-").isdigit():
            return None if entry else indices
        if not 0 <= int(entry) < count:
            break
        indices.append(int(entry))
    return indices


def _driver_installed() -> bool:
    """Whether the CUDA driver library is here (Linux); loading it initialises nothing. A CUDA build of torch on a
    machine without an NVIDIA driver (CI, laptops) then skips the child process."""
    if sys.platform != "linux":
        return True  # nvcuda.dll on Windows: the child process decides
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


_CHILD_QUERY = (
    "import json, torch\n"
    "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
    "print(json.dumps([[p.name, p.major, p.minor, p.total_memory] for p in map(torch.cuda.get_device_properties, "
    "range(n))]))"
)


def _devices_in_child() -> list[_DeviceFacts]:
    """What torch reports in a child process, so that cuInit runs there and not here."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD_QUERY], capture_output=True, text=True, timeout=300, check=True
        )
        rows = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as err:
        warnings.warn(f"kitlib: could not read the GPUs in a child process ({err}): reporting none", stacklevel=3)
        return []
    return [(str(name), (int(major), int(minor)), int(memory)) for name, major, minor, memory in rows]


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The ISA flags the kernel reports (x86 'flags', ARM 'Features'); empty where there is no /proc/cpuinfo."""
    with contextlib.suppress(OSError), cpuinfo.open() as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
    return frozenset()


def _isa(flags: frozenset[str]) -> dict[str, bool]:
    """HardwareInfo's CPU ISA fields from the kernel's flag names."""
    names = {"cpu_amx": "amx_bf16", "cpu_avx512_bf16": "avx512_bf16", "cpu_avx512_fp16": "avx512_fp16",
             "cpu_amx_fp16": "amx_fp16"}  # fmt: skip
    return {field: flag in flags for field, flag in names.items()}


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # Containers often see every host CPU but get a CFS quota (cgroup v2: "<quota> <period>" or "max <period>").
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            usable = min(usable, max(1, math.ceil(int(quota) / int(period))))
    return usable


def threads_per_worker(nprocs: int, environ: Mapping[str, str] | None = None) -> int:
    """Intra-op threads for each of ``nprocs`` workers: OMP_NUM_THREADS when the user set it, else the usable CPUs
    split between them (at least 1). Each process would otherwise start a thread per core: 2 ranks on Kaggle's 4
    vCPUs run 8 compute threads, plus their DataLoader workers, and contend for every core (torchrun sets 1)."""
    env = os.environ if environ is None else environ
    if env.get("OMP_NUM_THREADS", "").strip().isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        return int(env["OMP_NUM_THREADS"])
    return max(1, usable_cpus() // nprocs)


def local_processes(environ: Mapping[str, str] | None = None) -> int:
    """The training processes on this machine, which share its CPUs: LOCAL_WORLD_SIZE (torchrun and kitlib's
    launcher set it); without it, WORLD_SIZE (one machine assumed: sharing CPUs is the risk), else 1."""
    env = os.environ if environ is None else environ
    return int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1)))


def _ram_bytes() -> int:
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # Windows has no sysconf
        ram = 0
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError):
            text = Path(limit_file).read_text().strip()
            if text.isdigit() and (ram == 0 or int(text) < ram):  # "max" or a huge v1 number means unlimited
                ram = int(text)
    return ram


def _shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_frsize * st.f_blocks


def _library_versions() -> tuple[tuple[str, str], ...]:
    import importlib.metadata

    found = []
    for name in _LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append((name, importlib.metadata.version(name)))
    return tuple(found)


# --------------------------------------------------------------------------------------------------------- torch vs GPU


def _parse_arch(entry: str) -> tuple[str, int, int, bool] | None:
    """'sm_86' -> ('sm', 8, 6, False); 'sm_90a' -> ('sm', 9, 0, True); 'compute_90' -> ('compute', 9, 0, False)."""
    kind, _, digits = entry.partition("_")
    specific = digits.endswith("a")  # 'a' = arch-specific (exact match only); 'f' = family, compatible like plain
    digits = digits.rstrip("af")
    if kind not in ("sm", "compute") or len(digits) < 2 or not digits.isdigit():
        return None
    return kind, int(digits[:-1]), int(digits[-1]), specific


def torch_supports(capability: tuple[int, int], arch_list: Sequence[str]) -> bool:
    """Whether a torch build with ``arch_list`` has kernels for a GPU of ``capability`` (sm_XY runs on the same major
    with minor >= Y; sm_90a only on 9.0; compute_XY PTX on any capability >= X.Y)."""
    for kind, major, minor, specific in filter(None, map(_parse_arch, arch_list)):
        if kind == "compute" and (major, minor) <= capability:
            return True
        same_major = kind == "sm" and major == capability[0]
        if same_major and (minor == capability[1] or (not specific and minor < capability[1])):
            return True
    return False


# The official pip builds' kernels by CUDA flavour (pytorch RELEASE.md's matrix): a machine we are not on (hardware=
# "2xT4") has only its torch version to plan by. Sources: docs/measurements.md, "hardware.py".
_CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
_CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
_BUILD_ARCHS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"12.6": _CU126, "12.8": _CU128, "12.9": (*_CU128, "compute_120"), "13.0": (*_CU128, "compute_120")}
)
_VOLTA_DROPPED = (2, 11)  # first torch whose cu128/cu129 builds have no sm_70


def build_arch_list(torch_version: str, cuda_version: str | None = None) -> tuple[str, ...]:
    """The kernels of the official pip build ``torch_version`` ("2.10.0+cu128") from the table above; () when unknown.
    ``cuda_version`` ("12.8") is used when the version has no ``+cuXYZ`` suffix."""
    cuda = _cuda_of(torch_version) or cuda_version
    archs = _BUILD_ARCHS.get(cuda or "", ())
    release = tuple(int(n) for n in re.findall(r"\d+", torch_version.split("+")[0])[:2])
    if cuda in ("12.8", "12.9") and release < _VOLTA_DROPPED:
        archs = ("sm_70", *archs)
    return archs


def _cuda_of(torch_version: str) -> str | None:
    """'2.10.0+cu128' -> '12.8'; None without a +cuXYZ suffix."""
    flavour = re.search(r"\+cu(\d+)(\d)$", torch_version)
    return f"{flavour.group(1)}.{flavour.group(2)}" if flavour else None


def check_torch_supports(hw: HardwareInfo) -> None:
    """Raise UnsupportedGPUError if the installed (or planned: ``hw.torch_version``) torch cannot run on a GPU."""
    arch_list = hw.torch_cuda_arch_list or build_arch_list(hw.torch_version, hw.cuda_version)
    if not arch_list:
        return
    for a in hw.accelerators:
        if a.device_type != "cuda" or torch_supports(a.capability, arch_list):
            continue
        built = " ".join(arch_list)
        # On Kaggle a P100 is allocated, is_available() is True, then the first CUDA op dies with
        # cudaErrorNoKernelImageForDevice (Kaggle/kaggle-cli#1151); its image's torch cannot be swapped offline.
        switch = (
            "switch the accelerator to 'GPU T4 x2' (machine_shape NvidiaTeslaT4) or L4, or "
            if hw.platform == "kaggle"
            else "use a newer GPU, or "
        )
        raise UnsupportedGPUError(
            f"{a.name} is {a.sm}, but this torch build ({hw.torch_version}) has no kernels for {a.sm} (built for: "
            f"{built}); every CUDA op would fail with 'no kernel image is available'. PyTorch's cu128/cu129/cu130 "
            f"builds have no sm_60 (Pascal), and from torch 2.11 no sm_70 (Volta); the cu126 builds keep both. Fix: "
            f"{switch}install a build whose torch.cuda.get_arch_list() includes {a.sm} (pip install torch "
            f"--index-url https://download.pytorch.org/whl/cu126)."
        )


def check_compile(hw: HardwareInfo) -> str:
    """What ``compile=True`` does on ``hw``'s GPUs: a CompileError where it cannot work (Triton needs capability
    >= 7.0), else a line to print ("" when there is nothing to say). Reasoned from torch's sources."""
    gpus = [a for a in hw.accelerators if a.device_type == "cuda"]
    if not gpus:
        return ""
    weakest = min(gpus, key=lambda a: a.capability)
    if weakest.capability < (7, 0):
        raise CompileError(
            f"compile=True on {weakest.name} ({weakest.sm}): torch.compile generates its GPU code with Triton, which "
            "needs CUDA capability 7.0+ (torch raises GPUTooOldForTriton at the first compiled step). Fix: "
            "compile=False (eager mode runs on this GPU), or a GPU of sm_70 or newer (T4, L4, A100)"
        )
    if weakest.capability < (8, 0):
        # triton-lang/triton#5066 (Triton 3.3+): dots below sm_80 fall back to FMA (no tensor cores), and Triton's
        # README lists 8.0+ as supported. Inductor keeps matmuls on cuBLAS unless mode="max-autotune".
        return (
            f"compile on {weakest.name} ({weakest.sm}): Triton 3.3+ supports sm_80+ and builds its matmuls without "
            "tensor cores below it; matmuls stay on cuBLAS (inductor's default), so compile gains only fused "
            "elementwise ops here, and mode='max-autotune' would be slower (reasoned, not measured)"
        )
    return ""


# --------------------------------------------------------------------------------------------------------- fakes

# Kaggle's default image: torch 2.10.0+cu128, whose kernels start at sm_70 (no sm_60: Kaggle/kaggle-cli#1151).
KAGGLE_TORCH = "2.10.0+cu128"
# A cu126 build, which still ships Pascal kernels (pass as fake_profile(..., torch_cuda_arch_list=...)).
ARCH_LIST_WITH_SM60 = _CU126


@dataclass(frozen=True)
class _Profile:
    gpus: tuple[tuple[str, tuple[int, int], int], ...]  # (name, capability, memory MiB as nvidia-smi reports)
    cpu_count: int
    ram_gib: float
    device_type: DeviceType = "cuda"
    cpu_isa: frozenset[str] = field(default_factory=frozenset)


_T4 = ("Tesla T4", (7, 5), 15360)
# VM sizes: Kaggle GPU VM 4 vCPU / 31.4 GiB (wandb metadata of Kaggle runs, see kaggle-and-headless.md §2.4); the
# Colab ones are commonly reported tiers and only approximate.
_PROFILES: Mapping[str, _Profile] = MappingProxyType(
    {
        "T4": _Profile((_T4,), 2, 12.7),  # Colab free tier
        "2XT4": _Profile((_T4, _T4), 4, 31.4),  # Kaggle default GPU (machine_shape NvidiaTeslaT4)
        "P100": _Profile((("Tesla P100-PCIE-16GB", (6, 0), 16280),), 4, 31.4),
        "V100": _Profile((("Tesla V100-SXM2-16GB", (7, 0), 16160),), 8, 51.0),
        "A100": _Profile((("NVIDIA A100-SXM4-40GB", (8, 0), 40960),), 12, 83.5),
        "A100-80": _Profile((("NVIDIA A100-SXM4-80GB", (8, 0), 81920),), 12, 167.0),
        "L4": _Profile((("NVIDIA L4", (8, 9), 23034),), 12, 53.0),
        "H100": _Profile((("NVIDIA H100 80GB HBM3", (9, 0), 81559),), 26, 235.0),
        # rented nodes beyond Kaggle (issue #48): an 8-GPU HGX H100 (AWS p5.48xlarge), 4 x A100 80 GB (GCP
        # a2-ultragpu-4g); vCPUs and RAM as those offers list them
        "8XH100": _Profile((("NVIDIA H100 80GB HBM3", (9, 0), 81559),) * 8, 192, 2048.0),
        "4XA100-80GB": _Profile((("NVIDIA A100-SXM4-80GB", (8, 0), 81920),) * 4, 48, 633.0),
        "MPS": _Profile((("Apple M2 (MPS)", (0, 0), 16384),), 8, 16.0, device_type="mps"),
        "CPU-AMX": _Profile(
            (), 8, 32.0, device_type="cpu", cpu_isa=frozenset({"amx_bf16", "avx512_bf16", "avx512_fp16"})
        ),  # Sapphire Rapids (e.g. GCP C3)
        "CPU": _Profile((), 4, 31.4, device_type="cpu"),  # Kaggle CPU session; AVX2 only
    }
)
PROFILE_NAMES = tuple(_PROFILES)  # the names fake_profile takes (case-insensitive), for help texts


def fake_profile(
    name: str,
    *,
    platform: Platform = "kaggle",
    interactive: bool = True,
    torch_cuda_arch_list: Sequence[str] | None = None,
    torch_version: str = KAGGLE_TORCH,
) -> HardwareInfo:
    """A realistic HardwareInfo for a hosted machine (T4, 2xT4, P100, V100, A100, A100-80, L4, H100, 8xH100,
    4xA100-80GB, MPS, CPU-AMX, CPU), Kaggle's torch by default; ``torch_version``/``torch_cuda_arch_list`` model
    another build."""
    profile = _PROFILES.get(name.upper())
    if profile is None:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(_PROFILES)}")
    cuda = profile.device_type == "cuda"
    accelerators = tuple(
        Accelerator(i, gpu_name, cap, mib * _MIB, profile.device_type)
        for i, (gpu_name, cap, mib) in enumerate(profile.gpus)
    )
    arch = (
        build_arch_list(torch_version) if torch_cuda_arch_list is None and cuda else tuple(torch_cuda_arch_list or ())
    )
    return HardwareInfo(
        platform=platform,
        interactive=interactive,
        cpu_count=profile.cpu_count,
        ram_bytes=int(profile.ram_gib * _GIB),
        accelerators=accelerators,
        torch_version=torch_version if cuda else torch_version.split("+")[0] + ("+cpu" if not profile.gpus else ""),
        cuda_version=_cuda_of(torch_version) if cuda else None,
        torch_cuda_arch_list=arch,
        library_versions=(),
        shm_bytes=None,  # not known for the hosted images; detect() measures the real one
        **_isa(profile.cpu_isa),
    )
