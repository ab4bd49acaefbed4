from __future__ import annotations

import os

import pytest

# Two cores: one intra-op thread per test process keeps parallel test processes (DDP, kill/resume) from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hosted_pins: a slow test scripts/test_hosted_pins.sh runs at the lower bounds")


@pytest.fixture(autouse=True, scope="session")
def _no_parameters_from_the_shell():  # type: ignore[no-untyped-def]
    """00's parameters read KIT_* variables (KIT_PRESET, KIT_TASK, ...): one exported for the main job (the README's
    `KIT_PRESET=smoke`) must not change what a test asks for. A test that wants one sets it itself (monkeypatch).
    Not through the monkeypatch fixture: an autouse one would reorder other fixtures' teardowns around its undo."""
    shell = {name: os.environ.pop(name) for name in [n for n in os.environ if n.startswith("KIT_")]}
    yield
    os.environ.update(shell)


@pytest.fixture
def cpu_hw():
    """A plain fp32 CPU profile, so engine tests behave the same on AMX and non-AMX machines."""
    from kitlib.machine.hardware import fake_profile

    return fake_profile("CPU", platform="local", interactive=False)


@pytest.fixture
def cpu_4bit():  # type: ignore[no-untyped-def]
    """Skips where this transformers refuses bitsandbytes' CPU backend (4.46-4.5x: kitlib says so with the fix, see
    test_lora.py::test_an_old_transformers_refusing_cpu_4bit_gets_the_fix); the newest runs the QLoRA rehearsal."""
    pytest.importorskip("bitsandbytes")
    from kitlib.errors import SetupError
    from kitlib.models.adapters import _cpu_backend_admitted

    try:
        _cpu_backend_admitted()
    except SetupError as error:
        pytest.skip(str(error))
