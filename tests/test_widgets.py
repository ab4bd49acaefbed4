from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kitlib.machine.hardware import fake_profile
from kitlib.notebook.params import TRAINING
from kitlib.notebook.presets import resolve
from kitlib.notebook.widgets import PresetPicker, preset_picker

LENGTHS = [20] * 90 + [60] * 10


@pytest.fixture
def displayed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Everything passed to IPython's display()."""
    import IPython.display

    # ipywidgets 7 binds `from IPython.display import display` when first imported: imported for the first time
    # under this patch (pytest --reverse order), every later widget would "display" into this list, not the shell.
    with contextlib.suppress(ImportError):
        import ipywidgets  # noqa: F401

    calls: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: calls.extend(objs))
    return calls


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    import kitlib.engine.loop

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the picker must never start training")

    monkeypatch.setattr(kitlib.engine.loop, "fit", refuse)


@pytest.fixture
def picker(no_training: None) -> PresetPicker:
    pytest.importorskip("ipywidgets")
    return preset_picker(fake_profile("T4"), default="balanced", lengths=LENGTHS, n_rows=8000, show=False)


def test_untouched_picker_is_the_preset(picker: PresetPicker) -> None:
    expected = resolve("balanced", fake_profile("T4"), lengths=LENGTHS)
    assert picker.resolved == expected and picker.config == expected.config
    c = picker.controls
    assert c["preset"].value == "balanced"
    assert (c["epochs"].value, c["micro_batch_size"].value, c["grad_accum_steps"].value) == (
        expected.config.epochs,
        expected.config.micro_batch_size,
        expected.config.grad_accum_steps,
    )
    assert c["max_length"].value == expected.config.max_length and c["optimizer"].value == expected.config.optimizer


def test_click_preset_then_change_advanced(picker: PresetPicker) -> None:
    c = picker.controls
    c["preset"].value = "fast"  # what a click on the "fast" button does
    assert picker.resolved.name == "fast" and picker.resolved.regime.name == "head"
    assert c["epochs"].value == picker.config.epochs == 20
    c["epochs"].value = 5
    assert picker.config.epochs == 5 and picker.resolved.choice.overrides == {"epochs": 5}

    c["preset"].value = "best"  # a new preset starts from its own values: overrides are dropped
    assert picker.config.epochs == 4 and picker.resolved.choice.overrides == {}
    target = picker.resolved.effective_batch_size
    c["micro_batch_size"].value = 2  # accumulation follows, so the effective batch is kept
    assert picker.config.micro_batch_size == 2
    assert picker.config.grad_accum_steps == c["grad_accum_steps"].value == target // 2
    assert picker.resolved.effective_batch_size == target
    c["grad_accum_steps"].value = 3  # both set by hand: both kept
    assert (picker.config.micro_batch_size, picker.config.grad_accum_steps) == (2, 3)
    c["max_length"].value = 48
    assert picker.config.max_length == 48
    c["max_length"].value = 0  # back to "from the data"
    assert picker.config.max_length == resolve("best", fake_profile("T4"), lengths=LENGTHS).config.max_length
    c["full_eval_every"].value = 2
    assert picker.config.full_eval_every == 2
    c["lr"].value = 0.002
    assert picker.config.lr == 0.002
    c["gradient_checkpointing"].value = True
    assert picker.config.gradient_checkpointing


def test_the_advanced_controls_are_the_declared_training_parameters(picker: PresetPicker) -> None:
    """Every training parameter 00 declares, nothing else (precision is decided by the plan, no parameter): fails on
    a picker that offers precision and lacks lr, optimizer, gradient_checkpointing and compile."""

    assert set(picker.controls) - {"preset"} == set(TRAINING)


def test_invalid_value_shows_error_and_keeps_last_valid(picker: PresetPicker) -> None:
    c = picker.controls
    before = picker.resolved
    c["optimizer"].value = "adamw-kahan"  # pure bf16 weights: a T4 trains in fp16
    assert picker.resolved is before
    assert picker.error is not None and "fp16" in picker.error and "optimizer = 'adamw'" in picker.error  # the fix
    assert "not applied" in picker._error_html.value
    assert c["optimizer"].value == "adamw"  # the control shows the config that is in force
    c["epochs"].value = 0
    assert picker.resolved is before and "epochs" in (picker.error or "") and c["epochs"].value == before.config.epochs
    c["micro_batch_size"].value = -4
    assert picker.resolved is before and c["micro_batch_size"].value == before.config.micro_batch_size
    c["epochs"].value = 3  # a valid change clears the error
    assert picker.error is None and picker._error_html.value == "" and picker.config.epochs == 3


