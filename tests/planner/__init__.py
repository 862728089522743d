"""The offline planner and the powerplan CLI (planner/)."""
