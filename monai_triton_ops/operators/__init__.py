"""MONAI Deploy App SDK operators: the inference operator, its ensemble form, NIfTI in and out (public API)."""

from .ensemble import Ensemble as Ensemble
from .ensemble import EnsembleInferenceOperator as EnsembleInferenceOperator
from .ensemble import Member as Member
from .inference import InferenceOperator as InferenceOperator
from .nifti import NiftiImageLoader as NiftiImageLoader
from .nifti import NiftiImageWriter as NiftiImageWriter

__all__ = [
    "Ensemble",
    "EnsembleInferenceOperator",
    "InferenceOperator",
    "Member",
    "NiftiImageLoader",
    "NiftiImageWriter",
]
