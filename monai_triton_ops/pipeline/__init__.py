"""The data flow shared by every backend: transforms, inferer, predictor."""

from .predictor import Predictor as Predictor
from .run import InferenceSettings as InferenceSettings
from .run import run_inference as run_inference

__all__ = ["InferenceSettings", "Predictor", "run_inference"]
