"""00's preset picker: the presets and the training parameters (``params.TRAINING``) as ipywidgets controls,
previewing the run each choice resolves to; ``picker.save()`` writes the choice (run.json). Never trains. The only
module that imports ipywidgets, and only inside ``preset_picker``."""

from __future__ import annotations

import functools
import html
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args, get_type_hints

from kitlib.errors import PrecisionError
from kitlib.notebook.estimate import MINILM_MATMUL_PARAMS, RunEstimate, duration, estimate_epoch_seconds, estimate_run
from kitlib.notebook.params import PARAMETERS, TRAINING, Params
from kitlib.notebook.presets import DEFAULT_PRESET, PRESETS, Choice, Preset, ResolvedRun
from kitlib.notebook.presets import resolve as resolve_preset

# lazy: IPython (+0.3 s), ipywidgets (+0.3 s), torch (+1.0 s): only showing the picker needs them, so
# `import kitlib.notebook.widgets` stays at 0.05 s (tests/test_presets.py::test_import_is_cheap; python -X importtime).

if TYPE_CHECKING:
    import numpy as np

    from kitlib.config import TrainConfig
    from kitlib.machine.hardware import HardwareInfo

# Plain Int/FloatText (not Bounded*): an impossible value reaches the resolver's check and its message, not a clamp.


