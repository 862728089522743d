"""The budgets file (powerd/topology)."""
