from __future__ import annotations

import os

import pytest

# Two cores: one intra-op thread per test process keeps parallel test processes (DDP, kill/resume) from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _own_config_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The cache's signing key lives in a per-session folder, never the user's ~/.config (child processes inherit)."""
    os.environ["KITLIB_CONFIG_DIR"] = str(tmp_path_factory.mktemp("kitlib-config"))
    yield


@pytest.fixture
def cpu_hw():
    """A plain fp32 CPU profile, so engine tests behave the same on AMX and non-AMX machines."""
    from kitlib.machine.hardware import fake_profile

    return fake_profile("CPU", platform="local", interactive=False)