def test_table_shows_config_and_estimate(picker: PresetPicker) -> None:
    html = picker._table_html.value
    for text in ("balanced", "fp16", "rows/step", "per epoch", "8000 rows"):
        assert text in html
    picker.controls["preset"].value = "fast"
    assert "embedding pass" in picker._table_html.value
    assert "per epoch" in preset_picker(fake_profile("CPU", interactive=False), n_rows=10, show=False).estimate_text()


@pytest.mark.parametrize("name", ["smoke", "fast", "balanced", "best"])
def test_every_preset_has_a_time_for_the_data_and_lengths_from_it(name: str) -> None:
    """00 passes data_facts' row count and lengths: no "pass n_rows=/lengths=" left, each preset's own row count."""
    hw = fake_profile("CPU", interactive=False)
    picker = preset_picker(hw, default=name, n_rows=8000, lengths=[30] * 8000)
    text = picker.estimate_text()
    assert text.startswith("~") and "pass n_rows" not in text
    rows = "256 of 8000 rows (the preset's row limit)" if name == "smoke" else "for 8000 rows"
    assert rows in text, text
    assert not [r for r in picker.resolved.reasons if "pass lengths=" in r]
    assert any(r.startswith("max_length 32: covers") for r in picker.resolved.reasons)  # fitted to the data


class Notebook:
    """A real IPython shell that runs code as a notebook cell and returns what the cell showed."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        self.shell = InteractiveShell.instance(config=config)
        self.ns = self.shell.user_ns

    def run(self, code: str) -> Any:
        """The cell's outputs (``.outputs``: display_data and the result, each with ``.data``) and ``.stdout``."""
        from IPython.utils.capture import capture_output

        with capture_output() as shown:
            self.shell.run_cell(code).raise_error()
        return shown


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Notebook]:
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    yield Notebook()
    InteractiveShell.clear_instance()  # later tests must find no shell (display() would publish to it)


# 00_setup's picker cell
PICKER_CELL = "picker = preset_picker(hw, default=default, n_rows=8000)  # never starts training\npicker"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_picker_cell_shows_only_the_live_widget(notebook: Notebook, no_training: None) -> None:
    pytest.importorskip("ipywidgets")
    notebook.ns.update(preset_picker=preset_picker, hw=fake_profile("2xT4"), default="fast")
    shown = notebook.run(PICKER_CELL)
    picker = notebook.ns["picker"]
    assert picker.widget is not None and picker.resolved.name == "fast"
    # one output: the widget's view, whose model is the picker's (live); no text copy that a click would make stale
    assert [o.data[WIDGET_VIEW]["model_id"] for o in shown.outputs] == [picker.widget.model_id]
    assert "PresetPicker(" not in shown.stdout + str(shown.outputs[0].data.get("text/plain"))
    assert notebook.run("picker").outputs[0].data[WIDGET_VIEW]["model_id"] == picker.widget.model_id  # shown again


