"""Trajectories from call records: `model` (data), `messages`, `builders`, `evaluators`.

Nothing is imported here, so that readers of shards can load `polar_hpc.trajectory.model` alone.
"""
