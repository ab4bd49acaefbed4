from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import kitlib._version
from kitlib.data import cache as cache_mod
from kitlib.data.cache import Cache, CacheError, CacheWarning, cached, default_cache_dir

REPO = Path(__file__).resolve().parents[1]


class Counter:
    """A featuriser that counts its builds."""

    def __init__(self) -> None:
        self.calls = 0

    def kitlib_identity(self) -> str:
        return "counter"  # the call count is not an input


def read_csv_sum(path: Path, counter: Counter, scale: float = 1.0) -> np.ndarray:
    counter.calls += 1
    return pd.read_csv(path)["x"].to_numpy() * scale


def big_array(n: int, counter: Counter) -> np.ndarray:
    counter.calls += 1
    return np.arange(n, dtype=np.float32)


def only_entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def cache(tmp_path: Path, lines: list[str]) -> Cache:
    return Cache(tmp_path / "cache", log=lines.append)


@pytest.fixture
def csv(tmp_path: Path) -> Path:
    path = tmp_path / "train.csv"
    path.write_text("x\n1\n2\n3\n")
    return path


def test_rerun_is_a_hit_with_equal_data_and_a_log_line(cache: Cache, csv: Path, lines: list[str]) -> None:
    counter = Counter()
    first = cached(read_csv_sum, csv, counter, cache=cache, name="sums")
    second = cached(read_csv_sum, csv, counter, cache=cache, name="sums")
    assert counter.calls == 1
    np.testing.assert_array_equal(first, second)
    assert lines[0].startswith("cache miss sums[") and lines[1].startswith("cache hit sums[")
    assert "(built in" in lines[1]
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert cache.stats.time_saved_s >= 0


@pytest.mark.parametrize("as_str", [False, True])
def test_changed_file_bytes_is_a_miss(cache: Cache, csv: Path, as_str: bool) -> None:
    counter = Counter()
    arg: Any = str(csv) if as_str else csv
    cached(read_csv_sum, arg, counter, cache=cache)
    csv.write_text("x\n1\n2\n4\n")  # same size, one byte differs
    result = cached(read_csv_sum, arg, counter, cache=cache)
    assert counter.calls == 2
    np.testing.assert_array_equal(result, [1, 2, 4])


def test_changed_parameter_is_a_miss_and_defaults_bind(cache: Cache, csv: Path) -> None:
    counter = Counter()
    cached(read_csv_sum, csv, counter, cache=cache)
    cached(read_csv_sum, csv, counter, scale=1.0, cache=cache)  # the default spelled out: same entry
    assert counter.calls == 1
    cached(read_csv_sum, csv, counter, scale=2.0, cache=cache)
    assert counter.calls == 2


