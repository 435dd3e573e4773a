"""polar-hpc: token-exact RL rollouts of unmodified agent harnesses on Slurm."""
