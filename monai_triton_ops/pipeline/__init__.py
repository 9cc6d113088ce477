"""The data flow shared by every backend: transforms, inferer, predictor."""

from .predictor import Predictor as Predictor
from .run import run_inference as run_inference
from .settings import InferenceSettings as InferenceSettings

__all__ = ["InferenceSettings", "Predictor", "run_inference"]
