"""Orchestrator: owns tasks -> sessions, schedules them onto gateways by credit, journals it all."""
