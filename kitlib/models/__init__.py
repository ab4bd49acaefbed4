"""Model factories and heads: loading encoders/classifiers, small heads, facts about a model's size."""

# The label value Hugging Face losses skip (their ignore_index): prompt and padding positions of target-token rows.
# Here, below data/ and engine/, so the collate that trims them and the losses that skip them share one value.
IGNORE_INDEX = -100
