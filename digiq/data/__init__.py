"""Trajectory data: schema, storage, and the importer of released Digi-Q/DigiRL files (:mod:`digiq.data.legacy`)."""

from digiq.data.trajectories import STEP_SCHEMA, DataError, Step, TrajectoryStore, mc_returns, observation_text

__all__ = ["STEP_SCHEMA", "DataError", "Step", "TrajectoryStore", "mc_returns", "observation_text"]
