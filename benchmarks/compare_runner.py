"""Two checkouts' notebook runners side by side: 00_setup headless on smoke (the reviews demo, model tiny) and the
runner's imports, each child pinned (taskset -c 1, OMP_NUM_THREADS=1), the trees interleaved; medians.

    python benchmarks/compare_runner.py BEFORE_TREE AFTER_TREE [ROUNDS]   # e.g. /work/main . 3
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TREES = {"before": os.path.abspath(sys.argv[1]), "after": os.path.abspath(sys.argv[2])}
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
base = Path(tempfile.mkdtemp(prefix="runbench-"))
pin = ["taskset", "-c", "1", "env", "OMP_NUM_THREADS=1"]
env0 = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
subprocess.run(
    [sys.executable, "-c", f"from demos.reviews import make_demo; make_demo({str(base / 'demo')!r})"],
    env=env0 | {"PYTHONPATH": TREES["after"]},
    check=True,
    cwd=TREES["after"],
)
IMPORTS = {  # what run_notebooks imports lazily: nbclient directly (main 15483e1), papermill (#50)
    "before": "import nbformat; from nbclient import NotebookClient; from traitlets.config import Config",
    "after": "import papermill; from jupyter_client.manager import AsyncKernelManager; import nbclient.exceptions",
}
RUN = (
    "import time; from pathlib import Path; from kitlib.notebook.runbook import run_notebooks\n"
    "t = time.perf_counter()\n"
    "run_notebooks(Path({out!r}), names=['00_setup.ipynb'], parameters={{'data_dir': {data!r}, 'work_dir': {work!r}, "
    "'preset': 'smoke', 'model': 'tiny'}})\n"
    "print(time.perf_counter() - t)"
)
res = {k: {"run_s": [], "module_import_s": [], "runner_imports_s": []} for k in TREES}
for r in range(rounds):
    for name, tree in TREES.items() if r % 2 == 0 else reversed(list(TREES.items())):
        env = env0 | {"PYTHONPATH": tree}
        for key, code in (("module_import_s", "import kitlib.notebook.runbook"), ("runner_imports_s", IMPORTS[name])):
            t = time.perf_counter()
            subprocess.run([*pin, sys.executable, "-c", code], env=env, check=True, cwd=tree)
            res[name][key].append(time.perf_counter() - t)
        out = base / f"{name}{r}"
        p = subprocess.run(
            [
                *pin,
                sys.executable,
                "-c",
                RUN.format(out=str(out / "executed"), data=str(base / "demo"), work=str(out / "work")),
            ],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        res[name]["run_s"].append(float(p.stdout.strip().splitlines()[-1]))
        size = (out / "executed" / "00_setup.ipynb").stat().st_size
        print(name, r, {k: round(v[-1], 2) for k, v in res[name].items()}, f"executed {size} B", flush=True)
print("medians:")
for key in res["before"]:
    b, a = (statistics.median(res[n][key]) for n in TREES)
    print(f"  {key}: before {b:.2f} s, after {a:.2f} s, after/before {a / b:.2f}")
print(json.dumps(res))
shutil.rmtree(base, ignore_errors=True)
