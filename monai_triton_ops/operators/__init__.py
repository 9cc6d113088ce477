"""MONAI Deploy App SDK operators: the inference operator and NIfTI in and out (public API)."""

from .inference import InferenceOperator as InferenceOperator
from .nifti import NiftiImageLoader as NiftiImageLoader
from .nifti import NiftiImageWriter as NiftiImageWriter

__all__ = ["InferenceOperator", "NiftiImageLoader", "NiftiImageWriter"]
