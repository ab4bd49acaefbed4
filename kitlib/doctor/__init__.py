"""The speed doctor: FLOPs and MFU, rules that turn a run's record into findings, the report."""
