"""MONAI Deploy App SDK operators."""

from .inference import InferenceOperator as InferenceOperator

__all__ = ["InferenceOperator"]
