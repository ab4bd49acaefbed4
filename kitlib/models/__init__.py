"""Model factories and heads: loading encoders/classifiers, small heads, facts about a model's size."""
