"""A Llama-shaped causal LM folder and SFT data for the causal-lm tests (no download): the user's long SFT run at
smoke size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

WORDS = ("fresh", "rotten", "yes", "no", "plot", "actor", "scene", "film", "great", "dull", "music", "ending")


def sft_frame(n: int, *, long_response: int = 0, seed: int = 0) -> pd.DataFrame:
    """``n`` prompt/response rows of a few words; row 0's response is ``long_response`` words when given."""
    rng = np.random.default_rng(seed)
    prompts = [" ".join(rng.choice(WORDS, int(rng.integers(3, 12)))) + " ?" for _ in range(n)]
    responses = [str(rng.choice(WORDS[:4])) for _ in range(n)]
    if long_response:
        responses[0] = " ".join(rng.choice(WORDS, long_response))
    return pd.DataFrame({"prompt": prompts, "response": responses})


def write_competition(folder: Path, train: pd.DataFrame, n_test: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train.insert(0, "id", range(len(train)))
    train.to_csv(folder / "train.csv", index=False)
    test = pd.DataFrame({"id": range(10_000, 10_000 + n_test), "prompt": train["prompt"][:n_test]})
    test.to_csv(folder / "test.csv", index=False)
    pd.DataFrame({"id": test["id"], "response": ["yes"] * n_test}).to_csv(folder / "sample_submission.csv",
                                                                             index=False)  # fmt: skip
    return folder


def llama_folder(folder: Path, texts: list[str], *, positions: int = 2048, chat_template: str | None = None) -> Path:
    """save_pretrained of a 2-layer Llama (hidden 64) with a byte-level BPE tokenizer trained on ``texts``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kitlib.models.bpe import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(texts, vocab_size=400, add_eos=False)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
