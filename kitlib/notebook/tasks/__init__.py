"""The workloads the notebooks train, each one ``Task`` (kitlib.notebook.tasks.base), chosen by 00's ``task`` parameter.

get_task("tabular-text")        # a built-in task
get_task("my_tasks:Summarise")  # a Task of your own: an instance, a class or a factory, by module:name
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kitlib.notebook.tasks.base import Task

BUILT_IN = {
    "auto": "one text column -> a class or a number, read from the target's values",
    "classify": "one text column -> a class (the target's values are class names or ids)",
    "regress": "one text column -> a number",
    "tabular-text": "a text column plus numeric and categorical columns -> a class or a number",
    "seq2seq": "a source text column -> a target text to generate (e.g. text-to-SQL scored by record F1)",
    "custom": "your own nn.Module (model_factory) on the text's tokens, with kitlib's loaders, fit and inference",
}


def get_task(name: str) -> Task:
    """The task ``name`` (a built-in, or ``module:name`` of your own): a SetupError naming the fix otherwise."""
    from kitlib.errors import SetupError
    from kitlib.notebook.tasks.base import Task
    from kitlib.notebook.tasks.text import TabularTextTask, TextTask
    from kitlib.tasks.metrics import import_object

    if name == "custom":
        from kitlib.notebook.tasks.custom import CustomTask

        return CustomTask()
    if name == "seq2seq":
        from kitlib.notebook.tasks.seq2seq import Seq2SeqTask

        return Seq2SeqTask()
    if name in BUILT_IN:
        kind = TabularTextTask if name == "tabular-text" else TextTask
        return kind(name, "auto" if name == "tabular-text" else name, BUILT_IN[name])
    if ":" not in name:
        raise SetupError(
            f"task = {name!r} is not one of {list(BUILT_IN)} and not a 'module:name' of your own Task. Fix: task in "
            "00_setup's parameters cell (KIT_TASK headless)"
        )
    found = import_object(name, "task")
    task = found if isinstance(found, Task) else found() if callable(found) else found
    if not isinstance(task, Task):
        raise SetupError(
            f"task = {name!r} gave a {type(task).__name__}, not a kitlib.notebook.tasks.base.Task subclass"
        )
    return task
