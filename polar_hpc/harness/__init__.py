"""Harnesses: how an agent program is started inside a sandbox (shell; presets come later)."""
