"""Rewards -> per-transition rewards, groups and advantages (pure functions, no torch)."""
