from __future__ import annotations

import sys
from typing import Any

import pytest

from kitlib.machine.hardware import fake_profile
from kitlib.notebook.presets import resolve
from kitlib.notebook.widgets import PresetPicker, preset_picker

LENGTHS = [20] * 90 + [60] * 10


@pytest.fixture
def displayed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Everything passed to IPython's display()."""
    import IPython.display

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
    assert c["precision"].value == "auto" and c["max_length"].value == expected.config.max_length


def test_click_preset_then_change_advanced(picker: PresetPicker) -> None:
    c = picker.controls
    c["preset"].value = "fast"  # what a click on the "fast" button does
    assert picker.resolved.name == "fast" and picker.resolved.regime.name == "head"
    assert c["epochs"].value == picker.config.epochs == 20
    c["epochs"].value = 5
    assert picker.config.epochs == 5 and picker.resolved.overrides == {"epochs": 5}

    c["preset"].value = "best"  # a new preset starts from its own values: overrides are dropped
    assert picker.config.epochs == 4 and picker.resolved.overrides == {}
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
    c["precision"].value = "fp32"
    assert picker.config.precision == "fp32"


def test_invalid_value_shows_error_and_keeps_last_valid(picker: PresetPicker) -> None:
    c = picker.controls
    before = picker.resolved
    c["precision"].value = "bf16"  # a T4 has no bf16 tensor cores
    assert picker.resolved is before
    assert picker.error is not None and "bf16" in picker.error and "fp16" in picker.error  # names the fix
    assert "not applied" in picker._error_html.value
    assert c["precision"].value == "auto"  # the control shows the config that is in force
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


def test_interactive_displays_the_widget(displayed: list[Any], no_training: None) -> None:
    pytest.importorskip("ipywidgets")
    picker = preset_picker(fake_profile("2xT4"), default="fast")
    assert displayed == [picker.widget] and picker.widget is not None
    assert picker.resolved.name == "fast"


def test_headless_displays_nothing(displayed: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    hw = fake_profile("2xT4", interactive=False)
    picker = preset_picker(hw, default="smoke", lengths=LENGTHS)
    assert displayed == [] and picker.widget is None and picker.controls == {}
    assert picker.resolved == resolve("smoke", hw, lengths=LENGTHS)
    out = capsys.readouterr().out
    assert "smoke" in out and "why:" in out  # the log still says what will run


def test_without_ipywidgets(
    displayed: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError
    picker = preset_picker(fake_profile("T4"), default="best")
    assert displayed == [] and picker.widget is None and picker.resolved.name == "best"
    assert "pip install ipywidgets" in capsys.readouterr().out


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
