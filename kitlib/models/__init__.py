"""Model factories and heads: loading encoders/classifiers, small heads, facts about a model's size."""

# The label value HF losses skip (prompt and padding positions), here so collate and losses share it.
IGNORE_INDEX = -100
