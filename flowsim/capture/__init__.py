"""Capture the workload of a real PyTorch training step on CPU (fake process group, fake tensors).

Public API::

    from flowsim.capture import capture, save, load, CapturedWorkload, gpt_example

torch is an optional dependency (``pip install flowsim[capture]``), imported only when capturing.
See docs/CAPTURE.md.
"""
from flowsim.capture.examples import GPTShape, gpt_example
from flowsim.capture.fmt import FORMAT, VERSION, load, save
from flowsim.capture.recorder import CapturedWorkload, capture

__all__ = ["FORMAT", "VERSION", "CapturedWorkload", "GPTShape", "capture", "gpt_example", "load", "save"]
