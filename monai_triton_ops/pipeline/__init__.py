"""The data flow shared by every backend: transforms, inferer, predictor."""

from .ensemble import EnsemblePredictor as EnsemblePredictor
from .ensemble import mirror_flips as mirror_flips
from .predictor import Predictor as Predictor
from .run import run_inference as run_inference
from .settings import InferenceSettings as InferenceSettings

__all__ = ["EnsemblePredictor", "InferenceSettings", "Predictor", "mirror_flips", "run_inference"]
