"""`--task_type dpo`: preference tuning of a causal LM (DPO, IPO, SimPO) against a frozen reference."""
