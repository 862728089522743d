"""Offline sizing of power budgets and static caps from measured profiles (`powerplan`)."""
