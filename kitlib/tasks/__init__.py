"""The pieces tasks are made of: metrics, targets, tabular columns, SQL scoring, submission scoring."""
