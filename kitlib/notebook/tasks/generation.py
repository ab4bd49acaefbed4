"""What every text-generating task shares (seq2seq, causal-lm): the full evaluation that generates and scores, 03's
generation over the test rows, the vote of several runs, the generated text as the submission.

A generating task says only how one batch is generated (``generate_batch``) and how a row of labels reads as the
reference text (``reference``); the rest is here.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kitlib.notebook.tasks.base import Task, each_batch

if TYPE_CHECKING:
    import torch
    from torch import nn

    from kitlib.data.tables import TaskSpec
    from kitlib.notebook.tasks.base import FullEval, Params
    from kitlib.tasks.metrics import Metric


class TextGenerationTask(Task):
    regimes = ("finetune",)  # every weight trains: the head regime's frozen embeddings cannot generate
    num_beams = 4  # 03's beam search; the full eval decodes greedily (1 beam: ~4x cheaper, ranks epochs the same)

    def generate_batch(self, model: nn.Module, batch: Mapping[str, torch.Tensor], *, num_beams: int) -> list[str]:
        """The texts ``model`` generates for one batch (on the model's device)."""
        raise NotImplementedError

    def reference(self, model: nn.Module, labels: torch.Tensor) -> str:
        """One row of labels as the reference text the metric compares with."""
        raise NotImplementedError

    def loss_fn(self, spec: TaskSpec) -> Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor] | None:
        """The LM head and cross-entropy in chunks over the target tokens: no batch x length x vocab logits."""
        from kitlib.engine.chunked_loss import chunked_lm_loss

        return chunked_lm_loss

    def saved_state(self, tokenizer: Any, p: Params) -> dict[str, Any]:
        """What 02 and 03 rebuild the model from: the model folder, or the tokenizer 01 trained on the rows."""
        folder = model_folder(p)
        return {"model_folder": folder} if folder is not None else {"tokenizer": tokenizer.backend_tokenizer.to_str()}

    def evaluate(self, spec: TaskSpec, metric: Metric, loader: Any, device: torch.device) -> FullEval:
        """Generation and the metric, placed where they cost training least (``generated_eval``); fit makes its own
        loss pass beside a full eval that returns a callable, so this one does not."""

        def evaluate(model: nn.Module) -> Any:
            batches = list(loader)  # once: generation may run later, in another thread

            def generate(on: nn.Module) -> tuple[list[str], list[str]]:
                references = [self.reference(on, row) for b in batches for row in b["labels"]]
                return references, [text for b in batches for text in self.generate_batch(on, b, num_beams=1)]

            def score(references: list[str], generated: list[str]) -> dict[str, float]:
                y_true, y_pred = np.array(references, dtype=object), np.array(generated, dtype=object)
                return {metric.name: metric(y_true, y_pred)}

            return generated_eval(model, generate, score)

        return evaluate

    def predict(
        self,
        model: nn.Module,
        loader: Any,
        *,
        precision: Any,
        device: torch.device,
        spec: TaskSpec,
        interactive: bool = False,
        desc: str = "predict",
    ) -> np.ndarray:
        """The generated text of every test row, in the dataset's row order (the loader is length-sorted)."""
        from kitlib.data.loaders import restore_order

        beams = "greedy" if self.num_beams == 1 else f"{self.num_beams} beams"

        def batch_texts(batch: Mapping[str, torch.Tensor]) -> list[str]:
            return self.generate_batch(model, batch, num_beams=self.num_beams)

        run = {"precision": precision, "device": device, "interactive": interactive, "desc": f"{desc}, {beams}"}
        batches = each_batch(model, loader, batch_texts, **run)
        texts = [text for batch in batches for text in batch]
        return np.asarray(restore_order(loader, np.array(texts, dtype=object)), dtype=object)

    def combine(self, predictions: list[np.ndarray]) -> np.ndarray:
        """Per row, the text most runs generated (ties: the first run's)."""
        voted = [collections.Counter(row).most_common(1)[0][0] for row in zip(*predictions, strict=True)]
        return np.array(voted, dtype=object)

    def submission(self, outputs: np.ndarray, spec: TaskSpec) -> np.ndarray:
        return outputs


def model_folder(p: Params) -> str | None:
    """The pretrained model folder ``model`` names, or None: "auto" and "tiny" build a tiny model from a config."""
    return None if p.model in ("auto", "tiny") else p.model


def generated_eval(
    model: nn.Module,
    generate: Callable[[nn.Module], tuple[list[str], list[str]]],
    score: Callable[[list[str], list[str]], dict[str, float]],
) -> Callable[[], dict[str, float]]:
    """A generating full evaluation, split where it costs training least: generation here, on the model's own device
    and weights, and only the metric (executing SQL, say) in the callable fit runs in the background while the next
    epoch trains. ``generate(model)`` -> (references, generated texts); ``score`` -> metrics.

    On a GPU, generating takes seconds there, against a deep copy of the weights (2x their memory for a moment) and
    minutes of generating on the CPU in a thread that takes Kaggle's 2-4 vCPUs from the data loader. On the CPU, a
    generating thread beside training shares the same cores, and on this 2-core machine made the run 1.45x the wall
    time of a loss-only one, against 1.14x generating in the foreground (benchmarks/bench_seq2seq_eval.py at commit
    5b696d8, when generation ran in the thread).
    """
    import torch

    with torch.inference_mode():
        references, generated = generate(getattr(model, "module", model))
    return lambda: score(references, generated)
