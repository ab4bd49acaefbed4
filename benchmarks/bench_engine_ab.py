"""fit against a bare loop, old kitlib against new, in one process (interleaved rounds; whole calls as
bench_engine.py's throughput part, set-up included). The old kitlib is a renamed copy importable as ``kitlib_old``:

    mkdir -p /tmp/old && git archive <commit> kitlib | tar -x -C /tmp/old && mv /tmp/old/kitlib /tmp/old/kitlib_old
    grep -rl kitlib /tmp/old/kitlib_old | xargs sed -i -E 's/\\bkitlib\\b/kitlib_old/g'
    PYTHONPATH=/tmp/old:. taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/bench_engine_ab.py --repeats 21
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_engine as b

from kitlib.machine.hardware import fake_profile


def main() -> None:
    import kitlib_old  # type: ignore[import-not-found]
    from kitlib_old.machine.hardware import fake_profile as old_profile  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("steps", 200), ("batch", 4), ("length", 16), ("hidden", 32), ("layers", 1), ("repeats", 9)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    hw, old_hw = (profile("CPU", platform="local", interactive=False) for profile in (fake_profile, old_profile))

    def old_fit(model: Any, batches: Any) -> Any:
        config = kitlib_old.TrainConfig(epochs=1, lr=1e-4, schedule="constant", warmup_ratio=0.0, precision="fp32",
                                        log_every_steps=10_000, save_best=False)  # fmt: skip
        return kitlib_old.fit(model, b.loader_of(batches), config=config, hw=old_hw)

    sides = {"bare": lambda m, bs: b.bare_loop(m, bs, 1e-4), "old": old_fit,
             "new": lambda m, bs: b.kitlib_fit(m, bs, 1e-4, hw)}  # fmt: skip
    batches = b.make_batches(args.steps, args.batch, args.length)
    for run in sides.values():  # warm-up
        run(b.make_model(args.hidden, args.layers), batches[:5])
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.repeats):
        for name, run in sides.items():
            model = b.make_model(args.hidden, args.layers)
            start = clock()
            run(model, batches)
            times[name].append(clock() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    print(f"{args.steps} steps x batch {args.batch} x {args.length} tokens, hidden {args.hidden}, {args.layers} "
          f"layer(s), fp32, {args.repeats} interleaved rounds, {args.clock} clock")  # fmt: skip
    print("| side | ms/step (median) | fit / bare loop (medians) | (minimums) |\n| --- | --- | --- | --- |")
    for name in sides:
        print(f"| {name} | {1e3 * med[name] / args.steps:.2f} | {med['bare'] / med[name]:.3f} | "
              f"{low['bare'] / low[name]:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
