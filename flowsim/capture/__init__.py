"""Capture the workload of a real PyTorch training step on CPU (fake process group, fake tensors).

Public API::

    from flowsim.capture import capture, capture_script, step, merge_stages, save, load, CapturedWorkload

torch is an optional dependency (``pip install flowsim[capture]``), imported only when capturing.
See docs/CAPTURE.md.
"""
from flowsim.capture.data import CapturedWorkload, Stage, merge_stages
from flowsim.capture.examples import GPTShape, gpt_example
from flowsim.capture.fmt import FORMAT, VERSION, load, save
from flowsim.capture.recorder import capture
from flowsim.capture.script import ENV_FLAG, capture_script, step

__all__ = ["ENV_FLAG", "FORMAT", "VERSION", "CapturedWorkload", "GPTShape", "Stage", "capture", "capture_script",
           "gpt_example", "load", "merge_stages", "save", "step"]
