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


CHATML = (  # ChatML, as Qwen's and many fine-tunes' templates write it
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_competition(folder: Path, train: pd.DataFrame, n_test: int = 8) -> Path:
    """train.jsonl / test.jsonl of ``messages`` (a system turn, the user's prompt, the assistant's reply)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)

    def turns(prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt}]

    with (folder / "train.jsonl").open("w") as f:
        for i, (prompt, reply) in enumerate(zip(train["prompt"], train["response"], strict=True)):
            f.write(json.dumps({"id": i, "messages": [*turns(prompt), {"role": "assistant", "content": reply}]}) + "\n")
    with (folder / "test.jsonl").open("w") as f:
        for i in range(n_test):
            f.write(json.dumps({"id": 10_000 + i, "messages": turns(train["prompt"][i])}) + "\n")
    ids = range(10_000, 10_000 + n_test)
    pd.DataFrame({"id": ids, "response": ["yes"] * n_test}).to_csv(folder / "sample_submission.csv", index=False)
    return folder


def llama_folder(folder: Path, texts: list[str], *, positions: int = 2048, chat_template: str | None = None) -> Path:
    """save_pretrained of a 2-layer Llama (hidden 64) with a byte-level BPE tokenizer trained on ``texts`` (and
    ChatML's two special tokens with ``chat_template``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kitlib.models.bpe import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(texts, vocab_size=400, add_eos=False)
    if chat_template is not None:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tokenizer.chat_template = chat_template
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
