"""Deploying a site: the generated configuration, the shipped ACL, the units' install paths."""