def test_changed_function_source_is_a_miss(cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "kitlib_test_featuriser.py"
    module.write_text("def feature(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("kitlib_test_featuriser")
    assert cached(mod.feature, 1, cache=cache) == 2
    assert cached(mod.feature, 1, cache=cache) == 2
    module.write_text("def feature(x):\n    return x + 100\n")
    mod = importlib.reload(mod)
    assert cached(mod.feature, 1, cache=cache) == 101
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)
    sys.modules.pop("kitlib_test_featuriser", None)


def test_dataframe_one_cell_change_is_a_miss(cache: Cache) -> None:
    counter = Counter()

    def total(df: pd.DataFrame, counter: Counter) -> float:
        counter.calls += 1
        return float(df["price"].sum())

    df = pd.DataFrame({"text": ["a", "b", "c"], "price": [1.0, 2.0, 3.0]})
    cached(total, df, counter, cache=cache)
    cached(total, df.copy(), counter, cache=cache)
    assert counter.calls == 1
    changed = df.copy()
    changed.loc[1, "text"] = "B"
    cached(total, changed, counter, cache=cache)
    assert counter.calls == 2


def test_kitlib_version_bump_is_a_miss(cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = Counter()
    cached(big_array, 10, counter, cache=cache)
    monkeypatch.setattr(kitlib._version, "__version__", "999.0")
    cached(big_array, 10, counter, cache=cache)
    assert counter.calls == 2


def test_cached_is_the_one_public_way_to_memoise() -> None:
    """One name per thing: a call goes through ``cached``; Cache offers no second spelling of it."""
    assert not [n for n in dir(Cache) if n in ("get_or_build", "memoize")] and not hasattr(kitlib, "cached_feature")


def test_tensors_and_ragged_lists_round_trip_compactly(cache: Cache) -> None:
    def build() -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        ragged = [np.arange(i % 37 + 1, dtype=np.int32) for i in range(500)]
        return {"bf16": torch.randn(4, 3, generator=gen).to(torch.bfloat16), "ids": ragged, "n": 3}

    first = cached(build, cache=cache)
    second = cached(build, cache=cache)
    assert cache.stats.hits == 1
    assert second["bf16"].dtype == torch.bfloat16 and torch.equal(first["bf16"], second["bf16"])
    assert len(second["ids"]) == 500
    assert all(np.array_equal(a, b) for a, b in zip(first["ids"], second["ids"], strict=True))
    manifest = next(cache.dir.glob("build-*/manifest.json")).read_text()
    assert manifest.count("],") < 10  # a handful of buffers (flat + offsets + tensor), not 500


def test_unknown_path_fails_before_touching_the_cache(cache: Cache, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        cached(read_csv_sum, tmp_path / "nope.csv", Counter(), cache=cache)
    assert not cache.dir.exists()


def test_unpicklable_result_is_returned_with_a_warning(cache: Cache) -> None:
    with pytest.warns(CacheWarning, match="could not store"):
        result = cached(lambda: threading.Lock(), cache=cache, name="lock")
    assert hasattr(result, "acquire")
    assert only_entries(cache.dir) == []


# ------------------------------------------------------------------------------------------------- damage


def _stored(cache: Cache, counter: Counter, n: int = 100_000) -> Path:
    cached(big_array, n, counter, cache=cache)
    (entry,) = [p for p in cache.dir.iterdir() if not p.name.startswith(".")]
    return entry


def test_truncated_file_is_reported_and_rebuilt(cache: Cache) -> None:
    counter = Counter()
    entry = _stored(cache, counter)
    data = entry / "buffers.bin"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.warns(CacheWarning, match=rf"{entry.name}.*buffers.bin is \d+ bytes"):
        result = cached(big_array, 100_000, counter, cache=cache)
    np.testing.assert_array_equal(result, np.arange(100_000, dtype=np.float32))
    assert counter.calls == 2 and cache.stats.corrupt == 1
    cached(big_array, 100_000, counter, cache=cache)  # the rebuilt entry is whole again
    assert counter.calls == 2


def test_corrupted_byte_fails_the_checksum_and_is_rebuilt(cache: Cache) -> None:
    counter = Counter()
    entry = _stored(cache, counter)
    data = bytearray((entry / "buffers.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "buffers.bin").write_bytes(data)
    with pytest.warns(CacheWarning, match="fails its sha256 check"):
        result = cached(big_array, 100_000, counter, cache=cache)
    np.testing.assert_array_equal(result, np.arange(100_000, dtype=np.float32))
    assert counter.calls == 2
    cached(big_array, 100_000, counter, cache=cache)
    assert counter.calls == 2


def test_garbled_manifest_is_rebuilt(cache: Cache) -> None:
    counter = Counter()
    entry = _stored(cache, counter, n=10)
    (entry / "manifest.json").write_text("{not json")
    with pytest.warns(CacheWarning, match="manifest.json is unreadable"):
        cached(big_array, 10, counter, cache=cache)
    assert counter.calls == 2 and len(cache.list()) == 1


KILL_HELPER = """
import os
import signal

import numpy as np

import kitlib.data.cache


def payload(n):
    return np.ones(n, dtype=np.float64)


def kill_halfway_through_buffers():
    \"\"\"Make this process SIGKILL itself once half of an entry's buffers.bin is written (each chunk one write).\"\"\"
    write = kitlib.data.cache.write_recorded

    def killed(path, chunks):
        if path.name != "buffers.bin":
            return write(path, chunks)
        chunks = list(chunks)
        half = sum(len(c) for c in chunks) // 2

        def upto_half():
            size = 0
            for chunk in chunks:
                if size + len(chunk) >= half:
                    yield memoryview(chunk)[: half - size]
                    os.kill(os.getpid(), signal.SIGKILL)
                yield chunk
                size += len(chunk)

        return write(path, upto_half())

    kitlib.data.cache.write_recorded = killed
"""


def test_kill_during_write_leaves_no_visible_entry(
    cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kitlib_kill_helper.py").write_text(KILL_HELPER)
    script = textwrap.dedent(f"""
        from kitlib.data.cache import Cache, cached
        from kitlib_kill_helper import kill_halfway_through_buffers, payload
        kill_halfway_through_buffers()
        cached(payload, 1_000_000, cache=Cache({str(cache.dir)!r}, log=None))
    """)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    leftovers = [p for p in cache.dir.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers and 0 < (leftovers[0] / "buffers.bin").stat().st_size < 8_000_000  # died halfway
    assert only_entries(cache.dir) == [] and cache.list().empty

    monkeypatch.syspath_prepend(str(tmp_path))
    helper = importlib.import_module("kitlib_kill_helper")
    result = cached(helper.payload, 1_000_000, cache=cache)
    assert cache.stats.misses == 1 and result.sum() == 1_000_000
    assert [p for p in cache.dir.iterdir() if p.name.startswith(".")] == []  # the dead writer's temp dir is swept
    cached(helper.payload, 1_000_000, cache=cache)
    assert cache.stats.hits == 1
    sys.modules.pop("kitlib_kill_helper", None)


def test_two_concurrent_writers_leave_one_valid_entry(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)

    def slow(n: int) -> np.ndarray:
        barrier.wait(timeout=10)  # both build, then both race to install
        time.sleep(0.05)
        return np.arange(n)

    results: list[np.ndarray] = []

    def run() -> None:
        results.append(cached(slow, 200_000, cache=Cache(tmp_path / "c", log=None)))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2 and all(np.array_equal(r, np.arange(200_000)) for r in results)
    assert len(only_entries(tmp_path / "c")) == 1
    assert [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")] == []
    reader = Cache(tmp_path / "c", log=None)
    np.testing.assert_array_equal(cached(slow, 200_000, cache=reader), np.arange(200_000))
    assert reader.stats.hits == 1


# ------------------------------------------------------------------------------------------------- trust


def a_set(n: int, counter: Counter) -> set[int]:
    """A result the no-code format cannot describe: returned uncached (the cache never pickles)."""
    counter.calls += 1
    return set(range(n))


def test_a_read_only_cache_dir_is_named_as_a_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "_READ_ONLY_ROOTS", (tmp_path / "input",))
    with pytest.raises(CacheError, match=r"writable dir .*seed_dirs=") as caught:
        Cache(tmp_path / "input" / "my-cache")
    assert "trust" not in str(caught.value)  # the advice is never "turn on unpickling"


def test_seed_with_matching_manifest_is_a_hit(tmp_path: Path) -> None:
    counter = Counter()
    published = Cache(tmp_path / "published", log=None)
    cached(big_array, 1000, counter, cache=published)
    session = Cache(tmp_path / "working", seed_dirs=[tmp_path / "published"], log=None)
    result = cached(big_array, 1000, counter, cache=session)
    assert counter.calls == 1 and session.stats.hits == 1
    np.testing.assert_array_equal(result, np.arange(1000, dtype=np.float32))
    assert len(session.list()) == 1  # copied in: this session's output is a complete cache


def test_seed_with_mismatching_manifest_is_not_loaded(tmp_path: Path) -> None:
    counter = Counter()
    published = Cache(tmp_path / "published", log=None)
    cached(big_array, 1000, counter, cache=published)
    manifest = next((tmp_path / "published").glob("*/manifest.json"))
    manifest.write_text(manifest.read_text().replace('"key": "', '"key": "0'))
    session = Cache(tmp_path / "working", seed_dirs=[tmp_path / "published"], log=None)
    with pytest.warns(CacheWarning, match="manifest is for key"):
        cached(big_array, 1000, counter, cache=session)
    assert counter.calls == 2
    assert '"key": "0' in manifest.read_text()  # the read-only seed is never rewritten


# ------------------------------------------------------------------------------------------------- housekeeping


def test_list_size_and_clear_stay_inside_the_cache(cache: Cache, tmp_path: Path) -> None:
    counter = Counter()
    cached(big_array, 10, counter, cache=cache, name="a")
    cached(big_array, 20, counter, cache=cache, name="b")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    (cache.dir / "link").symlink_to(outside, target_is_directory=True)
    table = cache.list()
    assert list(table.columns[:5]) == ["key", "name", "size", "created", "build_s"]
    assert sorted(table["name"]) == ["a", "b"] and cache.size_bytes() >= table["size"].sum() > 0
    assert cache.clear(older_than=3600) == 0
    assert cache.clear(name="a") == 1 and list(cache.list()["name"]) == ["b"]
    assert cache.clear() == 1 and cache.list().empty
    assert (outside / "keep.txt").exists() and cache.dir.exists()


def test_cli_cache_list_size_clear(cache: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    from kitlib.cli import main

    cached(big_array, 10, Counter(), cache=cache, name="tokens")
    assert main(["cache", "list", "--dir", str(cache.dir)]) == 0
    assert "tokens" in capsys.readouterr().out
    assert main(["cache", "size", "--dir", str(cache.dir)]) == 0
    assert "1 entries" in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(cache.dir)]) == 2  # not a tty and no --yes
    assert "--yes" in capsys.readouterr().err and len(cache.list()) == 1
    assert main(["cache", "clear", "--dir", str(cache.dir), "--name", "other", "--yes"]) == 0
    assert len(cache.list()) == 1
    assert main(["cache", "clear", "--dir", str(cache.dir), "--yes"]) == 0
    assert cache.list().empty


def test_default_cache_dir_follows_the_platform(tmp_path: Path) -> None:
    assert default_cache_dir({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}) == Path("/kaggle/working/kitlib-cache")
    assert default_cache_dir({}, cwd=tmp_path) == tmp_path / ".kitlib-cache"
    override = {"KITLIB_CACHE_DIR": str(tmp_path / "x"), "KAGGLE_URL_BASE": "y"}
    assert default_cache_dir(override) == tmp_path / "x"


def _plant_pickle(entry: Path, proof: Path) -> None:
    """Replace an entry's data by a pickle that creates ``proof`` when unpickled, with matching checksums: whoever can
    write into a cache folder (or publish a seed) can also write those."""
    import hashlib
    import json
    import pickle

    class Plant:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.touch, (proof,))

    payload = pickle.dumps(Plant(), protocol=5)
    for name in ("data.json", "buffers.bin"):
        (entry / name).unlink(missing_ok=True)
    (entry / "data.pkl").write_bytes(payload)
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["files"] = {"data.pkl": {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    manifest["buffers"] = []
    (entry / "manifest.json").write_text(json.dumps(manifest))


def test_a_planted_pickle_with_matching_checksums_is_refused_and_never_runs(cache: Cache, tmp_path: Path) -> None:
    """Checksums prove nothing about who wrote an entry: the cache never unpickles, so a planted pickle is rebuilt."""
    counter = Counter()
    expected = cached(big_array, 10, counter, cache=cache)
    entry = next(p for p in cache.dir.iterdir() if p.name.startswith("big_array-"))
    proof = tmp_path / "the planted code ran"
    _plant_pickle(entry, proof)
    with pytest.warns(CacheWarning, match=r"pickle in this cache .* not unpickled"):
        again = cached(big_array, 10, counter, cache=cache)
    assert not proof.exists()
    np.testing.assert_array_equal(again, expected)  # rebuilt from the inputs instead
    assert counter.calls == 2
    with pytest.warns(CacheWarning, match="never pickles"):
        assert cached(a_set, 3, counter, cache=cache) == {0, 1, 2}  # not arrays: returned, not stored
    assert not list(cache.dir.glob("*/data.pkl"))


def test_a_seed_serves_its_arrays_but_never_its_pickles(tmp_path: Path) -> None:
    """A seed is someone else's folder (an attached kernel output): its arrays load, a pickle in it never runs."""
    elsewhere = tmp_path / "previous-kernel" / "kitlib-cache"
    counter = Counter()
    cached(big_array, 10, counter, cache=Cache(elsewhere, log=None))
    cached(big_array, 11, counter, cache=Cache(elsewhere, log=None))
    proof = tmp_path / "the planted code ran"
    _plant_pickle(next(p for p in elsewhere.iterdir() if p.name.startswith("big_array-")), proof)
    mine = Cache(tmp_path / "mine", seed_dirs=[elsewhere], log=None)
    with pytest.warns(CacheWarning, match=r"pickle in a seed cache .* not unpickled"):
        for n in (10, 11):
            np.testing.assert_array_equal(cached(big_array, n, counter, cache=mine), np.arange(n, dtype=np.float32))
    assert counter.calls == 3 and mine.stats.hits == 1  # the arrays: a hit; the pickle: rebuilt here, never run
    assert not proof.exists()


def test_featurisation_results_are_stored_without_pickle_and_come_back_equal(cache: Cache) -> None:
    import torch

    from kitlib.data.featurize import TokenizedTexts

    rows = [np.arange(i % 7 + 1, dtype=np.int32) for i in range(100)]  # ragged: flat + offsets

    def featurise(n: int) -> dict[str, object]:
        return {
            "tokens": TokenizedTexts(np.arange(n, dtype=np.int32), np.array([0, 2, n], dtype=np.int64), max_length=8),
            "embeddings": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
            "rows": rows,
            "pair": (np.float32(1.5), float("nan"), "text", None, True),
        }

    first = cached(featurise, 5, cache=cache)
    entry = next(p for p in cache.dir.iterdir() if p.name.startswith("featurise-"))
    assert sorted(p.name for p in entry.iterdir()) == ["buffers.bin", "data.json", "manifest.json"]
    again = cached(featurise, 5, cache=Cache(cache.dir, log=None))
    assert cache.stats.misses == 1
    tokens = again["tokens"]
    assert isinstance(tokens, TokenizedTexts) and tokens.max_length == 8
    np.testing.assert_array_equal(tokens.ids, first["tokens"].ids)
    assert again["embeddings"].dtype == torch.bfloat16 and torch.equal(again["embeddings"], first["embeddings"])
    assert type(again["rows"]) is list and all(np.array_equal(a, b) for a, b in zip(again["rows"], rows, strict=True))
    value, nan, text, none, flag = again["pair"]
    assert type(value) is np.float32 and value == 1.5 and np.isnan(nan) and (text, none, flag) == ("text", None, True)


def test_a_planted_data_json_cannot_name_code_outside_kitlib(cache: Cache, tmp_path: Path) -> None:
    import hashlib
    import json

    counter = Counter()
    cached(big_array, 10, counter, cache=cache)
    entry = next(p for p in cache.dir.iterdir() if p.name.startswith("big_array-"))
    proof = tmp_path / "the planted code ran"
    tree = json.dumps({"dataclass": "pathlib:Path.touch", "fields": {"self": str(proof)}}).encode()
    (entry / "data.json").write_bytes(tree)
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["files"]["data.json"] = {"bytes": len(tree), "sha256": hashlib.sha256(tree).hexdigest()}
    (entry / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(CacheWarning, match="only kitlib's own classes"):
        cached(big_array, 10, counter, cache=cache)
    assert not proof.exists() and counter.calls == 2


def test_01_says_what_the_cache_did_in_one_line(
    tmp_path: Path, cpu_hw: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """01 printed `cache miss tokens[...] built in 0.5 s, stored 1.2 MB` once per token table (three of them)."""
    from demos.reviews import make_demo
    from kitlib.notebook import stages

    make_demo(tmp_path / "data")
    p = stages.params(data_dir=tmp_path / "data", work_dir=tmp_path / "work", preset="smoke", model="tiny")
    stages.setup(p, cpu_hw)
    for again in (False, True):
        capsys.readouterr()
        stages.features(p, hw=cpu_hw)
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cache")]
        assert len(said) == 1 and said[0].startswith("cache: "), said
        assert (" 0 misses" in said[0]) is again  # the second run: every entry a hit, in the same one line