class PresetPicker:
    """Holds the current choice; ``.resolved`` previews it (``resolve``: stages.resolve_run), ``save`` writes it
    (stages.setup); the data's facts (stages.data_facts) feed the estimate. Build with ``preset_picker``."""

    def __init__(
        self,
        hw: HardwareInfo,
        *,
        default: str | Preset = DEFAULT_PRESET,
        lengths: Sequence[int] | np.ndarray | None = None,
        n_rows: int | None = None,
        n_test: int | None = None,
        resolve: Callable[..., ResolvedRun] | None = None,
        overrides: Mapping[str, Any] | None = None,
        memory: Callable[[ResolvedRun], str] | None = None,
        save: Callable[..., Choice] | None = None,
        folds: int = 1,
        model_params: float | None = None,
        trees: bool = False,
    ) -> None:
        self._hw = hw
        self._save = save  # save(preset=, overrides=) writes the choice where 01 reads it (stages.setup)
        self.saved: Choice | None = None  # the last choice saved; None before the first save()
        self._memory = memory  # the memory plan's line for a run (stages.memory_line): None shows none
        # the run for (preset, overrides, lengths): stages.resolve_run for a notebook's parameters, else the preset's
        self._resolve = resolve or (
            lambda *, preset, overrides, lengths: resolve_preset(preset, hw, lengths=lengths, overrides=overrides)
        )
        self._lengths = lengths
        self._n_rows = n_rows
        self._n_test = n_test
        self.folds = folds  # 00's folds parameter: the estimate's 02 and 03 train and predict this many models
        self.model_params = model_params or MINILM_MATMUL_PARAMS  # matmul weights (stages.data_facts): FLOPs a token
        self.trees = trees  # the head regime fits trees beside its network (stages.data_facts): 02 and 03 pay them
        self._preset: str | Preset = default
        # the buttons' presets by name: PRESETS', and a Preset object of one's own (resolved as it is)
        self._presets: dict[str, str | Preset] = {n: n for n in PRESETS}
        self._presets |= {default.name: default} if isinstance(default, Preset) else {}
        self._base = dict(overrides or {})  # the advanced fields every preset starts from
        self._overrides: dict[str, Any] = dict(self._base)
        self._resolved: ResolvedRun | None = None  # the preview, resolved when first shown (never headless)
        self._syncing = False  # True while the picker writes derived values back into its own controls
        self.error: str | None = None  # the last rejected change, shown in the widget
        self.note: str | None = None  # why there is no widget although the session is interactive
        self.widget: Any = None  # the ipywidgets.VBox when interactive, else None
        self.controls: dict[str, Any] = {}  # "preset" and the TRAINING keys -> their ipywidgets control
        self._error_html: Any = None
        self._table_html: Any = None

    @property
    def resolved(self) -> ResolvedRun:
        """The run the current choice resolves to, a preview (01 resolves the saved choice at its lengths)."""
        if self._resolved is None:
            self._resolved = self._resolve(preset=self._preset, overrides=self._overrides, lengths=self._lengths)
        return self._resolved

    @property
    def config(self) -> TrainConfig:
        return self.resolved.config

    def save(self) -> Choice:
        """Save the current choice with ``save`` (run.json); every accepted change after this saves again."""
        if self._save is None:
            raise ValueError("this picker has no save: build it with preset_picker(..., save=...)")
        self.saved = self._save(preset=self._preset, overrides=self._overrides)
        self._render()
        return self.saved

    def estimate(self) -> RunEstimate | None:
        """The whole run's estimate for the current choice (what the picker shows), or None without the row counts."""
        if self._n_rows is None or self._n_test is None:
            return None
        run, hw, params = self.resolved, self._hw, self.model_params
        return estimate_run(
            run, self._n_rows, self._n_test, hw, model_params=params, folds=self.folds, trees=self.trees
        )

    def estimate_text(self) -> str:
        if self._n_rows is None:
            return "no row count: pass n_rows= (stages.data_facts) for a time estimate"
        whole = self.estimate()
        if whole is not None:
            return whole.text()
        seconds = estimate_epoch_seconds(self.resolved, self._n_rows, self._hw, model_params=self.model_params)
        what = self.resolved.regime.estimate_label
        used = self.resolved.preset.rows_used(self._n_rows)
        rows = f"{used} rows" if used == self._n_rows else f"{used} of {self._n_rows} rows (the preset's row limit)"
        return f"~{duration(seconds)} {what} for {rows} (rough, +-2x; pass n_test= for the whole run)"

    def memory_text(self) -> str:
        return self._memory(self.resolved) if self._memory is not None else ""

    def __repr__(self) -> str:
        note = f"{self.note}\n" if self.note else ""
        summary = self.resolved.summary()
        memory = f"\nmemory: {self.memory_text()}" if self._memory is not None else ""
        return f"{note}PresetPicker({self.resolved.name!r})\n{summary}\nestimate: {self.estimate_text()}{memory}"

    def _ipython_display_(self) -> None:
        """A cell ending in ``picker`` shows the live widget; without one (headless) the choice, unresolved: 01
        resolves and prints the run."""
        from IPython.display import display

        if self.widget is not None:
            display(self.widget)
        else:
            chosen = ", ".join(f"{k}={v!r}" for k, v in sorted(self._overrides.items()))
            preset = self._preset if isinstance(self._preset, str) else self._preset.name
            print(f"{self.note or ''}preset {preset}{f' ({chosen})' if chosen else ''}: 01 resolves and prints the run")

    # ----------------------------------------------------------------------------------------------------- widgets

    def build(self) -> Any:
        """Create the ipywidgets tree (raises ImportError without ipywidgets)."""
        import ipywidgets as w

        names = list(self._presets)
        tooltips = [PRESETS[n].description if n in PRESETS else "custom preset" for n in names]
        self.controls["preset"] = w.ToggleButtons(options=names, value=self.resolved.name, tooltips=tooltips)
        hints = get_type_hints(Params)
        for key in TRAINING:
            kind = next(t for t in (*get_args(hints[key]), hints[key]) if t is not type(None))  # int | None -> int
            choices = PARAMETERS[key].metadata["choices"]
            make = functools.partial(w.Dropdown, options=choices) if choices else _WIDGETS[kind](w)
            self.controls[key] = make(description=key, style={"description_width": "initial"})
        self._error_html = w.HTML()
        self._table_html = w.HTML()
        advanced = w.VBox([self.controls[k] for k in TRAINING])
        accordion = w.Accordion(children=[advanced])
        accordion.set_title(0, "advanced")  # works on ipywidgets 7 (Colab ships 7.7.1) and 8; titles= is 8-only
        self.widget = w.VBox([self.controls["preset"], accordion, self._error_html, self._table_html])
        self._sync()
        self.controls["preset"].observe(self._on_preset, names="value")
        for key in TRAINING:
            self.controls[key].observe(self._on_advanced, names="value")
        return self.widget

    def _on_preset(self, change: Mapping[str, Any]) -> None:
        if not self._syncing:  # a preset starts from its own values and 00's parameters
            self._apply(self._presets[str(change["new"])], dict(self._base), revert=None)

    def _on_advanced(self, change: Mapping[str, Any]) -> None:
        if self._syncing:
            return
        key = next(k for k, c in self.controls.items() if c is change["owner"])
        overrides = dict(self._overrides)
        if key == "max_length" and change["new"] in (0, None):
            overrides.pop(key, None)  # 0 = back to "from the data's coverage"
        else:
            overrides[key] = change["new"]
        self._apply(self._preset, overrides, revert=(key, change["old"]))

    def _apply(self, preset: str | Preset, overrides: dict[str, Any], revert: tuple[str, Any] | None) -> None:
        try:
            resolved = self._resolve(preset=preset, overrides=overrides, lengths=self._lengths)
        except (ValueError, PrecisionError) as err:  # keep the last valid run; say why this one was refused
            self.error = f"{err} (kept the previous value)"
            if revert is not None:
                self._set(*revert)
            self._render()
            return
        self._preset, self._overrides, self._resolved, self.error = preset, overrides, resolved, None
        if self.saved is not None:
            try:
                self.save()
            except Exception as err:  # a widget callback's error reaches no cell: show it, keep the last saved run
                self.error = f"not saved ({err}); run.json still holds preset {self.saved.name}"
        self._sync()

    def _set(self, key: str, value: Any) -> None:
        self._syncing = True
        try:
            self.controls[key].value = value
        finally:
            self._syncing = False

    def _sync(self) -> None:
        """Write the resolved values back into the controls (derived ones such as accumulation change too)."""
        run = self.resolved
        values = {"preset": run.name, **{k: getattr(run.config, k) for k in TRAINING}}
        values["max_length"] = values["max_length"] or 0  # 0: fitted to the data
        for key, value in values.items():
            if key in self.controls and self.controls[key].value != value:
                self._set(key, value)
        self._render()

    def _render(self) -> None:
        if self._table_html is None:
            return
        self._error_html.value = (
            f'<div style="color:#b00020"><b>not applied:</b> {html.escape(self.error)}</div>' if self.error else ""
        )
        rows = [*self.resolved.table_rows(), ("time", self.estimate_text())]
        rows += [("memory", self.memory_text())] if self._memory is not None else []
        unsaved = "not saved yet: run the next cell (it saves this choice; later clicks save again)"
        saved = unsaved if self.saved is None else f"saved: preset {self.saved.name}, what 01 runs"
        rows += [("run.json", saved)] if self._save is not None else []
        cells = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
            for k, v in rows
        )
        why = "".join(f"<li>{html.escape(r)}</li>" for r in self.resolved.reasons)
        self._table_html.value = f"<table>{cells}</table><details><summary>why</summary><ul>{why}</ul></details>"


_WIDGETS = {int: lambda w: w.IntText, float: lambda w: w.FloatText, bool: lambda w: w.Checkbox}


def preset_picker(hw: HardwareInfo, *, show: bool = False, **options: Any) -> PresetPicker:
    """A PresetPicker for ``hw`` (``options``: its keywords), the widgets built when interactive; it never blocks
    and never trains. ``show``: display it now, for a cell that goes on after it."""
    picker = PresetPicker(hw, **options)
    if hw.interactive:
        try:
            picker.build()
        except ImportError:
            picker.note = (
                "ipywidgets is not installed: using the default preset (pip install ipywidgets for the picker)"
            )
    if show:
        from IPython.display import display

        display(picker)
    return picker
