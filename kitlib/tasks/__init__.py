"""Task-specific pieces kept apart from the training engine: metrics (sql_metric: execution-based text-to-SQL)."""
