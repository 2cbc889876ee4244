"""``dpeval sweep``: grids of runs (grid), where they execute (executors), and the resumable driver."""
