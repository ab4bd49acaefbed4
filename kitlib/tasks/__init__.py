"""The pieces tasks are made of, below the notebooks: metrics by name (``metrics``), how a target is learned
(``targets``), numeric and categorical columns (``tabular``), executing SQL for record F1 (``sql_metric``), scoring a
submission (``scoring``). The tasks themselves, what the notebooks train, are in kitlib.notebook.tasks."""
