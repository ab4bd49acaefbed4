"""The speed doctor: FLOPs and MFU, rules that turn a run's record into findings, the report; and the memory plan
before training (memory_plan) with the CPU peak it is checked against (benchmarks/live_bytes.py)."""
