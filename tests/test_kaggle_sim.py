"""Pushed kernels, run as Kaggle runs them (tests/kaggle_sim.py): read-only /kaggle/input mounts, a Batch run, no
network, kitlib not installed until the kernel installs it from the attached wheels dataset. Both ways a user
builds them with `python -m kitlib kaggle build`: the four-kernel chain planned for Kaggle's T4 x2 (rehearsed on the
CPU: KIT_REHEARSE=1), and one kernel running every stage."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import kaggle_sim
import pandas as pd
import pytest

from demos import cut_demo
from kitlib.cli import kernel_tool

kg = kernel_tool()  # kaggle/kernels.py of the checkout
REASON = kaggle_sim.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"Kaggle simulation: {REASON}")
N_TRAIN, N_TEST = 200, 40


def _competition(folder: Path) -> Path:
    folder.mkdir(parents=True)
    words = ("great", "lovely", "superb", "awful", "dull", "boring")
    frame = pd.DataFrame(
        {"id": [f"r{i}" for i in range(N_TRAIN + N_TEST)],
         "text": [f"a {words[i % 6]} film " + "long " * (i % 5) for i in range(N_TRAIN + N_TEST)],
         "label": [("pos", "neg")[i % 6 // 3] for i in range(N_TRAIN + N_TEST)]}
    )  # fmt: skip
    frame.iloc[:N_TRAIN].to_csv(folder / "train.csv", index=False)
    frame.iloc[N_TRAIN:][["id", "text"]].to_csv(folder / "test.csv", index=False)
    frame.iloc[N_TRAIN:][["id"]].assign(label="pos").to_csv(folder / "sample_submission.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kaggle-sim")
    project = Path(__file__).resolve().parents[1]
    image = kaggle_sim.make_image(root)
    assert not kaggle_sim.imports_kitlib(image)  # the image has torch and the rest, not kitlib
    return {
        "root": root,
        "image": image,
        "wheels": kaggle_sim.build_wheels(project, root / "wheels"),
        "data": _competition(root / "competition"),
    }


def _check_submission(working: Path, data: Path) -> None:
    submission = pd.read_csv(working / "submission.csv")
    sample = pd.read_csv(data / "sample_submission.csv")
    assert list(submission.columns) == list(sample.columns)
    assert submission["id"].tolist() == sample["id"].tolist() and set(submission["label"]) <= {"pos", "neg"}


def _build(kaggle: dict[str, Path], out: str, **options: Any) -> list[Path]:
    options.setdefault("parameters", {"preset": "smoke", "model": "tiny"})
    return kg.build_kernels(
        kaggle["root"] / out, username="me", slug_prefix="kit", competition="movie-reviews", dataset_sources=[],
        wheels_dataset="me/kitlib-wheels", **options,
    )  # fmt: skip


def test_a_kernel_without_the_wheels_dataset_says_what_to_attach(kaggle: dict[str, Path]) -> None:
    (folder,) = _build(kaggle, "no-wheels", single=True)
    run = kaggle_sim.run_kernel(
        folder,
        sources={"movie-reviews": kaggle["data"], "me/kitlib-wheels": kaggle["data"]},  # attached, but no wheels
        outputs=kaggle["root"] / "outputs-no-wheels",
        image=kaggle["image"],
        scratch=kaggle["root"] / "scratch-no-wheels",
    )
    assert run.returncode != 0
    assert "kitlib is not installed, and no kitlib-*.whl is in wheels_dir=" in run.log
    assert "attach the wheels dataset (python -m kitlib kaggle wheels)" in run.log


def _cli_build(kaggle: dict[str, Path], out: str, preset: str, *extra: str) -> list[Path]:
    """Kernel folders as a user builds them: `python -m kitlib kaggle build` (here its main(), in-process)."""
    from kitlib.cli import main

    folder = kaggle["root"] / out
    args = ["kaggle", "build", "--username", "me", "--slug-prefix", "kit", "--competition", "movie-reviews"]
    args += ["--wheels-dataset", "me/kitlib-wheels", "--preset", preset, "--model", "tiny", "--out", str(folder)]
    assert main([*args, *extra]) == 0
    return sorted(p for p in folder.iterdir() if p.is_dir())


# The grids of presets (and the demos' tasks): every row in scripts/test.sh's run; scripts/test_hosted_pins.sh runs
# the first only (-m "not kaggle_grid"), as the other rows test kitlib's presets and tasks again, not the hosted pins,
# and each costs 10-60 CPU seconds (a chain row: four kernels, each installing kitlib and importing torch).
GRID = pytest.mark.kaggle_grid
# The chain runs two rows, one per route its plan takes: smoke (02 trains the model in 2 rehearsed gloo processes)
# and fast (01 on a GPU kernel builds frozen features, 02 trains a head in 1 process). balanced plans smoke's route
# (test_the_balanced_chain_is_planned_as_smokes, below, checks it); its preset runs whole in the two-session test
# (three single kernels of balanced), so its chain row (~2 min of CI's 2 cores) ran nothing smoke's row and that miss.
# smoke's row runs at the hosted pins (scripts/test_hosted_pins.sh selects -m hosted_pins beside its other tests),
# and in CI only there: .ci/run's slow step leaves it out, fast's row running the chain at the newest versions.
CHAIN_ROUTES = [pytest.param("smoke", marks=pytest.mark.hosted_pins), pytest.param("fast", marks=GRID)]
SINGLE_ROWS = ["smoke", pytest.param("fast", marks=GRID)]


@GRID  # balanced's plan: kitlib's presets, not the hosted pins
def test_the_balanced_chain_is_planned_as_smokes(tmp_path: Path) -> None:
    # The kernels' machines as built: CPU kernels for 00 and 01, the GPU for 02 and 03, as smoke's chain (the chain
    # test asserts smoke's and fast's). Were balanced to plan another route, it would need a chain row of its own.
    built = _cli_build({"root": tmp_path}, "chain-balanced", "balanced")  # 4 kernels, each validated: ~1 s each
    metas = [json.loads((f / kg.METADATA_FILE).read_text()) for f in built]
    assert [f.name for f in built] == ["00_setup", "01_features", "02_train", "03_infer"]
    assert [m["enable_gpu"] for m in metas] == [False, False, True, True]


@pytest.mark.slow  # over 20 s on 2 cores: CI runs it (.ci/run), the test command does not
@pytest.mark.parametrize("preset", CHAIN_ROUTES)
def test_the_chain_planned_for_2xt4_runs_to_a_submission_rehearsed_on_cpu(kaggle: dict[str, Path], preset: str) -> None:
    # As built: 00 (and 01 but for fast) on CPU kernels plan for 02's T4 x2. This simulation has no GPU, so every
    # kernel gets KIT_REHEARSE=1, as a user rehearsing the chain before spending GPU quota: 02 trains the plan in two
    # gloo processes on the CPU (one for fast, which trains a head), 03 predicts there, in the CPU's precision.
    from kitlib.machine.hardware import detect
    from kitlib.machine.precision import decide_stage_precision

    folders = _cli_build(kaggle, f"chain-{preset}", preset)
    metas = [json.loads((f / kg.METADATA_FILE).read_text()) for f in folders]
    assert [m["enable_gpu"] for m in metas] == [False, preset == "fast", True, True]  # the GPU where it is used
    outputs, scratch = kaggle["root"] / f"outputs-{preset}", kaggle["root"] / f"scratch-{preset}"
    sources = {"movie-reviews": kaggle["data"], "me/kitlib-wheels": kaggle["wheels"]}
    runs = {}
    for folder in folders:
        runs[folder.name] = run = kaggle_sim.run_kernel(
            folder, sources=sources, outputs=outputs, image=kaggle["image"], scratch=scratch,
            env={"KIT_REHEARSE": "1"},
        )  # fmt: skip
        assert run.returncode == 0, f"{folder.name} failed:\n{run.log[-3000:]}"
        assert kaggle_sim.imports_kitlib(run.venv)  # the kernel installed it from the wheels dataset
        executed = json.loads(run.executed.read_text())
        install = next(c for c in executed["cells"] if "install" in c["metadata"].get("tags", []))
        assert install["outputs"] == [] and install["execution_count"]  # ran (kitlib was absent), quietly
    working = {name: run.working for name, run in runs.items()}
    assert sorted(p.name for p in working["00_setup"].iterdir()) == ["params.json", "run.json"]
    planned = json.loads((working["01_features"] / "features.json").read_text())["run"]  # 01 resolves 00's choice
    assert planned["config"]["precision"] == "fp16" and "Tesla T4" in planned["hardware"]
    assert planned["world_size"] == (1 if preset == "fast" else 2)  # fast trains a head: no DDP
    assert (working["01_features"] / "features.json").is_file() and (working["01_features"] / "kitlib-cache").is_dir()
    assert (working["02_train"] / "run" / "best" / "model.safetensors").is_file()
    # what really ran: the planned processes, on the CPU, in the precision the CPU runs (the run record says so)
    ran = decide_stage_precision(dataclasses.replace(detect(), accelerators=()), planned["preset"]["precision"]).dtype
    facts = json.loads((working["02_train"] / "run" / "timing.json").read_text())["run"]
    assert (facts["world_size"], facts["device_type"], facts["precision"]) == (planned["world_size"], "cpu", ran)
    for name, processes in (("02_train", planned["world_size"]), ("03_infer", 1)):
        who = (
            f"{processes} gloo processes on this machine's CPU stand" if processes > 1 else "this machine's CPU stands"
        )
        assert f"rehearsal: {who} in for 2xT4" in _printed(runs[name].executed)
    _check_submission(working["03_infer"], kaggle["data"])


def _printed(executed: Path) -> str:
    """What an executed notebook's cells printed."""
    cells = json.loads(executed.read_text())["cells"]
    streams = [o["text"] for c in cells for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    return "".join("".join(text) if isinstance(text, list) else text for text in streams)  # nbformat: either


# smoke and fast: balanced's single kernel is the two-session test's reference run (below: a single kernel of the
# balanced preset to a checked submission), so CI ran it twice; `kaggle build --single` from
# the command line is the two rows here.
@pytest.mark.parametrize("preset", SINGLE_ROWS)
def test_the_single_kernel_runs_every_preset_to_a_submission(kaggle: dict[str, Path], preset: str) -> None:
    # One GPU session on Kaggle; here the CPU stands in for the T4 x2 (the kernel plans for the machine it is on).
    # smoke's runs on an older image: /kaggle/input/<slug> (the generated paths are the current layout's).
    (folder,) = _cli_build(kaggle, f"single-{preset}", preset, "--single")
    assert json.loads((folder / kg.METADATA_FILE).read_text())["machine_shape"] == "NvidiaTeslaT4"
    run = kaggle_sim.run_kernel(
        folder,
        sources={"movie-reviews": kaggle["data"], "me/kitlib-wheels": kaggle["wheels"]},
        outputs=kaggle["root"] / f"outputs-single-{preset}",
        image=kaggle["image"],
        scratch=kaggle["root"] / f"scratch-single-{preset}",
        layout="old" if preset == "smoke" else "current",
    )
    assert run.returncode == 0, run.log[-3000:]
    _check_submission(run.working, kaggle["data"])


DEMO_ROWS = 600  # training rows a demo row keeps (a quarter as many test rows)


@pytest.mark.slow
# tabular-text only: the reviews demo ("auto") takes this route's every step but its data (`kaggle build --params
# demo.json`, four --gpu none kernels, the score), and its data runs through the four notebooks in CI's main job
# (.ci/run: scripts/demo.sh at smoke, demo.json) and again at the hosted pins (scripts/test_hosted_pins.sh).
@pytest.mark.parametrize("task", [pytest.param("tabular-text", marks=GRID)])
def test_a_demo_built_from_its_demo_json_runs_to_a_scored_submission(
    task: str, kaggle: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # What a user types: the demo's demo.json names its columns, task and metric; nothing is edited by hand.
    from kitlib.cli import main

    root = kaggle["root"] / f"demo-{task}"
    data = root / "data"
    assert main(["demo", str(data), "--task", task]) == 0
    cut_demo(data, DEMO_ROWS)  # whole, a row took 6-7 min under CI load
    slug = f"demo-{task}"
    build = ["kaggle", "build", "--username", "me", "--competition", slug, "--params", str(data / "demo.json"),
             "--preset", "smoke", "--gpu", "none", "--wheels-dataset", "me/kitlib-wheels",
             "--out", str(root / "k")]  # fmt: skip
    assert main(build) == 0
    folders = sorted((root / "k").iterdir())
    sources = {slug: data, "me/kitlib-wheels": kaggle["wheels"]}
    for folder in folders:
        run = kaggle_sim.run_kernel(
            folder, sources=sources, outputs=root / "outputs", image=kaggle["image"], scratch=root / "scratch"
        )
        assert run.returncode == 0, f"{folder.name} failed:\n{run.log[-3000:]}"
    submission = root / "outputs" / f"kitlib-{slug}-03-infer" / "submission.csv"
    sample = pd.read_csv(data / "sample_submission.csv")
    written = pd.read_csv(submission)
    assert list(written.columns) == list(sample.columns) and written["id"].tolist() == sample["id"].tolist()
    capsys.readouterr()
    assert main(["score", str(data / "solution.csv"), str(submission)]) == 0  # scored with the demo's metric
    print(capsys.readouterr().out)


def _weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run_dir / "best" / "model.safetensors")


@pytest.mark.slow  # three single kernels of the balanced preset: ~3-6 min on 2 busy cores
def test_a_run_split_by_time_budget_over_two_sessions_ends_with_the_uninterrupted_weights(
    kaggle: dict[str, Path],
) -> None:
    # Session 1 stops at its time_budget with run.new/last in its output (balanced keeps no periodic last/); session
    # 2, built with --continue-from and attached to that output read-only, continues it to the end. The budget is
    # counted on a fake clock (100 s a step): 3150 s = 0.875 h stop it after step 30 (epoch 2 of 2, 23+ steps each)
    # whatever the machine's load. Both must give the weights and the submission of one uninterrupted session.
    params = {"preset": "balanced", "model": "tiny"}
    sources = {"movie-reviews": kaggle["data"], "me/kitlib-wheels": kaggle["wheels"]}
    root = kaggle["root"]

    def run(folder: Path, outputs: str, env: dict[str, str] | None = None) -> kaggle_sim.KernelRun:
        done = kaggle_sim.run_kernel(folder, sources=sources, outputs=root / outputs, image=kaggle["image"],
                                     scratch=root / f"scratch-{outputs}", env=env)  # fmt: skip
        assert done.returncode == 0, f"{folder.name} failed:\n{done.log[-3000:]}"
        return done

    (whole,) = _build(kaggle, "budget-whole", single=True, parameters=params)
    reference = run(whole, "outputs-budget-whole")
    (first,) = _build(kaggle, "budget-s1", single=True, parameters=params | {"time_budget": 0.875})
    stopped = run(first, "outputs-budget", kaggle_sim.fake_clock(root / "clock", step_s=100))
    said = _printed(stopped.executed)
    assert "stopped by the time budget" in said and "no submission in this session" in said
    assert (stopped.working / "run.new" / "last").is_dir() and not (stopped.working / "run").exists()
    assert not (stopped.working / "submission.csv").exists()
    last = json.loads((stopped.working / "run.new" / "last" / "meta.json").read_text())
    assert last["step"] == 30, last  # the fake clock's stop, not the load's

    kernel = json.loads((first / kg.METADATA_FILE).read_text())["id"]
    (second,) = _build(kaggle, "budget-s2", single=True, parameters=params | {"time_budget": 0.875},
                       continue_from=kernel)  # fmt: skip
    meta = json.loads((second / kg.METADATA_FILE).read_text())
    assert meta["kernel_sources"] == [kernel] and meta["id"] == f"{kernel}-s2"
    continued = run(second, "outputs-budget")  # the same outputs/: the earlier session's is mounted read-only
    assert "continuing the interrupted run" in _printed(continued.executed)
    _check_submission(continued.working, kaggle["data"])
    ours, theirs = _weights(continued.working / "run"), _weights(reference.working / "run")
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
    assert (continued.working / "submission.csv").read_bytes() == (reference.working / "submission.csv").read_bytes()


def _readme_build(kaggle: dict[str, Path], out: str) -> Path:
    """The kernel folder of the README's route 1, built by its `kaggle build` command as written (ME and COMP filled
    in; the smoke preset and the tiny model added, as any parameter may be)."""
    from kitlib.cli import main

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    route = readme.split("1. **Interactive, on Kaggle.**", 1)[1].split("\n2. ", 1)[0]
    command = " ".join(route.split("`python -m kitlib ", 1)[1].split("`", 1)[0].split())
    args = command.replace("ME", "me").replace("COMP", "movie-reviews").split()
    assert main([*args, "--preset", "smoke", "--model", "tiny", "--out", str(kaggle["root"] / out)]) == 0
    (folder,) = (kaggle["root"] / out).iterdir()
    assert (folder / "all_stages.ipynb").is_file()  # the file the README says to import
    return folder


def test_the_readmes_interactive_route_ends_with_a_submission(kaggle: dict[str, Path]) -> None:
    # Route 1: the all-stages notebook imported on kaggle.com, the competition and the wheels dataset added, Run All
    # in the editor: an interactive session (the picker shows), not a pushed Batch run.
    folder = _readme_build(kaggle, "readme-interactive")
    run = kaggle_sim.run_kernel(
        folder,
        sources={"movie-reviews": kaggle["data"], "me/kitlib-wheels": kaggle["wheels"]},
        outputs=kaggle["root"] / "outputs-readme-interactive",
        image=kaggle["image"],
        scratch=kaggle["root"] / "scratch-readme-interactive",
        env={"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
    )
    assert run.returncode == 0, run.log[-3000:]
    _check_submission(run.working, kaggle["data"])


def test_the_readmes_colab_route_finds_drive_by_itself_and_ends_with_a_submission(kaggle: dict[str, Path]) -> None:
    # README "On Colab": the data and the wheels uploaded to Drive folders, the same notebook opened in Colab, Run
    # All. Simulated: Colab's kernel (google.colab imported, COLAB_RELEASE_TAG), drive.mount linking a folder, no
    # /kaggle. Not simulated: the sign-in, Drive's own file system (its renames), Colab's image and GPU.
    drive = kaggle["root"] / "colab-drive"
    shutil.copytree(kaggle["data"], drive / "MyDrive" / "movie-reviews")
    shutil.copytree(kaggle["wheels"], drive / "MyDrive" / "kitlib-wheels")
    folder = _readme_build(kaggle, "readme-colab")
    run = kaggle_sim.run_kernel(folder, sources={}, outputs=kaggle["root"] / "outputs-readme-colab",
                                image=kaggle["image"], scratch=kaggle["root"] / "scratch-readme-colab",
                                colab_drive=drive)  # fmt: skip
    assert run.returncode == 0, run.log[-3000:]
    mine = "/content/drive/MyDrive"
    said = f"Colab: data_dir {mine}/movie-reviews, wheels_dir {mine}/kitlib-wheels, work_dir {mine}/kitlib-work"
    assert said in _printed(run.executed)
    assert kaggle_sim.imports_kitlib(run.venv)  # installed from the Drive folder's wheels
    _check_submission(drive / "MyDrive" / "kitlib-work", kaggle["data"])


# ------------------------------------------------------------------------------------ a code competition's rerun


def _hidden(folder: Path, data: Path, n: int = 3 * N_TEST) -> Path:
    """The rerun's data: ``data``'s train.csv, a hidden test set of 3x the rows under new ids, and its answers."""
    folder.mkdir(parents=True)
    (folder / "train.csv").write_bytes((data / "train.csv").read_bytes())
    words = ("great", "lovely", "superb", "awful", "dull", "boring")
    test = pd.DataFrame({"id": [f"hidden-{i}" for i in range(n)],
                         "text": [f"a {words[i % 6]} film " + "long " * (i % 4) for i in range(n)]})  # fmt: skip
    test.to_csv(folder / "test.csv", index=False)
    test[["id"]].assign(label="pos").to_csv(folder / "sample_submission.csv", index=False)
    labels = [("pos", "neg")[i % 6 // 3] for i in range(n)]
    test[["id"]].assign(label=labels).to_csv(folder / "solution.csv", index=False)
    return folder


@pytest.mark.slow  # two kernels (train 3 folds, then inference on the hidden rows) and a publish: 40-90 s on 2 cores
def test_a_published_run_predicts_a_hidden_test_set_offline_and_never_trains(
    kaggle: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # One row: the fold ensemble published as a Kaggle Model (model_sources, attached at a version). It was two (1
    # fold as a Model, 3 folds as a dataset): a dataset's publish and --infer-from, with one published model, are
    # the LoRA adapter's route below.
    from kitlib.cli import main

    folds = 3
    root = kaggle["root"] / f"rerun-{folds}"
    (train,) = _cli_build(kaggle, f"rerun-{folds}/train", "smoke", "--single", "--folds", str(folds))
    wheels = {"me/kitlib-wheels": kaggle["wheels"]}
    trained = kaggle_sim.run_kernel(
        train, sources={"movie-reviews": kaggle["data"], **wheels}, outputs=root / "outputs",
        image=kaggle["image"], scratch=root / "scratch",
    )  # fmt: skip
    assert trained.returncode == 0, trained.log[-3000:]
    published = root / "published"
    source = "me/movie-model/pyTorch/v1/1"  # a Model is attached at a version
    upload = ["--model-id", "me/movie-model/pyTorch/v1"]
    assert main(["kaggle", "publish", "--work-dir", str(trained.working), "--out", str(published), *upload]) == 0
    assert (published / "model-instance-metadata.json").is_file()
    assert sorted(p.name for p in published.glob("run*/best")) == ["best"] * folds
    runs = sorted(p.name for p in published.glob("run*") if p.is_dir())
    assert runs == ["run", *(f"run-fold{k}" for k in range(2, folds + 1))]
    build = ["kaggle", "build", "--username", "me", "--slug-prefix", "kit", "--competition", "movie-reviews",
             "--wheels-dataset", "me/kitlib-wheels", "--infer-from", source, "--out", str(root / "k")]  # fmt: skip
    assert main(build) == 0
    hidden = _hidden(root / "hidden", kaggle["data"])
    infer = kaggle_sim.run_kernel(
        root / "k" / kg.INFER_NAME, sources={"movie-reviews": hidden, source: published, **wheels},
        outputs=root / "outputs", image=kaggle["image"], scratch=root / "scratch",
    )  # fmt: skip
    assert infer.returncode == 0, infer.log[-3000:]
    submission = pd.read_csv(infer.working / "submission.csv")  # where Kaggle looks: /kaggle/working
    assert submission["id"].tolist() == [f"hidden-{i}" for i in range(3 * N_TEST)]
    assert set(submission["label"]) <= {"pos", "neg"}
    printed = _printed(infer.executed)
    assert "inference only (02 does not run): predicted " in printed  # before any work: the first line it prints
    assert f" for {3 * N_TEST} test rows (measured: " in printed
    assert f"x {folds} model(s)), inference_limit 9 h" in printed
    assert "predict (run" in printed and "train:" not in printed  # predicted; no training progress bar
    assert not list(infer.working.glob("run*/last")) and not list(infer.working.glob("*.new"))  # nothing trained
    assert sorted(p.name for p in (infer.working / "features").glob("*")) == []  # 01's arrays never built
    capsys.readouterr()
    assert main(["score", str(hidden / "solution.csv"), str(infer.working / "submission.csv")]) == 0
    print(capsys.readouterr().out)


@pytest.mark.slow  # a LoRA fine-tune of a 2-layer Llama, then the inference kernel generating: 60-120 s on 2 cores
def test_a_published_lora_adapter_predicts_a_hidden_test_set_with_its_base_attached(
    kaggle: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # The adapter alone is published (best/ holds the LoRA weights); the base model is a dataset of its own, attached
    # to both kernels at the same mount, as a user attaches a Kaggle copy of a pretrained model.
    from sft_fixtures import llama_folder, sft_frame, write_competition

    from kitlib.cli import main

    root = kaggle["root"] / "rerun-lora"
    frame = sft_frame(48)
    data = write_competition(root / "data", frame.copy())
    base = llama_folder(root / "llama", [*frame["prompt"], *frame["response"]], positions=256)
    common = ["--username", "me", "--slug-prefix", "kit", "--competition", "sft", "--wheels-dataset",
              "me/kitlib-wheels", "--dataset", "me/base-llama", "--gpu", "none"]  # fmt: skip
    train = ["kaggle", "build", *common, "--single", "--preset", "smoke", "--task", "causal-lm", "--text", "prompt",
             "--target", "response", "--metric", "exact_match", "--adapter", "lora",
             "--model", kg.mount_path("datasets", "me/base-llama"), "--out", str(root / "train")]  # fmt: skip
    assert main(train) == 0
    sources = {"me/kitlib-wheels": kaggle["wheels"], "me/base-llama": base}
    trained = kaggle_sim.run_kernel(
        root / "train" / kg.SINGLE_NAME, sources={"sft": data, **sources}, outputs=root / "outputs",
        image=kaggle["image"], scratch=root / "scratch",
    )  # fmt: skip
    assert trained.returncode == 0, trained.log[-3000:]
    published = root / "published"
    assert main(["kaggle", "publish", "--work-dir", str(trained.working), "--out", str(published),
                 "--dataset-id", "me/sft-adapter"]) == 0  # fmt: skip
    card = json.loads((published / "kitlib-model.json").read_text())
    assert card["adapter"] == "lora" and card["limits"]["fallback"] in {"fresh", "rotten", "yes", "no"}
    assert main(["kaggle", "build", *common, "--infer-from", "me/sft-adapter", "--out", str(root / "k")]) == 0
    hidden = root / "hidden"
    hidden.mkdir()
    (hidden / "train.csv").write_bytes((data / "train.csv").read_bytes())
    n = 3 * 8  # 3x the 8 test rows the run saw, new ids
    test = pd.DataFrame({"id": range(20_000, 20_000 + n), "prompt": frame["prompt"][:n].tolist()})
    test.to_csv(hidden / "test.csv", index=False)
    test[["id"]].assign(response="yes").to_csv(hidden / "sample_submission.csv", index=False)
    test[["id"]].assign(response=frame["response"][:n].tolist()).to_csv(hidden / "solution.csv", index=False)
    infer = kaggle_sim.run_kernel(
        root / "k" / kg.INFER_NAME, sources={"sft": hidden, "me/sft-adapter": published, **sources},
        outputs=root / "outputs", image=kaggle["image"], scratch=root / "scratch",
    )  # fmt: skip
    assert infer.returncode == 0, infer.log[-3000:]
    submission = pd.read_csv(infer.working / "submission.csv", keep_default_na=False, dtype={"response": str})
    assert submission["id"].tolist() == list(range(20_000, 20_000 + n))
    printed = _printed(infer.executed)
    assert "inference only (02 does not run): predicted " in printed and f" for {n} test rows (measured: " in printed
    assert "train:" not in printed and not list(infer.working.glob("*.new"))
    capsys.readouterr()
    solution = str(hidden / "solution.csv")
    assert main(["score", solution, str(infer.working / "submission.csv"), "--target", "response",
                 "--metric", "exact_match"]) == 0  # fmt: skip
    print(capsys.readouterr().out)
