"""The speed doctor: FLOPs and MFU, rules turning a run's record into findings, the report, the memory plan."""