@pytest.mark.parametrize("why", ["headless", "no ipywidgets"])
def test_picker_cell_without_a_widget_prints_the_choice_once(
    notebook: Notebook, no_training: None, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    if why == "no ipywidgets":
        monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError
    hw = fake_profile("2xT4", interactive=why != "headless")
    notebook.ns.update(preset_picker=preset_picker, hw=hw, default="smoke")
    shown = notebook.run(PICKER_CELL)
    picker = notebook.ns["picker"]
    assert shown.outputs == [] and picker.widget is None and picker.controls == {}
    assert picker._resolved is None  # nothing resolved: 01 resolves the saved choice, and its log shows the run
    assert shown.stdout.count("preset smoke: 01 resolves") == 1 and "why:" not in shown.stdout
    assert picker.resolved == resolve("smoke", hw)  # a preview when asked
    assert ("pip install ipywidgets" in shown.stdout) is (why == "no ipywidgets")


def test_show_displays_it_at_once(displayed: list[Any], no_training: None) -> None:
    pytest.importorskip("ipywidgets")
    picker = preset_picker(fake_profile("T4"), default="fast", show=True)
    assert displayed == [picker]  # IPython then shows picker.widget (see test_picker_cell_shows_only_the_live_widget)
    assert preset_picker(fake_profile("T4")) is not None and displayed == [picker]  # show=False: nothing


def test_advanced_section_is_titled_on_ipywidgets_7_and_8(no_training: None) -> None:
    """Colab ships ipywidgets 7.7.1, where Accordion(titles=...) (an 8-only argument) is dropped with a warning and
    the section shows no title; scripts/test_hosted_pins.sh runs this under 7.7.1."""
    ipywidgets = pytest.importorskip("ipywidgets")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        picker = preset_picker(fake_profile("T4"), show=False)
    (accordion,) = [c for c in picker.widget.children if isinstance(c, ipywidgets.Accordion)]
    assert accordion.get_title(0) == "advanced"
    assert not [w for w in caught if "unrecognized arguments" in str(w.message)], [str(w.message) for w in caught]
    assert list(accordion.children[0].children) == [picker.controls[k] for k in TRAINING]


def test_custom_preset_default(picker: PresetPicker) -> None:
    import dataclasses

    from kitlib.notebook.presets import get_preset

    custom = dataclasses.replace(get_preset("balanced"), name="mine", epochs=9)
    p = preset_picker(fake_profile("T4"), default=custom, show=False)
    assert p.config.epochs == 9 and "mine" in p.controls["preset"].options
    p.controls["preset"].value = "fast"
    p.controls["preset"].value = "mine"
    assert p.resolved.name == "mine" and p.config.epochs == 9


def test_a_training_bar_stopped_early_closes_green_and_full(displayed: list[Any]) -> None:
    """tqdm's notebook widget turns red ("danger") when closed short of its total, as after an error: a normal early
    stop closes through close_as_done, full and green; a plain close (what an exception leaves) stays red."""
    from tqdm.notebook import tqdm as notebook_tqdm

    from kitlib.progress import close_as_done

    stopped, crashed = notebook_tqdm(total=80, desc="train"), notebook_tqdm(total=80, desc="train")
    stopped.update(28)
    crashed.update(28)
    close_as_done(stopped)
    crashed.close()
    widget = stopped.container.children[1]
    assert (stopped.n, stopped.total, widget.value, widget.max, widget.bar_style) == (28, 28, 28, 28, "success")
    assert crashed.container.children[1].bar_style == "danger"


def test_a_click_after_run_all_is_what_01_runs(notebook: Notebook, tmp_path: Path, monkeypatch: Any) -> None:
    """Run All of 00 saved preset balanced before the user picked; a click on fast then showed fast while run.json
    (what 01 reads) still said balanced. 00's own cells run here, then a click; 01's loader must read the click."""
    import dataclasses
    import json

    import kitlib
    from demos.reviews import make_demo
    from kitlib.notebook import presets, stages

    pytest.importorskip("ipywidgets")
    make_demo(tmp_path / "data")
    hw = dataclasses.replace(kitlib.detect(), interactive=True)  # a person at a screen: the live widget
    monkeypatch.setattr(kitlib, "detect", lambda: hw)
    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "00_setup.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    notebook.run(code[0])  # the parameters cell, then the user's paths
    notebook.run(f"data_dir, work_dir, model = {str(tmp_path / 'data')!r}, {str(tmp_path / 'work')!r}, 'tiny'")
    for cell in code[1:]:  # Run All
        notebook.run(cell)
    picker = notebook.ns["picker"]
    assert presets.load_choice(tmp_path / "work").name == notebook.ns["preset"] != "fast"
    picker.controls["preset"].value = "fast"  # the click, after Run All
    assert picker.error is None and "saved: preset fast" in picker._table_html.value  # the screen says it
    p = stages.load_params(tmp_path / "work")  # 01's parameters cell
    assert (p.preset, presets.load_choice(p.work_dir).name) == ("fast", "fast")  # 01 runs the clicked preset
