"""Trajectory data: schema, storage, and (later) the legacy Digi-Q/DigiRL importer."""

from digiq.data.trajectories import STEP_SCHEMA, DataError, Step, TrajectoryStore, mc_returns, observation_text

__all__ = ["STEP_SCHEMA", "DataError", "Step", "TrajectoryStore", "mc_returns", "observation_text"]
